package ingress_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/ingress"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/pki"
)

// passNode is one node's ingress listener, with a Passthrough in front of
// an HTTP server that says which node served each request.
type passNode struct {
	name  string
	addr  string
	table *ingress.Table
	pt    *ingress.Passthrough
}

// passFleet is nodes a and b, each an ingress by Passthrough, their
// tables naming sb-b as b's and sb-a as a's (tls nil: plain HTTP).
func passFleet(t *testing.T, tlsCfg *tls.Config, ingressOf map[string]nodeapi.IngressInfo) (a, b *passNode) {
	mk := func(name string) *passNode {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		n := &passNode{name: name, addr: ln.Addr().String(), table: ingress.NewTable()}
		n.pt = &ingress.Passthrough{Self: name, Domain: "sb.test", Table: n.table, TLS: tlsCfg, Log: slog.New(slog.DiscardHandler),
			IngressOf: func(_ context.Context, peer, seam string) (nodeapi.IngressInfo, error) {
				if in, ok := ingressOf[peer]; ok {
					return in, nil
				}
				return nodeapi.IngressInfo{}, errdefs.New(errdefs.ErrNotFound, "no ingress")
			}}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := sha256.New()
			io.Copy(h, r.Body)
			target := r.Header.Get("E2b-Sandbox-Id")
			if target == "" {
				target = r.Host
			}
			fmt.Fprintf(w, "%s %s %s %s", name, r.Proto, target, hex.EncodeToString(h.Sum(nil)))
		})}
		go srv.Serve(n.pt.Listen(ln))
		t.Cleanup(func() { srv.Close() })
		return n
	}
	a, b = mk("a"), mk("b")
	routes := func(n *passNode, set ...nodeapi.Route) {
		if err := n.table.Apply(nodeapi.Routes{Full: true, Version: 1, Set: set}); err != nil {
			t.Fatal(err)
		}
	}
	ra := nodeapi.Route{ID: "sb-a", Node: "a", Address: "127.0.0.1:7443", Generation: 1, AccessToken: "t"}
	rb := nodeapi.Route{ID: "sb-b", Node: "b", Address: "127.0.0.1:7444", Generation: 1, AccessToken: "t"}
	routes(a, ra, rb)
	// b's table names sb-b as a's: were a passed connection passed on, a
	// and b would hand it to each other for ever.
	loop := rb
	loop.Node, loop.Address = "a", "127.0.0.1:7443"
	routes(b, ra, loop)
	if ingressOf["b"].Address == "" {
		ingressOf["b"] = nodeapi.IngressInfo{Address: b.addr, TLS: tlsCfg != nil}
	}
	ingressOf["a"] = nodeapi.IngressInfo{Address: a.addr, TLS: tlsCfg != nil}
	return a, b
}

// served asks with c for url (with E2B's header addressing if id is set,
// as host if host is) and says what answered: "<node> <proto> <target>
// <sha256 of body>".
func served(t *testing.T, c *http.Client, method, url, id, host string, body []byte) string {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	if id != "" {
		req.Header.Set("E2b-Sandbox-Id", id)
	}
	if host != "" {
		req.Host = host
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return string(out)
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// TestPassthroughPlainHTTP: a connection whose first request is for a
// sandbox on another node goes to that node's ingress, body whole; one
// for a sandbox here, or none, is served here; a connection the peer
// passed is served there even though its table names this node (no
// loop); and when the holder's ingress does not answer, here.
func TestPassthroughPlainHTTP(t *testing.T) {
	a, _ := passFleet(t, nil, map[string]nodeapi.IngressInfo{})
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	body := make([]byte, 8<<20)
	rand.Read(body)
	for _, tc := range []struct{ id, host, want string }{
		{"sb-b", "", "b HTTP/1.1 sb-b"},
		{"", "49983-sb-b.sb.test", "b HTTP/1.1 49983-sb-b.sb.test"},
		{"sb-a", "", "a HTTP/1.1 sb-a"},
		{"sb-nowhere", "", "a HTTP/1.1 sb-nowhere"},
		{"", "api.sb.test", "a HTTP/1.1 api.sb.test"},
	} {
		if got, want := served(t, c, http.MethodPost, "http://"+a.addr+"/files", tc.id, tc.host, body), tc.want+" "+sum(body); got != want {
			t.Errorf("%s%s through a: %q, want %q", tc.id, tc.host, got, want)
		}
	}
}

// TestPassthroughLoopAndDown: a connection that starts with a PROXY
// header (a peer passed it) is served where it lands, whatever the table
// says; and a holder whose ingress refuses leaves the connection served
// here.
func TestPassthroughLoopAndDown(t *testing.T) {
	ingresses := map[string]nodeapi.IngressInfo{}
	a, b := passFleet(t, nil, ingresses)
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	// Straight to b, with a PROXY header as a would send: b's table says
	// sb-b is a's, and b serves it anyway.
	conn, err := net.Dial("tcp", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "PROXY TCP4 10.9.9.9 127.0.0.1 5555 80\r\nGET / HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: sb-b\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	if !strings.HasPrefix(string(out), "b HTTP/1.1 sb-b") {
		t.Errorf("a passed connection at b: %q, want it served by b", out)
	}
	// Through a: passed once to b, served there (not back to a).
	if got := served(t, c, http.MethodGet, "http://"+a.addr+"/", "sb-b", "", nil); !strings.HasPrefix(got, "b ") {
		t.Errorf("sb-b through a, b's table naming a: %q, want b's answer", got)
	}

	// b's ingress gone: a serves (its request-by-request path).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	a2, _ := passFleet(t, nil, map[string]nodeapi.IngressInfo{"b": {Address: gone}})
	if got := served(t, c, http.MethodGet, "http://"+a2.addr+"/", "sb-b", "", nil); !strings.HasPrefix(got, "a ") {
		t.Errorf("sb-b through a, b's ingress refusing: %q, want a's answer", got)
	}
}

// TestPassthroughTLS: by the ClientHello's server name, a TLS connection
// for a sandbox on b reaches b's ingress unread and its TLS ends there
// (HTTP/2 negotiated with b); one for a's own sandbox, or by another
// name, ends here.
func TestPassthroughTLS(t *testing.T) {
	ca, err := pki.EnsureCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Issue("ingress", []string{"*.sb.test", "api.sb.test"}, time.Hour, true, false)
	if err != nil {
		t.Fatal(err)
	}
	srvCfg := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	a, _ := passFleet(t, srvCfg, map[string]nodeapi.IngressInfo{})
	c := &http.Client{Transport: &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: ca.Pool()},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, a.addr)
		}}}
	body := make([]byte, 4<<20)
	rand.Read(body)
	for host, want := range map[string]string{
		"49983-sb-b.sb.test": "b HTTP/2.0 49983-sb-b.sb.test",
		"49983-sb-a.sb.test": "a HTTP/2.0 49983-sb-a.sb.test",
		"api.sb.test":        "a HTTP/2.0 api.sb.test",
	} {
		if got := served(t, c, http.MethodPost, "https://"+host+"/files", "", "", body); got != want+" "+sum(body) {
			t.Errorf("https://%s through a: %q, want %q", host, got, want)
		}
	}
}

// TestIngressAddress: a peer dials the listener's own address, or its
// port on the node's seam host when it listens on every address.
func TestIngressAddress(t *testing.T) {
	for _, tc := range []struct{ seam, listen, want string }{
		{"10.0.0.3:7443", "10.0.0.3:8443", "10.0.0.3:8443"},
		{"10.0.0.3:7443", "[::]:8443", "10.0.0.3:8443"},
		{"10.0.0.3:7443", "0.0.0.0:8443", "10.0.0.3:8443"},
		{"node-c.lan:7443", ":8443", "node-c.lan:8443"},
		{"10.0.0.3:7443", "192.168.1.4:8443", "192.168.1.4:8443"},
		{"[fd00::3]:7443", "[::]:8443", "[fd00::3]:8443"},
	} {
		got, err := ingress.IngressAddress(tc.seam, nodeapi.IngressInfo{Address: tc.listen})
		if err != nil || got != tc.want {
			t.Errorf("IngressAddress(%s, %s) = %q %v, want %q", tc.seam, tc.listen, got, err, tc.want)
		}
	}
	if _, err := ingress.IngressAddress("10.0.0.3:7443", nodeapi.IngressInfo{Address: "nonsense"}); err == nil {
		t.Error("IngressAddress of a malformed address: no error")
	}
}
