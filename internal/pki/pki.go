// Package pki is the master's certificate authority (seed "Quick start":
// "the master's CA and API token from its /var/lib/sandstorm/pki"): made
// at first start under <data-dir>/pki, it issues the API's server
// certificate, and the clients — the CLI, the bench tools, the tests —
// trust it rather than the system's roots. Keys are ECDSA P-256
// (crypto/ecdsa, crypto/x509); the CA key is a file of mode 0600 and never
// leaves it except into a store the masters share (daemon).
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// File names under the pki directory.
const (
	CAFile    = "ca.pem"
	CAKeyFile = "ca.key"
)

// Lifetimes. The CA outlives any deployment of it; a server certificate
// is short and renewed in the running process (ServerConfig) long before
// it ends.
const (
	CALifetime     = 10 * 365 * 24 * time.Hour
	ServerLifetime = 7 * 24 * time.Hour
)

// CA is a certificate authority: its certificate and key.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	PEM  []byte // Cert, PEM-encoded
}

// EnsureCA loads the CA in dir, making one on first use.
func EnsureCA(dir string) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile)
	certPEM, err1 := os.ReadFile(certPath)
	keyPEM, err2 := os.ReadFile(keyPath)
	if err1 == nil && err2 == nil {
		os.Chmod(keyPath, 0o600)
		return ParseCA(certPEM, keyPEM)
	}
	if !errors.Is(err1, os.ErrNotExist) && err1 != nil {
		return nil, err1
	}
	certPEM, keyPEM, err := NewCA()
	if err != nil {
		return nil, err
	}
	if err := WriteCA(dir, certPEM, keyPEM); err != nil {
		return nil, err
	}
	return ParseCA(certPEM, keyPEM)
}

// WriteCA puts a CA's certificate (0644) and key (0600) in dir, each
// written whole or not at all.
func WriteCA(dir string, certPEM, keyPEM []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, CAKeyFile), keyPEM, 0o600); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, CAFile), certPEM, 0o644)
}

func writeFile(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// NewCA makes a CA and returns its certificate and key, PEM-encoded.
func NewCA() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"Sandstorm"}, CommonName: "Sandstorm CA " + serial.Text(16)[:8]},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CALifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true, // it signs leaves only
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), nil
}

// ParseCA reads a CA from its PEM certificate and key.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("pki: CA certificate or key is not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok || !cert.IsCA {
		return nil, errors.New("pki: not a CA certificate and key")
	}
	return &CA{Cert: cert, Key: signer, PEM: certPEM}, nil
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// Fingerprint is the SHA-256 of the CA certificate, hex: what a node or a
// person checks the CA by (--ca-fingerprint).
func (ca *CA) Fingerprint() string {
	sum := sha256.Sum256(ca.Cert.Raw)
	return hex.EncodeToString(sum[:])
}

// Pool is a cert pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue signs a leaf for hosts (IP addresses and DNS names) valid for
// lifetime, for serving (server) or for presenting as a client (client).
func (ca *CA) Issue(cn string, hosts []string, lifetime time.Duration, server, client bool) (tls.Certificate, error) {
	key, err := newKey()
	if err != nil {
		return tls.Certificate{}, err
	}
	der, err := ca.signKey(&key.PublicKey, cn, hosts, lifetime, server, client)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

// signKey issues a leaf certificate for the public key pub.
func (ca *CA) signKey(pub any, cn string, hosts []string, lifetime time.Duration, server, client bool) ([]byte, error) {
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"Sandstorm"}, CommonName: cn},
		NotBefore:    now.Add(-Backdate),
		NotAfter:     now.Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
}

// ServerConfig is a TLS configuration serving a certificate from ca for
// hosts, reissued in the running process once two thirds of its lifetime
// have passed, so a long-running master never serves an expired one. A
// connection that reached the server at a local address the certificate
// does not name (an API listening on every address, reached by an address
// that appeared after it started: a veth made later) gets a certificate
// that also names that address.
func (ca *CA) ServerConfig(hosts []string) (*tls.Config, error) {
	var (
		mu    sync.Mutex
		certs = map[string]tls.Certificate{} // by the local address it was made for ("" for hosts)
	)
	issue := func(extra string) (tls.Certificate, error) {
		hs := hosts
		if extra != "" {
			hs = append(slices.Clone(hosts), extra)
		}
		c, err := ca.Issue("sandstorm api", hs, ServerLifetime, true, false)
		if err == nil {
			certs[extra] = c
		}
		return c, err
	}
	if _, err := issue(""); err != nil {
		return nil, err
	}
	named := map[string]bool{}
	for _, h := range hosts {
		named[h] = true
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			mu.Lock()
			defer mu.Unlock()
			key := ""
			if hello.Conn != nil && hello.ServerName == "" {
				if ap, err := netip.ParseAddrPort(hello.Conn.LocalAddr().String()); err == nil && !named[ap.Addr().Unmap().String()] {
					key = ap.Addr().Unmap().String()
				}
			}
			cur, ok := certs[key]
			if !ok || time.Until(cur.Leaf.NotAfter) < ServerLifetime/3 {
				c, err := issue(key)
				if err != nil {
					return nil, err
				}
				cur = c
			}
			return &cur, nil
		},
	}, nil
}

// ServerHosts are the names a server certificate for an API listening on
// addr (host:port) must carry: its host (or, for a wildcard address, this
// machine's addresses and name), plus loopback and localhost.
func ServerHosts(addr string) []string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	hosts := []string{"127.0.0.1", "::1", "localhost"}
	ip := net.ParseIP(host)
	if host != "" && (ip == nil || !ip.IsUnspecified()) {
		return append(hosts, host)
	}
	if name, err := os.Hostname(); err == nil {
		hosts = append(hosts, name)
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() {
				hosts = append(hosts, n.IP.String())
			}
		}
	}
	return hosts
}

// ClientConfig is a TLS configuration for a client of a server whose
// certificate ca signed (and nothing else).
func ClientConfig(caPEM []byte) (*tls.Config, error) {
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("pki: no certificate in the CA file")
	}
	return &tls.Config{RootCAs: p, MinVersion: tls.VersionTLS12}, nil
}

// Mutual TLS between a master and its nodes (issue 9: "all master↔node
// traffic is mutual TLS with certificates from the master's CA, node
// certificates short-lived and renewed"). Each side presents a leaf from
// the CA and accepts only the other side's: a node serves only the master
// (the common name MasterName), so one node's certificate is no key to
// another node.

// MasterName is the common name of the master's client certificate.
const MasterName = "sandstorm master"

// LeafLifetime is how long a master or node certificate lasts; each is
// reissued in the running process once two thirds of it have passed.
const LeafLifetime = 24 * time.Hour

// renewing issues a leaf with issue and reissues it when a third of its
// lifetime is left.
func renewing(lifetime time.Duration, issue func() (tls.Certificate, error)) (func() (*tls.Certificate, error), error) {
	var (
		mu  sync.Mutex
		cur tls.Certificate
	)
	c, err := issue()
	if err != nil {
		return nil, err
	}
	cur = c
	return func() (*tls.Certificate, error) {
		mu.Lock()
		defer mu.Unlock()
		if time.Until(cur.Leaf.NotAfter) < lifetime/3 {
			c, err := issue()
			if err != nil {
				return nil, err
			}
			cur = c
		}
		c := cur
		return &c, nil
	}, nil
}

// Backdate is how far before its issue a leaf's validity starts: clocks
// differ a little. A certificate was issued at NotBefore + Backdate
// (which a revocation by time relies on).
const Backdate = 5 * time.Minute

// PeerServerConfig is a node's TLS configuration: it serves a leaf of its
// own from ca for hosts (common name cn), and takes only clients whose
// certificate ca signed for client use with the common name allow.
func (ca *CA) PeerServerConfig(cn string, hosts []string, allow string) (*tls.Config, error) {
	get, err := ca.renewingLeaf(cn, hosts, true, false)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return get() },
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      ca.Pool(),
		// The chain is verified by then (against ClientCAs, for client
		// use, in its validity period); what is left is who it is.
		VerifyPeerCertificate: func(_ [][]byte, chains [][]*x509.Certificate) error {
			if len(chains) == 0 || len(chains[0]) == 0 || chains[0][0].Subject.CommonName != allow {
				return fmt.Errorf("pki: only %q may connect here", allow)
			}
			return nil
		},
	}, nil
}

// PeerClientConfig is the master's TLS configuration towards its nodes: it
// presents a leaf from ca with the common name cn and trusts only servers
// whose certificate ca signed.
func (ca *CA) PeerClientConfig(cn string) (*tls.Config, error) {
	get, err := ca.renewingLeaf(cn, nil, false, true)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		RootCAs:              ca.Pool(),
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return get() },
	}, nil
}

// renewingLeaf is a leaf of ca's for cn and hosts, for server or client
// use, issued anew as it nears the end of its LeafLifetime (renewing).
func (ca *CA) renewingLeaf(cn string, hosts []string, server, client bool) (func() (*tls.Certificate, error), error) {
	return renewing(LeafLifetime, func() (tls.Certificate, error) {
		return ca.Issue(cn, hosts, LeafLifetime, server, client)
	})
}
