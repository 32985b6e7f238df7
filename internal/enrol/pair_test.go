package enrol

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/pki"
)

// serveEndpoint runs a node's endpoint over its own TLS listener on
// loopback and returns its address.
func serveEndpoint(t *testing.T, e *Endpoint) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(e.Handler())
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Listener = tls.NewListener(srv.Listener, e.TLSConfig())
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestPairing: the right code pairs a node, after which it serves its
// master over mutual TLS and nobody else, keeps its pairing across a
// restart, and refuses a second pairing; a wrong code is refused with
// where the code is, repeated wrong codes lock pairing for a minute, and
// the code file is 0600 and stable.
func TestPairing(t *testing.T) {
	pkiDir := t.TempDir()
	e, err := NewEndpoint("n1", pkiDir, newFake(), quiet())
	if err != nil {
		t.Fatal(err)
	}
	code, _ := os.ReadFile(filepath.Join(pkiDir, pki.PairingCodeFile))
	if fi, _ := os.Stat(filepath.Join(pkiDir, pki.PairingCodeFile)); fi.Mode().Perm() != 0o600 {
		t.Errorf("pairing code mode %v", fi.Mode().Perm())
	}
	addr := serveEndpoint(t, e)
	ca, _ := pki.EnsureCA(t.TempDir())
	ctx := context.Background()

	// Unpaired, the seam answers nobody.
	c0, _ := Dial("n1", addr, ca, nil)
	if _, err := c0.Status(ctx); err == nil {
		t.Fatal("an unpaired node served the seam")
	}
	_, err = Pair(ctx, addr, "aaaa-bbbb-cccc-dddd-eeee", ca)
	if !errors.Is(err, errdefs.ErrForbidden) || !strings.Contains(err.Error(), "wrong pairing code") || !strings.Contains(err.Error(), pki.PairingCodeFile) {
		t.Fatalf("a wrong code: %v", err)
	}
	if strings.Contains(err.Error(), strings.TrimSpace(string(code))) {
		t.Fatal("the refusal shows the code")
	}
	// Typed with other case and no dashes, the code still pairs.
	typed := strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(string(code)), "-", ""))
	name, err := Pair(ctx, addr, typed, ca)
	if err != nil || name != "n1" {
		t.Fatalf("pair with the right code: %q %v", name, err)
	}
	if fi, err := os.Stat(filepath.Join(pkiDir, nodeKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("node key: %v %v", fi, err)
	}
	c, _ := Dial("n1", addr, ca, nil)
	if st, err := c.Status(ctx); err != nil || st.Name != "fake" {
		t.Fatalf("the master after pairing: %+v %v", st, err)
	}
	other, _ := pki.EnsureCA(t.TempDir())
	if co, _ := Dial("n1", addr, other, nil); co != nil {
		if _, err := co.Status(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("a master of another CA: %v", err)
		}
	}
	if _, err := Pair(ctx, addr, string(code), ca); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a second pairing: %v", err)
	}

	// Restarted, it is still paired with its master, with the same code.
	e2, err := NewEndpoint("n1", pkiDir, newFake(), quiet())
	if err != nil || !e2.Paired() || e2.code != e.code {
		t.Fatalf("after a restart: paired %v, same code %v, %v", e2 != nil && e2.Paired(), e2 != nil && e2.code == e.code, err)
	}
	addr2 := serveEndpoint(t, e2)
	c2, _ := Dial("n1", addr2, ca, nil)
	if _, err := c2.Status(ctx); err != nil {
		t.Errorf("the master after the node restarted: %v", err)
	}
}

// TestPairingLockout: five wrong codes in a minute, and even the right one
// is refused until the minute has passed.
func TestPairingLockout(t *testing.T) {
	pkiDir := t.TempDir()
	e, _ := NewEndpoint("n2", pkiDir, newFake(), quiet())
	addr := serveEndpoint(t, e)
	ca, _ := pki.EnsureCA(t.TempDir())
	for i := 0; i < lockoutFails; i++ {
		if _, err := Pair(context.Background(), addr, "wrong", ca); !errors.Is(err, errdefs.ErrForbidden) {
			t.Fatalf("wrong code %d: %v", i, err)
		}
	}
	_, err := Pair(context.Background(), addr, e.code, ca)
	if !errors.Is(err, errdefs.ErrForbidden) || !strings.Contains(err.Error(), "try again in a minute") {
		t.Fatalf("the right code during a lockout: %v", err)
	}
}

// TestPairingThroughAManInTheMiddle: a relay that ends TLS with a
// certificate of its own and passes everything on, code-carrying proofs
// included, cannot pair the node: the master's proof names the certificate
// it saw, which is not the node's.
func TestPairingThroughAManInTheMiddle(t *testing.T) {
	pkiDir := t.TempDir()
	e, _ := NewEndpoint("n3", pkiDir, newFake(), quiet())
	nodeAddr := serveEndpoint(t, e)
	target, _ := url.Parse("https://" + nodeAddr)
	relay := httputil.NewSingleHostReverseProxy(target)
	relay.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	relay.ErrorLog = log.New(io.Discard, "", 0)
	mitm, _ := pki.SelfSigned()
	ln, _ := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{mitm}})
	srv := &http.Server{Handler: relay, ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(ln)
	defer srv.Close()
	ca, _ := pki.EnsureCA(t.TempDir())
	_, err := Pair(context.Background(), ln.Addr().String(), e.code, ca)
	if !errors.Is(err, errdefs.ErrForbidden) {
		t.Fatalf("pairing through a relay: %v", err)
	}
	if e.Paired() {
		t.Fatal("the node was paired through a man in the middle")
	}
}

// TestRenew: the master gives a paired node a new certificate (a new key
// and serial); the node serves it from the next connection, to the same
// master, and a restarted node keeps it.
func TestRenew(t *testing.T) {
	pkiDir := t.TempDir()
	e, _ := NewEndpoint("n4", pkiDir, newFake(), quiet())
	addr := serveEndpoint(t, e)
	ca, _ := pki.EnsureCA(t.TempDir())
	ctx := context.Background()
	if _, err := Pair(ctx, addr, e.code, ca); err != nil {
		t.Fatal(err)
	}
	serial := func(a string) string {
		cfg, _ := ca.PeerClientConfig(pki.MasterName)
		conn, err := tls.Dial("tcp", a, cfg)
		if err != nil {
			t.Fatalf("dial the node as its master: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := serial(addr)
	c, _ := Dial("n4", addr, ca, nil)
	if _, err := c.Status(ctx); err != nil || c.PeerNotAfter().IsZero() {
		t.Fatalf("status: %v (not after %v)", err, c.PeerNotAfter())
	}
	until, err := Renew(ctx, c, ca, "127.0.0.1")
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	after := serial(addr)
	if after == before || time.Until(until) < NodeCertLifetime-time.Hour {
		t.Errorf("after a renewal the node serves serial %s (was %s), until %v", after, before, until)
	}
	if _, err := c.Status(ctx); err != nil {
		t.Errorf("the master after the renewal: %v", err)
	}
	e2, _ := NewEndpoint("n4", pkiDir, newFake(), quiet())
	if got := serial(serveEndpoint(t, e2)); got != after {
		t.Errorf("restarted, the node serves %s, want the renewed %s", got, after)
	}
}

// TestUnpair: a node its master forgets forgets the master: the master's
// certificate no longer reaches the seam, and the node can be paired
// again with the same code.
func TestUnpair(t *testing.T) {
	pkiDir := t.TempDir()
	e, _ := NewEndpoint("n5", pkiDir, newFake(), quiet())
	addr := serveEndpoint(t, e)
	ca, _ := pki.EnsureCA(t.TempDir())
	ctx := context.Background()
	if _, err := Pair(ctx, addr, e.code, ca); err != nil {
		t.Fatal(err)
	}
	c, _ := Dial("n5", addr, ca, nil)
	if err := Unpair(ctx, c); err != nil {
		t.Fatal(err)
	}
	c2, _ := Dial("n5", addr, ca, nil)
	if _, err := c2.Status(ctx); err == nil {
		t.Error("an unpaired node still serves its old master")
	}
	if _, err := os.Stat(filepath.Join(pkiDir, nodeKeyFile)); !os.IsNotExist(err) {
		t.Errorf("the node key is still there: %v", err)
	}
	if _, err := Pair(ctx, addr, e.code, ca); err != nil {
		t.Errorf("pairing again: %v", err)
	}
}
