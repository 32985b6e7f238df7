// Package mcpgateway is the MCP gateway a sandbox runs for E2B's SDK
// (issue 33, item 2). Sandbox.create({mcp}) runs `mcp-gateway --config
// JSON` in the sandbox as root with GATEWAY_ACCESS_TOKEN in its
// environment, then an agent calls https://50005-<id>.<domain>/mcp with
// that token (sbx.getMcpUrl, getMcpToken). E2B's gateway runs the MCP
// servers the config names inside the sandbox; here the gateway is one
// endpoint that forwards to the mesh's /mcp through the sandbox's
// boundary: the tools its principal is granted anywhere in the mesh,
// each call checked by sam-node's policy. The servers the config names
// must be among those (else it fails to start, as E2B's does on a server
// it cannot run); their settings are the mesh operator's (sam-node's
// config), so the config's values are not used.
package mcpgateway

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"sandstorm/internal/fullduplex"
)

const (
	// Port is the gateway's port in the sandbox (the SDK's mcpPort).
	Port = 50005
	// TokenFile is where the SDK's getMcpToken reads the token when it
	// did not start the gateway itself (a Sandbox.connect).
	TokenFile = "/etc/mcp-gateway/.token"
	// MeshURL is the mesh's MCP endpoint as a sandbox reaches it: its
	// boundary serves mesh.sam.alt (internal/sam/policy.MeshHost).
	MeshURL = "http://mesh.sam.alt/mcp"
	// TokenEnv is the environment variable the SDK passes the token in.
	TokenEnv = "GATEWAY_ACCESS_TOKEN"
)

// ParseConfig is the server names of a gateway config: a JSON object whose
// keys name MCP servers (E2B's catalog names; here the mesh's).
func ParseConfig(config string) ([]string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(config), &m); err != nil || m == nil {
		return nil, fmt.Errorf("--config: want a JSON object naming MCP servers, e.g. {\"github\": {}}: %v", err)
	}
	names := make([]string, 0, len(m))
	for k := range m {
		if k == "" || strings.Contains(k, "__") {
			return nil, fmt.Errorf("--config: server name %q: want a name without \"__\"", k)
		}
		names = append(names, k)
	}
	slices.Sort(names)
	return names, nil
}

// Missing is the servers that have no tool among tools: the mesh names
// a server's tools <server>__<tool>, and lists only those granted.
func Missing(servers, tools []string) []string {
	var out []string
	for _, s := range servers {
		if !slices.ContainsFunc(tools, func(t string) bool { return strings.HasPrefix(t, s+"__") }) {
			out = append(out, s)
		}
	}
	return out
}

// ListTools is the names of the tools endpoint lists, every page.
func ListTools(ctx context.Context, endpoint string, hc *http.Client) ([]string, error) {
	hc, ends := recording(hc)
	c := mcp.NewClient(&mcp.Implementation{Name: "sandstorm-mcp-gateway", Version: "1"}, nil)
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, DisableStandaloneSSE: true, MaxRetries: -1}, nil)
	if err != nil {
		return nil, fmt.Errorf("the mesh's MCP endpoint (%s, through this sandbox's boundary): %w%s%s", endpoint, err, why(ends), unresolved(err))
	}
	defer s.Close()
	var names []string
	for t, err := range s.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("list the mesh's tools: %w%s", err, why(ends))
		}
		names = append(names, t.Name)
	}
	return names, nil
}

// unresolved explains a lookup of the mesh's name that failed: a
// boundary answers mesh.sam.alt only to a sandbox whose principal the
// policy binds (internal/sam/boundary), so a DNS error here is that, not
// the network (a newcomer's trial, 12-07, met it as "no such host").
func unresolved(err error) string {
	var dnsErr *net.DNSError
	if !errors.As(err, &dnsErr) {
		return ""
	}
	return "; this sandbox's boundary does not resolve the mesh's name: its principal has no binding in the mesh's policy (an E2B sandbox is sb-<id> unless its template has a principal: sandstormd template create … --principal P, and bind P), or its node serves no mesh (serve --policy sam-node)"
}

// why is how the last answer's body ended, for an error ("" if none).
func why(e *endRecorder) string {
	if w := e.lastEnd(); w != "" {
		return " (" + w + ")"
	}
	return ""
}

// Check fails unless every server config names has tools in the mesh
// for this sandbox, saying which do not.
func Check(ctx context.Context, config, endpoint string, hc *http.Client) error {
	servers, err := ParseConfig(config)
	if err != nil {
		return err
	}
	tools, err := ListTools(ctx, endpoint, hc)
	if err != nil {
		return err
	}
	if m := Missing(servers, tools); len(m) > 0 {
		return fmt.Errorf("MCP servers %s: this sandbox's principal is granted no tool of theirs in the mesh (its policy; sam-node --config names the servers)", strings.Join(m, ", "))
	}
	return nil
}

// Handler serves /mcp to callers that present token (Authorization:
// Bearer), forwarding to upstream; the token is not forwarded. Anything
// else is 404, a wrong or missing token 401.
func Handler(token string, upstream *url.URL) http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host, r.Out.URL.Path, r.Out.URL.RawPath = upstream.Scheme, upstream.Host, upstream.Path, ""
			r.Out.Host = upstream.Host
			r.Out.Header.Del("Authorization")
		},
		FlushInterval: -1, // MCP answers may be event streams
		ModifyResponse: func(resp *http.Response) error {
			if body, ok := resp.Request.Context().Value(bodyKey{}).(*fullduplex.Body); ok {
				return body.Respond(resp)
			}
			return nil
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/mcp" {
			http.NotFound(w, r)
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			// RFC 6750 §3.1: a token given but wrong is invalid_token,
			// one not given is only asked for.
			msg := "the MCP gateway's token is needed: Authorization: Bearer <sbx.getMcpToken()>"
			w.Header().Set("WWW-Authenticate", `Bearer realm="mcp-gateway"`)
			if ok {
				msg = "the MCP gateway's token is wrong: it is sbx.getMcpToken() of this sandbox (Authorization: Bearer <token>)"
				w.Header().Set("WWW-Authenticate", `Bearer realm="mcp-gateway", error="invalid_token"`)
			}
			http.Error(w, msg, http.StatusUnauthorized)
			return
		}
		// An event stream's first flush may come before the request's
		// body is read to its end: without full duplex the server would
		// close the body then, and the transport, failing its last read
		// of it, would cut the answer (the boundary's mesh proxy and
		// internal/node/envdlink guard theirs alike).
		body := fullduplex.Guard(w, r)
		defer body.Stop()
		rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), bodyKey{}, body)))
	})
}

type bodyKey struct{}
