package controlplane

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/pki"
)

// startServe runs Serve with o until the test ends (or stop is called,
// which waits for it to return) and returns the address it listens on.
func startServe(t *testing.T, o Options) (addr string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, o, func(a string) { ready <- a })
	}()
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	t.Cleanup(func() { cancel() })
	return addr, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}
}

// caPool is a pool of the CA Serve made in dir, alone.
func caPool(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(dir, "pki", pki.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return pool
}

// trusting is an HTTPS client that trusts pool's CAs only.
func trusting(pool *x509.CertPool) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

// serveIn runs Serve on dir until the test ends (or stop is called) and
// returns an operator's client of it over HTTPS, trusting only its CA.
func serveIn(t *testing.T, dir string) (*Client, func()) {
	t.Helper()
	a, stop := startServe(t, Options{DataDir: dir, Listen: "127.0.0.1:0", Name: "cp-serve", Log: slog.New(slog.DiscardHandler)})
	admin, err := os.ReadFile(filepath.Join(dir, AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	return &Client{Base: "https://" + a, Name: "cp-serve", HTTP: trusting(caPool(t, dir)), AdminToken: strings.TrimSpace(string(admin))}, stop
}

// enrolNodeA enrols node-a, key priv, with a token of c's, as a member
// does: without the operator's token.
func enrolNodeA(t *testing.T, c *Client, priv ed25519.PrivateKey) api.Credential {
	t.Helper()
	tok, err := c.CreateToken(context.Background(), api.MeshTokenRequest{MaxUses: 1, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	member := &Client{Base: c.Base, Name: c.Name, HTTP: c.HTTP}
	cred, err := member.Enrol(context.Background(), tok.Token, "node-a", priv)
	if err != nil {
		t.Fatal(err)
	}
	return cred
}

// TestServeKeepsItsKeys: sam-control-plane serve keeps its secrets in
// files of mode 0600, serves HTTPS from its own CA, and a restart keeps
// its keys: a credential issued before it still verifies after it.
func TestServeKeepsItsKeys(t *testing.T) {
	dir := t.TempDir()
	c, stop := serveIn(t, dir)
	ctx := context.Background()
	cred := enrolNodeA(t, c, key(t))
	for _, f := range []string{AdminTokenFile, IssuerKeysFile, "pki/" + pki.CAKeyFile} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", f, err, st.Mode().Perm())
		}
	}
	stop()

	c, _ = serveIn(t, dir)
	member := &Client{Base: c.Base, Name: c.Name, HTTP: c.HTTP}
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

// TestServeKeepsPolicyAndRotation: the policy and a key rotation survive
// a restart of sam-control-plane serve: the same version is served, the
// rotated key signs, the replaced one still verifies in its grace, and
// the keys file stays 0600.
func TestServeKeepsPolicyAndRotation(t *testing.T) {
	dir := t.TempDir()
	c, stop := serveIn(t, dir)
	ctx := context.Background()
	priv := key(t)
	before := enrolNodeA(t, c, priv)
	if _, err := c.SetPolicy(ctx, []byte(policyV1)); err != nil {
		t.Fatal(err)
	}
	grace := time.Hour
	rot, err := c.RotateKeys(ctx, &grace)
	if err != nil {
		t.Fatal(err)
	}
	if rot.Current == rot.RetiredKey || time.Until(rot.RetiresAt) < 59*time.Minute {
		t.Errorf("rotation: %+v", rot)
	}
	if st, err := os.Stat(filepath.Join(dir, IssuerKeysFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("%s after a rotation: %v, mode %v", IssuerKeysFile, err, st.Mode().Perm())
	}
	stop()

	c, _ = serveIn(t, dir)
	member := &Client{Base: c.Base, Name: c.Name, HTTP: c.HTTP}
	p, _, err := member.Policy(ctx, before.Credential, 0)
	if err != nil || p.Version != 1 || p.Document != policyV1 {
		t.Errorf("the policy after a restart: %+v, %v", p, err)
	}
	after, err := member.Refresh(ctx, "node-a", priv)
	if err != nil {
		t.Fatal(err)
	}
	keys, _ := member.Keys(ctx)
	v, err := NewVerifier(keys)
	if err != nil {
		t.Fatal(err)
	}
	for name, cred := range map[string]string{"before the rotation": before.Credential, "after it": after.Credential} {
		if _, err := v.Verify(cred, time.Now()); err != nil {
			t.Errorf("a credential from %s, after a restart: %v", name, err)
		}
	}
	if kid := jwtKeyID(t, after.Credential); kid != rot.Current {
		t.Errorf("after a restart the credential is signed by %s, want the rotated key %s", kid, rot.Current)
	}
}

// TestServeOnSeveralAddresses: with AlsoListen the API is served on each
// address given and on no other, and its certificate names every one of
// them, so a member that reaches this machine at any of them verifies it
// (sandstormd fleet up --hosts: hosts on different networks).
func TestServeOnSeveralAddresses(t *testing.T) {
	dir := t.TempDir()
	free := func(ip string) string {
		ln, err := net.Listen("tcp", ip+":0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	a1, a2 := free("127.0.0.1"), free("127.0.0.2")
	_, stop := startServe(t, Options{DataDir: dir, Listen: a1, AlsoListen: []string{a2}, Name: "cp", Log: slog.New(slog.DiscardHandler)})
	pool := caPool(t, dir)
	for _, a := range []string{a1, a2} {
		// An IP address sends no server name: the certificate must name
		// the address itself.
		c, err := tls.Dial("tcp", a, &tls.Config{RootCAs: pool})
		if err != nil {
			t.Errorf("TLS to %s: %v", a, err)
			continue
		}
		leaf := c.ConnectionState().PeerCertificates[0]
		c.Close()
		var ips []string
		for _, ip := range leaf.IPAddresses {
			ips = append(ips, ip.String())
		}
		for _, want := range []string{"127.0.0.1", "127.0.0.2"} {
			if !slices.Contains(ips, want) {
				t.Errorf("the certificate served at %s names %v, not %s", a, ips, want)
			}
		}
		keys, err := (&Client{Base: "https://" + a, Name: "cp", HTTP: trusting(pool)}).Keys(context.Background())
		if err != nil || len(keys.Keys) == 0 {
			t.Errorf("GET /v1/keys at %s: %+v %v", a, keys, err)
		}
	}
	_, port, _ := net.SplitHostPort(a2)
	if c, err := net.DialTimeout("tcp", "127.0.0.3:"+port, time.Second); err == nil {
		c.Close()
		t.Errorf("the API answers on 127.0.0.3:%s, an address it was not given", port)
	}
	stop()
	for _, a := range []string{a1, a2} {
		if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still listens after Serve returned", a)
		}
	}
}
