package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/pki"
)

// serveIn runs Serve on dir until the test ends (or stop is called) and
// returns an operator's client of it over HTTPS, trusting only its CA.
func serveIn(t *testing.T, dir string) (*Client, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, Options{DataDir: dir, Listen: "127.0.0.1:0", Name: "cp-serve", Log: slog.New(slog.DiscardHandler)}, func(a string) { addr <- a })
	}()
	var a string
	select {
	case a = <-addr:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}
	t.Cleanup(func() { cancel() })
	caPEM, err := os.ReadFile(filepath.Join(dir, "pki", pki.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	admin, err := os.ReadFile(filepath.Join(dir, AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	return &Client{Base: "https://" + a, Name: "cp-serve", HTTP: hc, AdminToken: strings.TrimSpace(string(admin))}, stop
}

// TestServeKeepsItsKeys: sam-control-plane serve keeps its secrets in
// files of mode 0600, serves HTTPS from its own CA, and a restart keeps
// its keys: a credential issued before it still verifies after it.
func TestServeKeepsItsKeys(t *testing.T) {
	dir := t.TempDir()
	c, stop := serveIn(t, dir)
	ctx := context.Background()
	tok, err := c.CreateToken(ctx, api.MeshTokenRequest{MaxUses: 1, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	member := &Client{Base: c.Base, Name: c.Name, HTTP: c.HTTP}
	cred, err := member.Enrol(ctx, tok.Token, "node-a", key(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{AdminTokenFile, IssuerKeysFile, "pki/" + pki.CAKeyFile} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", f, err, st.Mode().Perm())
		}
	}
	stop()

	c, _ = serveIn(t, dir)
	member = &Client{Base: c.Base, Name: c.Name, HTTP: c.HTTP}
	keys, err := member.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVerifier(keys)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(cred.Credential, time.Now()); err != nil {
		t.Errorf("a credential from before the restart: %v", err)
	}
	if _, err := (&Client{Base: c.Base, Name: c.Name, HTTP: http.DefaultClient}).Keys(ctx); err == nil {
		t.Error("a client that does not trust the control plane's CA got an answer")
	}
}
