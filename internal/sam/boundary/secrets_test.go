package boundary

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/sam/inject"
	"sandstorm/internal/secrets"
	"sandstorm/internal/testenv"
)

// TestSecretFlows: with a secret bound to allowed.test, a TLS flow there
// through the boundary is ended with the sandbox's CA and the server is
// sent the secret in place of the marker, its answer going in with thaws
// and touches as a spliced one's does, and the egress log names the
// secret; a flow to example.com, which the secret may not go to, is
// spliced untouched (the server's own certificate, the marker as it is).
func TestSecretFlows(t *testing.T) {
	serverCA, port, seen := headerServer(t, "Authorization", "allowed.test", "example.com")
	serverRoots, sandboxRoots := x509.NewCertPool(), x509.NewCertPool()
	serverRoots.AppendCertsFromPEM(serverCA)
	caPEM, caKey, _ := inject.NewCA("sb", []string{"allowed.test"})
	sandboxRoots.AppendCertsFromPEM(caPEM)
	marker := secrets.NewMarker()
	set, err := inject.NewSet([]inject.Binding{{Name: "api", Marker: marker, Value: "the-secret", Hosts: []string{"allowed.test"}}}, caPEM, caKey, serverRoots)
	if err != nil {
		t.Fatal(err)
	}
	act := &fakeActivity{}
	var flowsMu sync.Mutex
	var flows []api.EgressFlow
	e := newEnv(t, "agent-a", netip.Addr{}, func(c *Config) {
		c.Secrets, c.Activity = set, act
		c.Flows = func(f api.EgressFlow) { flowsMu.Lock(); flows = append(flows, f); flowsMu.Unlock() }
	})
	get := func(host string, roots *x509.CertPool) string {
		t.Helper()
		c, err := e.socksDialer(t, "unix", nil).DialContext(t.Context(), "tcp", fmt.Sprintf("%s:%d", host, port))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		tc := tls.Client(c, &tls.Config{ServerName: host, RootCAs: roots})
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", host, marker)
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			t.Fatalf("%s: %v", host, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return seen(host)
	}
	if got := get("allowed.test", sandboxRoots); got != "Bearer the-secret" {
		t.Errorf("allowed.test was sent %q; want the secret", got)
	}
	if act.thaws.Load() == 0 || act.touches.Load() == 0 {
		t.Errorf("the secret's flow: %d thaws, %d touches", act.thaws.Load(), act.touches.Load())
	}
	if got := get("example.com", serverRoots); got != "Bearer "+marker {
		t.Errorf("example.com was sent %q; want the marker", got)
	}
	testenv.WaitFor(t, 5*time.Second, "both flows logged", func() bool {
		flowsMu.Lock()
		defer flowsMu.Unlock()
		return len(flows) == 2
	})
	for _, f := range flows {
		if want := f.Name == "allowed.test"; slices.Equal(f.Secrets, []string{"api"}) != want || f.BytesIn == 0 {
			t.Errorf("flow %+v", f)
		}
	}
}

// TestSecretHostServerFirst: a flow to a secret's host whose server
// speaks first (SMTP's greeting) is spliced as soon as it does, not held
// for the handshake timeout waiting for a ClientHello that TLS would
// have sent; what the sandbox then sends reaches it as it was.
func TestSecretHostServerFirst(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "220 allowed.test ESMTP\r\n")
		line, _ := bufio.NewReader(c).ReadString('\n')
		io.WriteString(c, "250 "+line)
	}()
	caPEM, caKey, _ := inject.NewCA("sb", []string{"allowed.test"})
	set, err := inject.NewSet([]inject.Binding{{Name: "api", Marker: secrets.NewMarker(), Value: "the-secret", Hosts: []string{"allowed.test"}}}, caPEM, caKey, x509.NewCertPool())
	if err != nil {
		t.Fatal(err)
	}
	// A handshake timeout no test waits out: the greeting must not wait
	// for it.
	e := newEnv(t, "agent-a", netip.Addr{}, func(c *Config) { c.Secrets, c.HandshakeTimeout = set, time.Hour })
	c, err := e.socksDialer(t, "unix", nil).DialContext(t.Context(), "tcp", fmt.Sprintf("allowed.test:%d", portOf(t, ln)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(c)
	if greeting, err := br.ReadString('\n'); greeting != "220 allowed.test ESMTP\r\n" {
		t.Fatalf("greeting %q, %v", greeting, err)
	}
	io.WriteString(c, "EHLO sandbox\r\n")
	if reply, err := br.ReadString('\n'); reply != "250 EHLO sandbox\r\n" {
		t.Fatalf("reply %q, %v", reply, err)
	}
}

// headerServer is an HTTPS server on loopback with a certificate for
// each name from a CA of its own (caPEM), recording the value of header
// in the last request for each Host it was sent (seen).
func headerServer(t *testing.T, header string, names ...string) (caPEM []byte, port uint16, seen func(host string) string) {
	t.Helper()
	caPEM, key, _ := inject.NewCA("servers", names)
	iss, _ := inject.NewIssuer(caPEM, key)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return iss.Leaf(h.ServerName) }})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[string]string{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got[r.Host] = r.Header.Get(header)
		mu.Unlock()
		io.WriteString(w, "ok")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return caPEM, uint16(ln.Addr().(*net.TCPAddr).Port), func(host string) string {
		mu.Lock()
		defer mu.Unlock()
		return got[host]
	}
}
