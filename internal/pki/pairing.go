package pki

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base32"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Pairing a node with a master (seed "Quick start": "On first start it
// writes a pairing code to /var/lib/sandstorm/pki/node/pairing-code. Give
// the master its address and that code"). The code never crosses the
// wire: each side proves it knows it with an HMAC-SHA256 keyed by the code
// (RFC 2104) over what this exchange alone has — a fresh nonce, the
// certificate the node's pairing listener presented as the master saw it,
// and the CA, CSR and certificate being exchanged. A man in the middle
// presents another certificate than the node's own, so the node's check of
// the master's proof fails; without the code it can forge neither proof.
// The code stays the same across restarts; whoever holds it can pair the
// node, so it is a file of mode 0600.

// PairingCodeFile is the node's pairing code, under its data dir's pki.
const PairingCodeFile = "node/pairing-code"

// EnsurePairingCode returns the node's pairing code in pkiDir, making it
// (100 random bits, base32, in groups of four) on first use.
func EnsurePairingCode(pkiDir string) (string, error) {
	path := filepath.Join(pkiDir, PairingCodeFile)
	if b, err := os.ReadFile(path); err == nil {
		if c := strings.TrimSpace(string(b)); c != "" {
			os.Chmod(path, 0o600)
			return c, nil
		}
	}
	var raw [13]byte // 104 bits; base32 of 13 bytes is 21 characters
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	s := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(raw[:]))[:20]
	code := s[0:4] + "-" + s[4:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20]
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	return code, writeFile(path, []byte(code+"\n"), 0o600)
}

// Proof is the HMAC-SHA256 keyed by code over a label and the parts.
func Proof(code, label string, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, []byte(normalizeCode(code)))
	m.Write([]byte("sandstorm pairing v1\x00" + label + "\x00"))
	for _, p := range parts {
		var n [8]byte
		for i := range n {
			n[i] = byte(len(p) >> (56 - 8*i))
		}
		m.Write(n[:]) // each part length-prefixed: no two splits hash alike
		m.Write(p)
	}
	return m.Sum(nil)
}

// CheckProof reports, in constant time, whether proof is Proof(code, …).
func CheckProof(proof []byte, code, label string, parts ...[]byte) bool {
	return hmac.Equal(proof, Proof(code, label, parts...))
}

// normalizeCode lets a person type the code with or without dashes, in
// either case.
func normalizeCode(code string) string {
	return strings.ToLower(strings.ReplaceAll(strings.TrimSpace(code), "-", ""))
}

// Labels of the three proofs of a pairing.
const (
	ProofMaster = "master hello" // nonce, node's pairing certificate, CA
	ProofNode   = "node csr"     // nonce, CSR
	ProofFinish = "master cert"  // nonce, the node's certificate
)

// SelfSigned is a throwaway certificate for a node's pairing listener: it
// proves nothing by itself; the pairing proofs bind it.
func SelfSigned() (tls.Certificate, error) {
	certPEM, keyPEM, err := NewCA()
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

// NewCSR makes a key and a certificate request for it.
func NewCSR(cn string) (csrDER []byte, keyPEM []byte, err error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	csrDER, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, nil, err
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return csrDER, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), nil
}

// SignCSR issues a server certificate for the key of csrDER, named cn, for
// hosts, valid for lifetime; it returns the certificate's DER.
func (ca *CA) SignCSR(csrDER []byte, cn string, hosts []string, lifetime time.Duration) ([]byte, error) {
	return ca.SignCSRFor(csrDER, cn, hosts, lifetime, true, false)
}

// SignCSRFor is SignCSR for serving and/or client use (a node that dials
// its master presents its certificate as a client).
func (ca *CA) SignCSRFor(csrDER []byte, cn string, hosts []string, lifetime time.Duration, server, client bool) ([]byte, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, errors.New("pki: the CSR is not signed by its key")
	}
	return ca.signKey(csr.PublicKey, cn, hosts, lifetime, server, client)
}
