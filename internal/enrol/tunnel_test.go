package enrol

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sandstorm/internal/nodeapi/remote"
	"sandstorm/internal/pki"
)

// TestTunnelRenew: the master renews the certificate of a node that dials
// in as it does a paired node's, but for client use (what its tunnel
// presents): a new key and certificate from the same CA land in the
// node's files, and the master knows when the new one ends.
func TestTunnelRenew(t *testing.T) {
	ca, _ := pki.EnsureCA(t.TempDir())
	pkiDir := t.TempDir()
	os.MkdirAll(filepath.Join(pkiDir, "node"), 0o700)
	csr, keyPEM, _ := pki.NewCSR("node j1")
	der, err := ca.SignCSRFor(csr, "node j1", nil, time.Hour, false, true)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(pkiDir, nodeKeyFile), keyPEM, 0o600)
	os.WriteFile(filepath.Join(pkiDir, nodeCertFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(filepath.Join(pkiDir, nodeCAFile), ca.PEM, 0o644)
	j := &Joiner{Name: "j1", PKIDir: pkiDir, Node: newFake(), Log: quiet()}
	// The tunnel's streams carry plain HTTP (the TLS is the tunnel's).
	srv := httptest.NewServer(j.handler())
	defer srv.Close()
	c := remote.NewClient("j1", srv.URL, srv.Client(), true, time.Now().Add(time.Hour))
	until, err := Renew(context.Background(), c, ca, "")
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	if time.Until(until) < NodeCertLifetime-time.Hour || !c.PeerNotAfter().Equal(until) {
		t.Errorf("renewed until %v; the master records %v", until, c.PeerNotAfter())
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(pkiDir, nodeCertFile), filepath.Join(pkiDir, nodeKeyFile))
	if err != nil {
		t.Fatalf("the node's new files do not match: %v", err)
	}
	leaf, _ := x509.ParseCertificate(pair.Certificate[0])
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the renewed certificate is not for client use from the CA: %v", err)
	}
	if leaf.SerialNumber.Cmp(mustParse(t, der).SerialNumber) == 0 {
		t.Error("the certificate did not change")
	}
	// A certificate nobody asked for is refused.
	if err := c.Do(context.Background(), "PUT", "/node/v1/cert", pairFinish{Cert: der}, nil, 204); err == nil {
		t.Error("an unasked-for certificate was taken")
	}
}

func mustParse(t *testing.T, der []byte) *x509.Certificate {
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
