package mcpgateway

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func TestParseConfig(t *testing.T) {
	got, err := ParseConfig(`{"github": {"token": "x"}, "everything": {}}`)
	if err != nil || !slices.Equal(got, []string{"everything", "github"}) {
		t.Errorf("ParseConfig: %q, %v", got, err)
	}
	for _, bad := range []string{``, `[]`, `"x"`, `null`, `{"a__b": {}}`, `{"": {}}`, `{not json`} {
		if _, err := ParseConfig(bad); err == nil {
			t.Errorf("ParseConfig(%q) accepted", bad)
		}
	}
}

// meshMCP is a real MCP server (the go-sdk's, over streamable HTTP) with
// tools named as the mesh names them, <server>__<tool>.
func meshMCP(t *testing.T, tools ...string) *httptest.Server {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "mesh", Version: "1"}, nil)
	for _, name := range tools {
		mcp.AddTool(s, &mcp.Tool{Name: name, Description: name}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ran " + name}}}, nil, nil
		})
	}
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(srv.Close)
	return srv
}

// Check passes when every configured server has a granted tool and names
// those that have none.
func TestCheck(t *testing.T) {
	srv := meshMCP(t, "everything__echo", "everything__add", "files__read")
	ctx := context.Background()
	if err := Check(ctx, `{"everything": {}, "files": {}}`, srv.URL, srv.Client()); err != nil {
		t.Errorf("granted servers: %v", err)
	}
	err := Check(ctx, `{"everything": {}, "github": {}, "invalid_server": {}}`, srv.URL, srv.Client())
	if err == nil || !strings.Contains(err.Error(), "github, invalid_server") || strings.Contains(err.Error(), "everything,") {
		t.Errorf("servers not granted: %v; want github and invalid_server named", err)
	}
	if err := Check(ctx, `{"everything": {}}`, "http://127.0.0.1:1/mcp", http.DefaultClient); err == nil {
		t.Error("an unreachable mesh passed the check")
	}
}

// The gateway serves /mcp only with its token, forwards without it, and
// an MCP client through it lists and calls the mesh's tools.
func TestHandler(t *testing.T) {
	var sawAuth []string
	mesh := meshMCP(t, "everything__echo")
	// A spy before the mesh: what the gateway sends on, streamed.
	mu, _ := url.Parse(mesh.URL)
	fwd := httputil.NewSingleHostReverseProxy(mu)
	fwd.FlushInterval = -1
	var mux sync.Mutex
	spy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.Lock()
		sawAuth = append(sawAuth, r.Header.Get("Authorization"))
		mux.Unlock()
		fwd.ServeHTTP(w, r)
	}))
	defer spy.Close()
	up, _ := url.Parse(spy.URL + "/mcp")
	gw := httptest.NewServer(Handler("s3cret", up))
	defer gw.Close()

	for _, c := range []struct {
		path, auth string
		want       int
		says       string // in the body: a wrong token is told apart from none
	}{
		{"/mcp", "", http.StatusUnauthorized, "token is needed"},
		{"/mcp", "Bearer wrong", http.StatusUnauthorized, "token is wrong"},
		{"/mcp", "s3cret", http.StatusUnauthorized, "token is needed"},
		{"/other", "Bearer s3cret", http.StatusNotFound, ""},
	} {
		req, _ := http.NewRequest("POST", gw.URL+c.path, strings.NewReader(`{}`))
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want || !strings.Contains(string(body), c.says) {
			t.Errorf("%s with %q: %d %q, want %d saying %q", c.path, c.auth, resp.StatusCode, body, c.want, c.says)
		}
	}
	if len(sawAuth) != 0 {
		t.Fatalf("refused calls reached the mesh: %d", len(sawAuth))
	}

	hc := &http.Client{Transport: bearer{"s3cret"}}
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	s, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: gw.URL + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "everything__echo"})
	if err != nil || len(res.Content) != 1 || res.Content[0].(*mcp.TextContent).Text != "ran everything__echo" {
		t.Fatalf("a tool called through the gateway: %+v, %v", res, err)
	}
	mux.Lock()
	defer mux.Unlock()
	if len(sawAuth) == 0 {
		t.Error("nothing reached the mesh")
	}
	for _, a := range sawAuth {
		if a != "" {
			t.Errorf("the mesh was sent Authorization %q", a)
		}
	}
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// An answer's event stream that ends before the answer fails the listing
// (the SDK: "request terminated without response"), and the error says
// whether the server ended the stream or it was cut under it.
func TestListToolsSaysHowTheStreamEnded(t *testing.T) {
	for _, c := range []struct {
		name string
		cut  bool
		want string
	}{
		{"ended", false, "the server ended the answer's stream"},
		{"cut", true, "the answer's stream was cut: unexpected EOF"},
	} {
		t.Run(c.name, func(t *testing.T) {
			mesh := meshMCP(t, "everything__echo")
			mu, _ := url.Parse(mesh.URL)
			fwd := httputil.NewSingleHostReverseProxy(mu)
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				if !strings.Contains(string(body), `"tools/list"`) {
					r.Body = io.NopCloser(bytes.NewReader(body))
					fwd.ServeHTTP(w, r)
					return
				}
				// The answer's header, then its stream ends: closed by
				// the handler's return (the last chunk sent), or cut.
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				io.WriteString(w, ": no answer follows\n\n")
				w.(http.Flusher).Flush()
				if c.cut {
					conn, _, err := http.NewResponseController(w).Hijack()
					if err == nil {
						conn.Close()
					}
				}
			}))
			defer front.Close()
			_, err := ListTools(context.Background(), front.URL, front.Client())
			if err == nil || !strings.Contains(err.Error(), "terminated without response") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("ListTools: %v; want the SDK's error and %q", err, c.want)
			}
		})
	}
}

// An answer that starts before the request's body is read to its end
// passes through while the rest of the body still comes (the client
// sends half, waits for the answer's header, then the rest).
func TestHandlerAnswerBeforeBody(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		body, _ := io.ReadAll(r.Body)
		io.WriteString(w, "data: "+string(body)+"\n\n")
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL + "/mcp")
	gw := httptest.NewServer(Handler("s3cret", u))
	defer gw.Close()
	c, err := net.Dial("tcp", gw.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "POST /mcp HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer s3cret\r\nContent-Length: 10\r\n\r\n01234"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the answer's header before the body's end: %v", err)
	}
	io.WriteString(c, "56789")
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: 0123456789\n" {
		t.Fatalf("the answer: %q, %v; want the whole body echoed", line, err)
	}
}

// TestUnresolvedMesh: a boundary answers the mesh's name only for a
// principal the policy binds, so a lookup that fails says that, not
// only "no such host".
func TestUnresolvedMesh(t *testing.T) {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: network, Err: &net.DNSError{Err: "no such host", Name: "mesh.sam.alt", IsNotFound: true}}
	}}}
	_, err := ListTools(context.Background(), MeshURL, hc)
	if err == nil || !strings.Contains(err.Error(), "no such host") || !strings.Contains(err.Error(), "no binding in the mesh's policy") {
		t.Fatalf("a mesh name the boundary does not resolve: %v", err)
	}
}
