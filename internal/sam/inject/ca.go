// Package inject is the boundary's way of sending a secret a sandbox never
// holds (issue 33, item 4): for a flow to one of a secret's destinations,
// the boundary ends the sandbox's TLS with a certificate from the
// sandbox's own CA, opens TLS to the real server (verifying its real
// certificate), and passes each HTTP/1.1 request on with the secret in
// place of its marker. Every other flow is not touched, so a marker sent
// anywhere else goes out as the marker.
package inject

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"time"
)

// NewCA makes a sandbox's CA: ECDSA P-256, valid 10 years, that may sign
// only for hosts (X.509 name constraints, which OpenSSL, Go and browsers
// honour): if its key ever left the node, it could not vouch for any
// other name to the sandbox that trusts it. It returns the certificate
// and its key, PEM.
func NewCA(sandbox string, hosts []string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	var permitted []string
	for _, h := range hosts {
		if d, ok := strings.CutPrefix(h, "*"); ok {
			permitted = append(permitted, d) // ".example.com": names under it only
		} else {
			permitted = append(permitted, h)
		}
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial(),
		Subject:                     pkix.Name{CommonName: "Sandstorm egress CA for sandbox " + sandbox, Organization: []string{"Sandstorm"}},
		NotBefore:                   now.Add(-time.Hour),
		NotAfter:                    now.AddDate(10, 0, 0),
		IsCA:                        true,
		BasicConstraintsValid:       true,
		MaxPathLenZero:              true,
		KeyUsage:                    x509.KeyUsageCertSign,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         permitted,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err)
	}
	return n
}

// Issuer signs leaf certificates with a CA (a sandbox's, for its secret
// hosts), each kept until an hour before it expires.
type Issuer struct {
	ca  *x509.Certificate
	key *ecdsa.PrivateKey

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// NewIssuer is an issuer for the CA in certPEM and keyPEM (NewCA's).
func NewIssuer(certPEM, keyPEM []byte) (*Issuer, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("the sandbox's CA: not PEM")
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the sandbox's CA: %w", err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the sandbox's CA key: %w", err)
	}
	return &Issuer{ca: ca, key: key, leaves: map[string]*tls.Certificate{}}, nil
}

// leafLife is how long a leaf is valid; one is made again an hour before.
const leafLife = 24 * time.Hour

// Leaf is a certificate for host, valid a day.
func (i *Issuer) Leaf(host string) (*tls.Certificate, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if c, ok := i.leaves[host]; ok && time.Until(c.Leaf.NotAfter) > time.Hour {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafLife),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, i.ca, &key.PublicKey, i.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	i.leaves[host] = c
	return c, nil
}
