package enrol

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"sandstorm/api"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/nodeapi/remote"
	"sandstorm/internal/pki"
)

// A node behind NAT (issue 9: "a node behind NAT instead dials the master
// (--join https://master:8080 --ca-fingerprint … --join-token …) and keeps
// that connection; the master's calls ride that connection"). The node:
//
//  1. fetches the master's CA (GET /v1/ca) and accepts it only if its
//     SHA-256 is the fingerprint it was given — from then on it checks the
//     master's certificate against it;
//  2. joins (POST /v1/nodes/join {token, name, csr}): the join token, made
//     by the master's operator and good once, is what lets it in; the
//     master signs its key;
//  3. dials GET /v1/nodes/tunnel with its certificate and an Upgrade, and
//     on the 101 runs a yamux session (hashicorp/yamux) over the TLS
//     connection, serving the seam (Server) on the streams the master
//     opens. It dials again whenever the connection ends.
//
// The master's side is TunnelClient: a Client whose connections are
// streams of the node's session.

// TunnelUpgrade is the Upgrade token of the tunnel.
const TunnelUpgrade = "sandstorm-tunnel"

// TunnelALPN is the ALPN protocol a node's tunnel connection offers: the
// master asks only such connections for a client certificate.
const TunnelALPN = "sandstorm-tunnel/1"

// JoinRequest is POST /v1/nodes/join.
type JoinRequest struct {
	Token string `json:"token"`
	Name  string `json:"name"`
	CSR   []byte `json:"csr"`
}

// JoinReply is its answer.
type JoinReply struct {
	Cert []byte `json:"cert"` // DER
}

// Joiner is a node that dials its master.
type Joiner struct {
	Name        string
	Master      string // https://host:port
	Fingerprint string // the master's CA, SHA-256 hex
	Token       string // the join token (needed only the first time)
	PKIDir      string
	Node        nodeapi.Node
	Log         *slog.Logger

	renew renewal
}

// Join makes sure the node has its certificate, joining if it has none.
func (j *Joiner) Join(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(j.PKIDir, nodeCertFile)); err == nil {
		return nil
	}
	if j.Token == "" || j.Fingerprint == "" {
		return errors.New("this node has not joined yet: give --join-token and --ca-fingerprint (both from the master: POST /v1/nodes/join-tokens)")
	}
	caPEM, err := fetchCA(ctx, j.Master, j.Fingerprint)
	if err != nil {
		return err
	}
	csr, keyPEM, err := pki.NewCSR("node " + j.Name)
	if err != nil {
		return err
	}
	hc := j.httpClient(caPEM, nil)
	b, _ := json.Marshal(JoinRequest{Token: j.Token, Name: j.Name, CSR: csr})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, j.Master+"/v1/nodes/join", strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("join %s: %w", j.Master, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		var e api.Error
		json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e)
		return fmt.Errorf("join %s refused (HTTP %d): %s", j.Master, resp.StatusCode, e.Message)
	}
	var reply JoinReply
	if err := json.NewDecoder(resp.Body).Decode(&reply); err != nil {
		return err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: reply.Cert})
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return fmt.Errorf("the master's certificate for this node: %w", err)
	}
	if err := writePKI(j.PKIDir, pkiFile{nodeKeyFile, keyPEM, 0o600}, pkiFile{nodeCertFile, certPEM, 0o644}, pkiFile{nodeCAFile, caPEM, 0o644}); err != nil {
		return err
	}
	j.Log.Info("joined the master", "master", j.Master)
	return nil
}

// fetchCA gets the master's CA and checks it against fingerprint.
func fetchCA(ctx context.Context, master, fingerprint string) ([]byte, error) {
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil,
		// Checked below, by the fingerprint: until then nothing is trusted.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, master+"/v1/ca", nil)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch the master's CA from %s: %w", master, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	block, _ := pem.Decode(b)
	if resp.StatusCode != http.StatusOK || block == nil {
		return nil, fmt.Errorf("fetch the master's CA from %s: HTTP %d", master, resp.StatusCode)
	}
	sum := sha256.Sum256(block.Bytes)
	if !strings.EqualFold(hex.EncodeToString(sum[:]), strings.ReplaceAll(fingerprint, ":", "")) {
		return nil, fmt.Errorf("the CA at %s has fingerprint %s, not the %s this node was given: refusing to join", master, hex.EncodeToString(sum[:]), fingerprint)
	}
	return b, nil
}

func (j *Joiner) httpClient(caPEM []byte, cert *tls.Certificate) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil, TLSClientConfig: cfg}}
}

// Run keeps the tunnel to the master up until ctx ends, dialling again a
// second after it drops.
func (j *Joiner) Run(ctx context.Context) {
	for ctx.Err() == nil {
		err := j.tunnel(ctx)
		if ctx.Err() != nil {
			return
		}
		j.Log.Warn("tunnel to the master down; dialling again", "master", j.Master, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (j *Joiner) tunnel(ctx context.Context) error {
	caPEM, err := os.ReadFile(filepath.Join(j.PKIDir, nodeCAFile))
	if err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(j.PKIDir, nodeCertFile), filepath.Join(j.PKIDir, nodeKeyFile))
	if err != nil {
		return err
	}
	u, err := url.Parse(j.Master)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 15 * time.Second},
		Config: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: u.Hostname(), MinVersion: tls.VersionTLS12,
			NextProtos: []string{TunnelALPN}}}
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return err
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /v1/nodes/tunnel HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\n%s: %s\r\n\r\n", u.Host, TunnelUpgrade, NodeHeader, j.Name)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		var e api.Error
		json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e)
		return fmt.Errorf("the master refused the tunnel (HTTP %d): %s", resp.StatusCode, e.Message)
	}
	sess, err := yamux.Server(&bufConn{Conn: conn, r: br}, yamuxConfig())
	if err != nil {
		return err
	}
	defer sess.Close()
	j.Log.Info("tunnel to the master up", "master", j.Master)
	srv := &http.Server{Handler: j.handler(), ReadHeaderTimeout: 30 * time.Second}
	go func() {
		<-ctx.Done()
		sess.Close()
	}()
	return srv.Serve(sess)
}

// handler is what the node serves on its tunnel: the seam, and the
// renewal of its certificate (the master asks for a CSR, then sends the
// certificate; the next tunnel presents it).
func (j *Joiner) handler() http.Handler {
	seam := remote.Server(j.Node)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/node/v1/renew":
			j.renew.serveCSR(w, j.Name)
		case "/node/v1/cert":
			// A client certificate: the next tunnel presents it.
			if _, leaf, ok := j.renew.serveCert(w, r, j.PKIDir, x509.ExtKeyUsageClientAuth); ok {
				j.Log.Info("certificate renewed by the master; the next tunnel presents it", "until", leaf.NotAfter)
				w.WriteHeader(http.StatusNoContent)
			}
		default:
			seam.ServeHTTP(w, r)
		}
	})
}

// bufConn is a connection whose first bytes were read into r.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func yamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = io.Discard
	c.KeepAliveInterval = 5 * time.Second // a dead tunnel is found in seconds
	c.ConnectionWriteTimeout = 10 * time.Second
	return c
}

// TunnelSession is the master's end of a tunnel: conn, hijacked after the
// 101, becomes the session over which c's requests ride.
func TunnelSession(conn net.Conn) (*yamux.Session, error) {
	return yamux.Client(conn, yamuxConfig())
}

// TunnelClient is a Client of the node behind sess, whose certificate
// (the one its tunnel presented) ends at notAfter.
func TunnelClient(name string, sess *yamux.Session, notAfter time.Time) *remote.Client {
	tr := &http.Transport{Proxy: nil, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return sess.Open()
	}, MaxIdleConnsPerHost: 16}
	return remote.NewClient(name, "http://"+name, &http.Client{Transport: tr, Timeout: 10 * time.Minute}, true, notAfter)
}

// NewJoinToken is a random join token and the hash the master keeps of it.
func NewJoinToken() (token, hash string) {
	var b [24]byte
	rand.Read(b[:])
	token = hex.EncodeToString(b[:])
	return token, JoinTokenHash(token)
}

// JoinTokenHash is what the master stores of a join token.
func JoinTokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// NoTunnel is a Client of a node that dials in but has not yet: every
// call fails as the node being down.
func NoTunnel(name string) *remote.Client {
	tr := &http.Transport{Proxy: nil, DialContext: func(context.Context, string, string) (net.Conn, error) {
		return nil, fmt.Errorf("node %s has no tunnel to this master (it dials in, and has not, or it dropped)", name)
	}}
	return &remote.Client{NodeName: name, Base: "http://" + name, HTTP: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// TunnelNextProto is the http.Server.TLSNextProto entry for TunnelALPN:
// net/http hands a connection that negotiated it here (it would close it
// otherwise), and it is served as HTTP/1.1 by h — its one request, the
// tunnel's upgrade, takes the connection over.
func TunnelNextProto() map[string]func(*http.Server, *tls.Conn, http.Handler) {
	return map[string]func(*http.Server, *tls.Conn, http.Handler){
		TunnelALPN: func(s *http.Server, c *tls.Conn, h http.Handler) {
			one := &http.Server{Handler: h, ReadHeaderTimeout: s.ReadHeaderTimeout, ErrorLog: s.ErrorLog}
			one.Serve(&oneConn{c: c, done: make(chan struct{})})
		},
	}
}

// oneConn is a listener that accepts c once, then blocks until c closes.
type oneConn struct {
	c    net.Conn
	used bool
	done chan struct{}
}

func (l *oneConn) Accept() (net.Conn, error) {
	if !l.used {
		l.used = true
		return &closeNotify{Conn: l.c, done: l.done}, nil
	}
	<-l.done
	return nil, net.ErrClosed
}
func (l *oneConn) Close() error   { return nil }
func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }

// closeNotify tells its listener when the connection closes.
type closeNotify struct {
	net.Conn
	done chan struct{}
	once sync.Once
}

func (c *closeNotify) Close() error {
	c.once.Do(func() { close(c.done) })
	return c.Conn.Close()
}
