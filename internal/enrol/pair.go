package enrol

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/httpjson"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/nodeapi/remote"
	"sandstorm/internal/pki"
)

// Pairing over the seam (pki/pairing.go has the proofs and why they
// hold). The master dials the node's address; until the node is paired
// its listener presents a throwaway certificate and serves only the two
// pairing calls; once paired it presents the certificate the master's CA
// signed for it and serves the seam to the master alone (mutual TLS).
//
//	master → POST /node/v1/pair        {ca, nonce, proof(master hello)}
//	node   ← 200                       {name, csr, proof(node csr)}
//	master → POST /node/v1/pair/finish {cert, proof(master cert)}
//	node   ← 204, and from now on it is the master's
//
// A wrong code is a 403 that says where the code is; the code itself is
// never sent or logged.

// NodeCertLifetime is how long the certificate a master signs for a node
// lasts (issue 9: "node certificates short-lived and renewed"): its master
// renews it (Renew) once a third of it is left.
const NodeCertLifetime = 24 * time.Hour

// Files of a paired node, under <data-dir>/pki/node.
const (
	nodeCAFile   = "node/ca.pem" // the master's CA
	nodeCertFile = "node/node.pem"
	nodeKeyFile  = "node/node.key"
)

// pkiFile is a file of a node's pairing, written by writePKI.
type pkiFile struct {
	name string // under the pki dir
	b    []byte
	mode os.FileMode
}

// writePKI writes files under pkiDir, each whole or not at all (a temporary
// file renamed over it), the key before the certificate that names it.
func writePKI(pkiDir string, files ...pkiFile) error {
	if err := os.MkdirAll(filepath.Join(pkiDir, "node"), 0o700); err != nil {
		return err
	}
	for _, f := range files {
		path := filepath.Join(pkiDir, f.name)
		if err := os.WriteFile(path+".tmp", f.b, f.mode); err != nil {
			return err
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			return err
		}
	}
	return nil
}

type pairHello struct {
	CA    string `json:"ca"`    // PEM
	Nonce []byte `json:"nonce"` // 32 bytes
	Proof []byte `json:"proof"`
}

type pairReply struct {
	Name  string `json:"name"`
	CSR   []byte `json:"csr"` // DER
	Proof []byte `json:"proof"`
}

type pairFinish struct {
	Cert  []byte `json:"cert"` // DER
	Proof []byte `json:"proof"`
}

// Endpoint is a node's listener for its master: pairing until paired,
// then the seam (Server) over mutual TLS.
type Endpoint struct {
	Name   string // the node's name
	PKIDir string // <data-dir>/pki
	Node   nodeapi.Node
	Log    *slog.Logger
	// AllowPeer says whether node name, with a certificate issued at
	// issued, may forward its ingress's traffic here (the master's
	// routes name the nodes it paired: ingress.Table.AllowPeer); nil: no
	// peer may.
	AllowPeer func(name string, issued time.Time) bool

	code string
	boot tls.Certificate // the throwaway pairing certificate

	mu      sync.Mutex
	paired  *tls.Config // nil until paired
	pending *pendingPair
	fails   []time.Time // recent wrong codes, for the lockout
	renew   renewal
}

type pendingPair struct {
	nonce  []byte
	ca     []byte // PEM
	keyPEM []byte
	csr    []byte
}

// NewEndpoint loads (or makes) the node's pairing code and, if it was
// paired before, its certificate and its master's CA.
func NewEndpoint(name, pkiDir string, n nodeapi.Node, log *slog.Logger) (*Endpoint, error) {
	code, err := pki.EnsurePairingCode(pkiDir)
	if err != nil {
		return nil, err
	}
	boot, err := pki.SelfSigned()
	if err != nil {
		return nil, err
	}
	e := &Endpoint{Name: name, PKIDir: pkiDir, Node: n, Log: log, code: code, boot: boot}
	if cfg, err := e.loadPaired(); err == nil {
		e.paired = cfg
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("this node's pairing in %s: %w", filepath.Join(pkiDir, "node"), err)
	}
	return e, nil
}

// Paired reports whether the node has a master.
func (e *Endpoint) Paired() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.paired != nil
}

// CodePath is where the pairing code is, for messages.
func (e *Endpoint) CodePath() string { return filepath.Join(e.PKIDir, pki.PairingCodeFile) }

// loadPaired builds the mutual-TLS configuration from the files a pairing
// wrote.
func (e *Endpoint) loadPaired() (*tls.Config, error) {
	caPEM, err := os.ReadFile(filepath.Join(e.PKIDir, nodeCAFile))
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(e.PKIDir, nodeCertFile), filepath.Join(e.PKIDir, nodeKeyFile))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("no CA certificate in " + nodeCAFile)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		// Its master, or a peer node of the same master, which may only
		// forward its ingress's traffic (Handler, peerPaths).
		VerifyPeerCertificate: func(_ [][]byte, chains [][]*x509.Certificate) error {
			if len(chains) == 0 || chains[0][0].Subject.CommonName != pki.MasterName && !strings.HasPrefix(chains[0][0].Subject.CommonName, "node ") {
				return errors.New("only this node's master, or a node it paired, may connect")
			}
			return nil
		},
	}, nil
}

// TLSConfig is the listener's configuration: the pairing certificate
// until paired, then mutual TLS with the master's CA.
func (e *Endpoint) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			e.mu.Lock()
			defer e.mu.Unlock()
			if e.paired != nil {
				return e.paired, nil
			}
			return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{e.boot}}, nil
		},
	}
}

// Handler serves the pairing calls and, once paired, the seam.
func (e *Endpoint) Handler() http.Handler {
	seam := remote.Server(e.Node)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/node/v1/pair":
			if r.Method == http.MethodGet {
				// Whether it is paired, and its name: nothing secret.
				httpjson.Write(w, http.StatusOK, map[string]any{"name": e.Name, "paired": e.Paired()})
				return
			}
			e.hello(w, r)
			return
		case "/node/v1/pair/finish":
			e.finish(w, r)
			return
		}
		// Only a paired node's listener asks for client certificates, and
		// only the master's pass its handshake.
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			httpjson.Write(w, http.StatusForbidden, api.Error{Code: api.CodeForbidden, Message: "this node is not paired: pair it from its master (POST /v1/nodes with its address and the code in " + e.CodePath() + ")"})
			return
		}
		if leaf := r.TLS.VerifiedChains[0][0]; leaf.Subject.CommonName != pki.MasterName && !e.peerAllowed(r, leaf) {
			httpjson.Write(w, http.StatusForbidden, api.Error{Code: api.CodeForbidden, Message: leaf.Subject.CommonName + " may not call this node: a peer may only forward its ingress's traffic, and only while its master has it paired"})
			return
		}
		switch r.URL.Path {
		case "/node/v1/renew":
			e.renew.serveCSR(w, e.Name)
			return
		case "/node/v1/cert":
			e.renewCert(w, r)
			return
		case "/node/v1/unpair":
			e.unpair(w, r)
			return
		}
		seam.ServeHTTP(w, r)
	})
}

// lockout: after this many wrong codes in lockoutWindow, pairing is
// refused until the window passes (a guess costs a minute, not a packet).
const (
	lockoutFails  = 5
	lockoutWindow = time.Minute
)

func (e *Endpoint) refuse(w http.ResponseWriter, status int, msg string) {
	httpjson.Write(w, status, api.Error{Code: api.CodeForbidden, Message: msg})
}

func (e *Endpoint) hello(w http.ResponseWriter, r *http.Request) {
	var h pairHello
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&h); err != nil || len(h.Nonce) != 32 {
		httpjson.Write(w, http.StatusBadRequest, api.Error{Code: api.CodeBadRequest, Message: "malformed pairing request"})
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.paired != nil {
		e.refuse(w, http.StatusConflict, "this node is already paired with a master; to pair it with another, stop it and remove "+filepath.Join(e.PKIDir, "node")+" except pairing-code")
		return
	}
	now := time.Now()
	var recent []time.Time
	for _, t := range e.fails {
		if now.Sub(t) < lockoutWindow {
			recent = append(recent, t)
		}
	}
	e.fails = recent
	if len(recent) >= lockoutFails {
		e.refuse(w, http.StatusTooManyRequests, fmt.Sprintf("pairing refused: %d wrong pairing codes in the last minute; try again in a minute", len(recent)))
		return
	}
	block, _ := pem.Decode([]byte(h.CA))
	if block == nil {
		httpjson.Write(w, http.StatusBadRequest, api.Error{Code: api.CodeBadRequest, Message: "malformed pairing request: no CA"})
		return
	}
	caSum := sha256.Sum256(block.Bytes)
	bootSum := sha256.Sum256(e.boot.Certificate[0])
	if !pki.CheckProof(h.Proof, e.code, pki.ProofMaster, h.Nonce, bootSum[:], caSum[:]) {
		e.fails = append(e.fails, now)
		e.Log.Warn("pairing refused: wrong pairing code (or a certificate in between)", "from", r.RemoteAddr)
		e.refuse(w, http.StatusForbidden, "pairing refused: wrong pairing code (the node's code is in "+e.CodePath()+" on the node)")
		return
	}
	csr, keyPEM, err := pki.NewCSR("node " + e.Name)
	if err != nil {
		httpjson.Write(w, http.StatusInternalServerError, api.Error{Code: api.CodeInternal, Message: err.Error()})
		return
	}
	e.pending = &pendingPair{nonce: h.Nonce, ca: []byte(h.CA), keyPEM: keyPEM, csr: csr}
	httpjson.Write(w, http.StatusOK, pairReply{Name: e.Name, CSR: csr, Proof: pki.Proof(e.code, pki.ProofNode, h.Nonce, csr)})
}

func (e *Endpoint) finish(w http.ResponseWriter, r *http.Request) {
	var f pairFinish
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&f); err != nil {
		httpjson.Write(w, http.StatusBadRequest, api.Error{Code: api.CodeBadRequest, Message: "malformed pairing request"})
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.pending
	if e.paired != nil || p == nil {
		e.refuse(w, http.StatusConflict, "no pairing in progress")
		return
	}
	if !pki.CheckProof(f.Proof, e.code, pki.ProofFinish, p.nonce, f.Cert) {
		e.refuse(w, http.StatusForbidden, "pairing refused: wrong pairing code")
		return
	}
	cert, err := x509.ParseCertificate(f.Cert)
	if err != nil {
		httpjson.Write(w, http.StatusBadRequest, api.Error{Code: api.CodeBadRequest, Message: "the master's certificate for this node does not parse"})
		return
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.ca)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		httpjson.Write(w, http.StatusBadRequest, api.Error{Code: api.CodeBadRequest, Message: "the certificate is not from the CA the master sent: " + err.Error()})
		return
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.Cert})
	if err := writePKI(e.PKIDir, pkiFile{nodeKeyFile, p.keyPEM, 0o600}, pkiFile{nodeCertFile, certPEM, 0o644}, pkiFile{nodeCAFile, p.ca, 0o644}); err != nil {
		httpjson.Write(w, http.StatusInternalServerError, api.Error{Code: api.CodeInternal, Message: err.Error()})
		return
	}
	cfg, err := e.loadPaired()
	if err != nil {
		httpjson.Write(w, http.StatusInternalServerError, api.Error{Code: api.CodeInternal, Message: err.Error()})
		return
	}
	e.paired, e.pending = cfg, nil
	e.Log.Info("paired with a master", "ca_subject", cert.Issuer.CommonName, "cert_until", cert.NotAfter)
	w.WriteHeader(http.StatusNoContent)
}

// renewCert serves PUT /node/v1/cert (the master only): the certificate
// for the renewal's key, from the same CA; the node serves it from the
// next connection on.
func (e *Endpoint) renewCert(w http.ResponseWriter, r *http.Request) {
	pair, leaf, ok := e.renew.serveCert(w, r, e.PKIDir, x509.ExtKeyUsageServerAuth)
	if !ok {
		return
	}
	e.mu.Lock()
	cfg := e.paired.Clone()
	cfg.Certificates = []tls.Certificate{pair}
	e.paired = cfg
	e.mu.Unlock()
	e.Log.Info("certificate renewed by the master", "until", leaf.NotAfter)
	w.WriteHeader(http.StatusNoContent)
}

// unpair serves POST /node/v1/unpair (the master only): the master forgets
// this node, so the node forgets the master — its certificate, key and the
// master's CA go, and it waits to be paired again with its same code.
func (e *Endpoint) unpair(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, f := range []string{nodeCertFile, nodeKeyFile, nodeCAFile} {
		os.Remove(filepath.Join(e.PKIDir, f))
	}
	e.paired = nil
	e.renew.reset()
	e.Log.Info("unpaired: the master forgot this node; it can be paired again with its code", "pairing_code_file", e.CodePath())
	w.WriteHeader(http.StatusNoContent)
}

// Unpair tells the paired node of c that its master forgets it.
func Unpair(ctx context.Context, c *remote.Client) error {
	return c.Do(ctx, http.MethodPost, "/node/v1/unpair", struct{}{}, nil, http.StatusNoContent)
}

// Renew gives the paired node of c a new certificate from ca (a new key,
// a new NodeCertLifetime); host is the name it is reached by.
func Renew(ctx context.Context, c *remote.Client, ca *pki.CA, host string) (time.Time, error) {
	var reply pairReply
	if err := c.Do(ctx, http.MethodPost, "/node/v1/renew", struct{}{}, &reply, http.StatusOK); err != nil {
		return time.Time{}, err
	}
	// A node that serves its master has a server certificate; one that
	// dials in (a tunnel) presents its certificate as a client, and one
	// that serves does too, to its peers (internal/ingress).
	var hosts []string
	if !c.Tunnel() {
		hosts = []string{host}
	}
	der, err := ca.SignCSRFor(reply.CSR, "node "+c.NodeName, hosts, NodeCertLifetime, !c.Tunnel(), true)
	if err != nil {
		return time.Time{}, err
	}
	if err := c.Do(ctx, http.MethodPut, "/node/v1/cert", pairFinish{Cert: der}, nil, http.StatusNoContent); err != nil {
		return time.Time{}, err
	}
	cert, _ := x509.ParseCertificate(der)
	if c.Tunnel() {
		// The tunnel up now keeps its certificate; the next presents the
		// new one.
		c.SetPeerNotAfter(cert.NotAfter)
	} else {
		c.HTTP.CloseIdleConnections() // the next call meets the new certificate
	}
	return cert.NotAfter, nil
}

// pairSession is the master's end of one pairing: its HTTPS client, and
// the node's certificate as it saw it. The node's pairing certificate
// proves nothing by itself; what the master saw of it goes into its
// proof, so the node can tell that no one sat in between. The same
// certificate must serve every call.
type pairSession struct {
	ctx     context.Context
	address string
	hc      *http.Client
	mu      sync.Mutex
	seen    []byte
}

func newPairSession(ctx context.Context, address string) *pairSession {
	ps := &pairSession{ctx: ctx, address: address}
	tr := &http.Transport{TLSClientConfig: &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // checked by the proofs (Pair)
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no certificate")
			}
			ps.mu.Lock()
			defer ps.mu.Unlock()
			der := cs.PeerCertificates[0].Raw
			if ps.seen != nil && !bytes.Equal(ps.seen, der) {
				return errors.New("the node's certificate changed during pairing")
			}
			ps.seen = der
			return nil
		},
	}}
	ps.hc = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	return ps
}

func (ps *pairSession) close() { ps.hc.Transport.(*http.Transport).CloseIdleConnections() }

// certSum is the SHA-256 of the node's certificate as this side saw it.
func (ps *pairSession) certSum() [32]byte {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return sha256.Sum256(ps.seen)
}

// call GETs path (body nil) or POSTs body to it, decoding a 2xx answer
// into out; an error answer comes back as its status and api.Error.
func (ps *pairSession) call(path string, body, out any) (int, api.Error, error) {
	method, rd := http.MethodGet, io.Reader(nil)
	if body != nil {
		b, _ := json.Marshal(body)
		method, rd = http.MethodPost, bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ps.ctx, method, "https://"+ps.address+path, rd)
	if err != nil {
		return 0, api.Error{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := ps.hc.Do(req)
	// The node's TLS alert certificate_required (RFC 8446 §6.2; Go
	// reports a received alert as a "remote error" with its text).
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" && strings.Contains(op.Err.Error(), "certificate required") {
		return 0, api.Error{}, errdefs.Mark(errdefs.ErrConflict, fmt.Errorf("node at %s is already paired with a master (it asks for its master's certificate); to pair it again, stop it and remove its pki/node directory except pairing-code", ps.address))
	}
	if err != nil {
		return 0, api.Error{}, errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("node at %s: %w", ps.address, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e api.Error
		json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e)
		return resp.StatusCode, e, nil
	}
	if out != nil {
		return resp.StatusCode, api.Error{}, json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode, api.Error{}, nil
}

// Pair pairs the node listening at address (host:port) with the master
// whose CA is ca, proving knowledge of code, and returns the node's name.
func Pair(ctx context.Context, address, code string, ca *pki.CA) (string, error) {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return "", fmt.Errorf("%w: node address %q: want host:port", errdefs.ErrBadInput, address)
	}
	ps := newPairSession(ctx, address)
	defer ps.close()
	// A first call, to see the node's certificate before proving, and
	// whether it is free.
	var st struct {
		Name   string `json:"name"`
		Paired bool   `json:"paired"`
	}
	if status, e, err := ps.call("/node/v1/pair", nil, &st); err != nil {
		return "", err
	} else if status != http.StatusOK {
		return "", pairError(status, e)
	}
	if st.Paired {
		return "", errdefs.Mark(errdefs.ErrConflict, fmt.Errorf("node %s at %s is already paired with a master (this one or another); to pair it again, stop it and remove its pki/node directory except pairing-code", st.Name, address))
	}
	bootSum := ps.certSum()
	nonce := make([]byte, 32)
	rand.Read(nonce)
	caSum := sha256.Sum256(ca.Cert.Raw)
	var reply pairReply
	status, e, err := ps.call("/node/v1/pair", pairHello{CA: string(ca.PEM), Nonce: nonce, Proof: pki.Proof(code, pki.ProofMaster, nonce, bootSum[:], caSum[:])}, &reply)
	if err != nil {
		return "", err
	}
	if status != http.StatusOK {
		return "", pairError(status, e)
	}
	if !pki.CheckProof(reply.Proof, code, pki.ProofNode, nonce, reply.CSR) {
		return "", errdefs.Mark(errdefs.ErrForbidden, errors.New("pairing refused: the node did not prove it knows the pairing code"))
	}
	if !validNodeName(reply.Name) {
		return "", fmt.Errorf("%w: the node calls itself %q", errdefs.ErrBadInput, reply.Name)
	}
	// For serving its master and peers, and for dialling peers (its
	// ingress forwards to the node holding a sandbox).
	der, err := ca.SignCSRFor(reply.CSR, "node "+reply.Name, []string{host}, NodeCertLifetime, true, true)
	if err != nil {
		return "", err
	}
	status, e, err = ps.call("/node/v1/pair/finish", pairFinish{Cert: der, Proof: pki.Proof(code, pki.ProofFinish, nonce, der)}, nil)
	if err != nil {
		return "", err
	}
	if status != http.StatusNoContent {
		return "", pairError(status, e)
	}
	return reply.Name, nil
}

func pairError(status int, e api.Error) error {
	msg := e.Message
	if msg == "" {
		msg = fmt.Sprintf("HTTP %d", status)
	}
	switch status {
	case http.StatusForbidden, http.StatusTooManyRequests:
		return errdefs.Mark(errdefs.ErrForbidden, errors.New(msg))
	case http.StatusConflict:
		return errdefs.Mark(errdefs.ErrConflict, errors.New(msg))
	case http.StatusBadRequest:
		return errdefs.Mark(errdefs.ErrBadInput, errors.New(msg))
	}
	return errors.New(msg)
}

func validNodeName(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// Dial is a Client of the paired node name at address, as the master
// with CA ca: its client certificate, trusting only a server certificate
// ca signed for that node ("node <name>": another node's will not do),
// and that check, if set, does not refuse (a revoked one).
func Dial(name, address string, ca *pki.CA, check func(*x509.Certificate) error) (*remote.Client, error) {
	cfg, err := ca.PeerClientConfig(pki.MasterName)
	if err != nil {
		return nil, err
	}
	c := remote.NewClient(name, "https://"+address, nil, false, time.Time{})
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the node presented no certificate")
		}
		leaf := cs.PeerCertificates[0]
		if leaf.Subject.CommonName != "node "+name {
			return fmt.Errorf("the server at %s is %q, not node %s", address, leaf.Subject.CommonName, name)
		}
		if check != nil {
			if err := check(leaf); err != nil {
				return err
			}
		}
		// What the node presents, for Renew's timing.
		c.SetPeerNotAfter(leaf.NotAfter)
		return nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // the master reaches its nodes directly
	tr.TLSClientConfig = cfg
	c.HTTP = &http.Client{Transport: tr, Timeout: 10 * time.Minute}
	return c, nil
}
