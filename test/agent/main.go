// Command agent is the unmodified agent the end-to-end tests run inside a
// Sandstorm sandbox: it uses the ordinary OpenAI and MCP Go SDKs with no
// proxy settings, asks for http://mesh.sam.alt like any program would, and
// reports what it got. It serves HTTP on :8000 so the test drives it through
// the sandbox's gateway:
//
//	GET /run?model=M&denied_model=D&tool=T&tool_args={"message":"hi"}&denied_tool=U
//	GET /run?…&background=1                (answered at once; the work goes on alone)
//	GET /last                              ({"done", "result"} of the last background run)
//	GET /probe?kind=tcp&addr=host:port     (a TCP connect, 2 s timeout)
//	GET /probe?kind=dns&name=N             (resolve through the sandbox's resolver)
//	GET /probe?kind=udpdns&server=IP:53&name=N (a DNS query sent to a server of its choosing)
//	GET /probe?kind=http&url=U&header=K:V  (a plain HTTP GET)
//	GET /probe?kind=socks&proxy=IP:1080&target=host:port   (HTTP GET / through a SOCKS5 CONNECT)
//	GET /probe?kind=connect&proxy=IP:1080&target=host:port (HTTP GET / through an HTTP CONNECT)
//	GET /file?path=P[&write=DATA]          (write DATA to P, or read P; plain text)
//	/mcp                                   (an MCP server, Streamable HTTP, with one tool "count"
//	                                        that counts its calls: a template that serves the mesh)
//	GET /                                  (plain text "count=N pid=P": N counts calls, so a
//	                                        test can prove memory survived a snapshot)
//
// Every other answer is JSON. Nothing in here is SAM-specific, which is the point.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"golang.org/x/net/proxy"
)

const mesh = "http://mesh.sam.alt"

type result struct {
	Models       []string `json:"models,omitempty"`
	Chat         string   `json:"chat,omitempty"`
	StreamChunks int      `json:"stream_chunks,omitempty"`
	Stream       string   `json:"stream,omitempty"`
	DeniedModel  string   `json:"denied_model_error,omitempty"`
	Tools        []string `json:"tools,omitempty"`
	ToolResult   string   `json:"tool_result,omitempty"`
	DeniedTool   string   `json:"denied_tool_result,omitempty"`
	DeniedToolIs bool     `json:"denied_tool_is_error,omitempty"`
	Errors       []string `json:"errors,omitempty"`
}

func main() {
	// SIGUSR1 is the tests' reseed signal for warm and cloned sandboxes;
	// without a handler it would end the program.
	signal.Ignore(syscall.SIGUSR1)
	http.HandleFunc("/run", run)
	http.HandleFunc("/last", func(w http.ResponseWriter, _ *http.Request) {
		res := last.Load()
		reply(w, map[string]any{"done": res != nil, "result": res})
	})
	http.HandleFunc("/probe", probe)
	http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	http.HandleFunc("/file", file)
	http.Handle("/mcp", notesServer())
	var calls atomic.Int64
	http.HandleFunc("/{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "count=%d pid=%d\n", calls.Add(1), os.Getpid())
	})
	log.Fatal(http.ListenAndServe(":8000", nil))
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// last is the result of the last /run?background=1, nil while it runs.
var last atomic.Pointer[result]

func run(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("background") != "" {
		// The agent at work with nobody waiting on it: the request that
		// started it is answered at once, and the work calls out alone.
		last.Store(nil)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			res := work(ctx, q)
			last.Store(&res)
		}()
		reply(w, map[string]bool{"started": true})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 60*time.Second)
	defer cancel()
	reply(w, work(ctx, q))
}

// work is what /run does: the OpenAI and MCP SDKs through the mesh.
func work(ctx context.Context, q url.Values) result {
	var res result
	fail := func(what string, err error) { res.Errors = append(res.Errors, what+": "+err.Error()) }

	// A fresh transport: the SDKs' flows are new connections each run.
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	oc := openai.NewClient(option.WithBaseURL(mesh+"/v1"), option.WithAPIKey("none"), option.WithHTTPClient(hc), option.WithMaxRetries(0))
	page, err := oc.Models.List(ctx)
	if err != nil {
		fail("models", err)
	} else {
		for _, m := range page.Data {
			res.Models = append(res.Models, m.ID)
		}
	}
	if model := q.Get("model"); model != "" {
		c, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    model,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello from the sandbox")},
		})
		if err != nil {
			fail("chat", err)
		} else if len(c.Choices) > 0 {
			res.Chat = c.Choices[0].Message.Content
		}
		st := oc.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:    model,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("stream please")},
		})
		var b strings.Builder
		for st.Next() {
			ch := st.Current()
			if len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
				res.StreamChunks++
				b.WriteString(ch.Choices[0].Delta.Content)
			}
		}
		if err := st.Err(); err != nil {
			fail("stream", err)
		}
		res.Stream = b.String()
	}
	if dm := q.Get("denied_model"); dm != "" {
		_, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    dm,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		var apiErr *openai.Error
		switch {
		case errors.As(err, &apiErr):
			res.DeniedModel = fmt.Sprintf("%d %s", apiErr.StatusCode, apiErr.Message)
		case err != nil:
			res.DeniedModel = "transport: " + err.Error()
		default:
			res.DeniedModel = "allowed"
		}
	}

	client := mcp.NewClient(&mcp.Implementation{Name: "sandbox-agent", Version: "1"}, nil)
	sess, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: mesh + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		fail("mcp connect", err)
		return res
	}
	defer sess.Close()
	tools, err := sess.ListTools(ctx, nil)
	if err != nil {
		fail("tools/list", err)
	} else {
		for _, t := range tools.Tools {
			res.Tools = append(res.Tools, t.Name)
		}
	}
	if tool := q.Get("tool"); tool != "" {
		var args map[string]any
		json.Unmarshal([]byte(q.Get("tool_args")), &args)
		out, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			fail("tools/call", err)
		} else {
			res.ToolResult = text(out)
		}
	}
	if tool := q.Get("denied_tool"); tool != "" {
		out, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{}})
		if err != nil {
			res.DeniedTool = "protocol error: " + err.Error()
		} else {
			res.DeniedTool, res.DeniedToolIs = text(out), out.IsError
		}
	}
	return res
}

func text(r *mcp.CallToolResult) string {
	var parts []string
	for _, c := range r.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, "\n")
}

type probeResult struct {
	OK     bool     `json:"ok"`
	Status int      `json:"status,omitempty"`
	Body   string   `json:"body,omitempty"`
	Addrs  []string `json:"addrs,omitempty"`
	Error  string   `json:"error,omitempty"`
}

// getOver sends GET / over an open tunnel to target and reads the answer.
func getOver(c net.Conn, target string) (int, string, error) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	host, _, _ := net.SplitHostPort(target)
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b), nil
}

// bufConn is a connection whose first bytes were already buffered.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// file writes or reads one file of the sandbox's own filesystem, so a test
// can prove what a sandbox wrote is in its volume after a detach.
func file(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := q.Get("path")
	if q.Has("write") {
		if err := os.WriteFile(p, []byte(q.Get("write")), 0o644); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "written")
		return
	}
	b, err := os.ReadFile(p)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	w.Write(b)
}

func probe(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	var res probeResult
	var err error
	switch q.Get("kind") {
	case "tcp":
		// Reached: connected, and not reset at once. A connection to an
		// address off the node is taken by the sandbox's own boundary
		// (the node's firewall redirects it), which resets one it refuses
		// right after the handshake; a server reached waits for its
		// client, so the read times out.
		var c net.Conn
		c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", q.Get("addr"))
		if err == nil {
			c.SetReadDeadline(time.Now().Add(time.Second))
			if _, rerr := c.Read(make([]byte, 1)); errors.Is(rerr, syscall.ECONNRESET) {
				err = fmt.Errorf("connected, then %w", rerr)
			}
			c.Close()
		}
	case "dns":
		var addrs []string
		addrs, err = net.DefaultResolver.LookupHost(ctx, q.Get("name"))
		res.Addrs = addrs
	case "udpdns":
		server := q.Get("server")
		rs := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "udp", server)
		}}
		var addrs []string
		addrs, err = rs.LookupHost(ctx, q.Get("name"))
		res.Addrs = addrs
	case "http":
		req, _ := http.NewRequestWithContext(ctx, "GET", q.Get("url"), nil)
		for _, h := range q["header"] {
			if k, v, ok := strings.Cut(h, ":"); ok {
				req.Header.Set(k, v)
			}
		}
		hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		var resp *http.Response
		if resp, err = hc.Do(req); err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			res.Status, res.Body = resp.StatusCode, string(b)
		}
	case "socks":
		var d proxy.Dialer
		if d, err = proxy.SOCKS5("tcp", q.Get("proxy"), nil, &net.Dialer{Timeout: 2 * time.Second}); err == nil {
			var c net.Conn
			if c, err = d.(proxy.ContextDialer).DialContext(ctx, "tcp", q.Get("target")); err == nil {
				res.Status, res.Body, err = getOver(c, q.Get("target"))
			}
		}
	case "connect":
		var c net.Conn
		if c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", q.Get("proxy")); err == nil {
			c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", q.Get("target"), q.Get("target"))
			br := bufio.NewReader(c)
			var resp *http.Response
			if resp, err = http.ReadResponse(br, &http.Request{Method: "CONNECT"}); err == nil {
				if resp.StatusCode != 200 {
					b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
					res.Status, res.Body = resp.StatusCode, string(b)
					err = fmt.Errorf("CONNECT: %s", resp.Status)
					c.Close()
				} else {
					res.Status, res.Body, err = getOver(&bufConn{Conn: c, r: br}, q.Get("target"))
				}
			} else {
				c.Close()
			}
		}
	default:
		err = fmt.Errorf("unknown probe kind %q", q.Get("kind"))
	}
	if err != nil {
		res.Error = err.Error()
	} else {
		res.OK = true
	}
	reply(w, res)
}

// notesServer is the MCP server a template can serve to the mesh on this
// agent's port (api.Serve): one tool, "count", whose answer is the number
// of calls so far, so a test can tell that the sandbox's memory survived
// a snapshot between two calls.
func notesServer() http.Handler {
	s := mcp.NewServer(&mcp.Implementation{Name: "agent-notes", Version: "1"}, nil)
	var calls atomic.Int64
	type out struct {
		Count int64 `json:"count"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "count", Description: "counts its calls"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, out, error) {
		return nil, out{Count: calls.Add(1)}, nil
	})
	// It is reached through the sandbox's gateway, under whatever Host the
	// node's address is.
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{DisableLocalhostProtection: true})
}
