package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandstorm/internal/testenv"
)

// TestEnsureCAStable: the CA is made once and read back the same; its key
// file is 0600.
func TestEnsureCAStable(t *testing.T) {
	dir := t.TempDir()
	a, err := EnsureCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := EnsureCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if a.Fingerprint() != b.Fingerprint() || len(a.Fingerprint()) != 64 {
		t.Errorf("fingerprints %s, %s", a.Fingerprint(), b.Fingerprint())
	}
	fi, err := os.Stat(filepath.Join(dir, CAKeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("CA key mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	if _, err := ParseCA(a.PEM, []byte("junk")); err == nil {
		t.Error("a CA with a junk key parsed")
	}
}

// serve runs a TLS server with cfg on loopback answering "ok" and returns
// its address.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Serve(t, ln, func(c net.Conn) {
		if err := c.(*tls.Conn).Handshake(); err == nil {
			io.WriteString(c, "ok")
		}
	})
	return ln.Addr().String()
}

func dial(addr string, cfg *tls.Config) error {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	b, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if string(b) != "ok" {
		return errors.New("no answer")
	}
	return nil
}

// TestServerTrust: a client that trusts the CA reaches the server by its
// loopback address and by localhost; a client that trusts another CA, or
// only the system's roots, is refused in the handshake; an expired
// certificate is refused.
func TestServerTrust(t *testing.T) {
	ca, _ := EnsureCA(t.TempDir())
	other, _ := EnsureCA(t.TempDir())
	cfg, err := ca.ServerConfig(ServerHosts("127.0.0.1:8080"))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)
	good, _ := ClientConfig(ca.PEM)
	if err := dial(addr, good); err != nil {
		t.Errorf("a client trusting the CA: %v", err)
	}
	byName := good.Clone()
	byName.ServerName = "localhost"
	if err := dial(addr, byName); err != nil {
		t.Errorf("by the name localhost: %v", err)
	}
	wrong, _ := ClientConfig(other.PEM)
	var unknown x509.UnknownAuthorityError
	if err := dial(addr, wrong); !errors.As(err, &unknown) {
		t.Errorf("a client trusting another CA: err = %v, want unknown authority", err)
	}
	if err := dial(addr, &tls.Config{}); err == nil {
		t.Error("a client with the system's roots was let in")
	}
	wrongName := good.Clone()
	wrongName.ServerName = "elsewhere.example"
	if err := dial(addr, wrongName); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a name the certificate does not carry: err = %v", err)
	}

	expired, err := ca.Issue("old", []string{"127.0.0.1"}, -time.Minute, true, false)
	if err != nil {
		t.Fatal(err)
	}
	addr2 := serve(t, &tls.Config{Certificates: []tls.Certificate{expired}})
	var inv x509.CertificateInvalidError
	if err := dial(addr2, good); !errors.As(err, &inv) || inv.Reason != x509.Expired {
		t.Errorf("an expired certificate: err = %v, want expired", err)
	}
}
