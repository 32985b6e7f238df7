package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/pki"
	"sandstorm/internal/sam/meshcred"
	"sandstorm/internal/secretfile"
	"sandstorm/internal/store"
)

// Options are sam-control-plane serve's.
type Options struct {
	// DataDir holds the store (unless Store names PostgreSQL), the
	// issuer's keys, the admin token (both mode 0600) and the CA the
	// API's HTTPS certificate is from (pki/).
	DataDir string
	// Store is where the rows are: "" for SQLite in DataDir, or a
	// postgres:// URL.
	Store string
	// Listen is the API's address (HTTPS).
	Listen string
	// AlsoListen are more addresses the same API is served on, each
	// named in its certificate too: a machine that members on different
	// networks reach at different addresses (sandstormd fleet up --hosts)
	// serves on exactly those, not on every address it has.
	AlsoListen []string
	// Name is the control plane's name (default "sam").
	Name string
	// OIDC, if its Issuer is set, lets nodes enrol with an ID token of
	// that issuer (OIDCCAFile: a PEM file of the CA its HTTPS is checked
	// against; none: the system's roots).
	OIDC       OIDCConfig
	OIDCCAFile string
	Log        *slog.Logger
	// Refused, Issued and Reported, if set, are Config's hooks (sam-one's
	// console).
	Refused  func(Refusal)
	Issued   func(member string, expires time.Time)
	Reported func(member string, rep api.RefusalReport)
}

// The files in a control plane's data dir.
const (
	IssuerKeysFile = "issuer-keys.json"
	AdminTokenFile = "admin-token"
)

// Serve runs the control plane until ctx ends. ready, if not nil, is
// called with the address it listens on once it does.
func Serve(ctx context.Context, o Options, ready func(addr string)) error {
	op, err := Open(o)
	if err != nil {
		return err
	}
	defer op.Close()
	return op.Serve(ctx, nil, ready)
}

// Opened is a control plane opened from its data dir and listening, but
// not yet serving: Serve serves its API; sam-one (internal/sam/samone) serves
// it beside its console and runs a router with its Server.
type Opened struct {
	Server   *Server
	Store    *store.Store
	Listener net.Listener
	// Also are the listeners of Options.AlsoListen.
	Also       []net.Listener
	TLS        *tls.Config
	AdminToken string
	Log        *slog.Logger
	name       string
	dataDir    string
}

// Open opens the control plane of o.DataDir (its store, keys, admin
// token and CA, each made on the first start) and listens on o.Listen.
func Open(o Options) (op *Opened, err error) {
	if o.Name == "" {
		o.Name = "sam"
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return nil, err
	}
	st, err := store.OpenIn(o.DataDir, o.Store)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			st.Close()
		}
	}()
	iss, err := issuer(o.DataDir, o.Name)
	if err != nil {
		return nil, err
	}
	admin, err := secretfile.Ensure(filepath.Join(o.DataDir, AdminTokenFile))
	if err != nil {
		return nil, err
	}
	ca, err := pki.EnsureCA(filepath.Join(o.DataDir, "pki"))
	if err != nil {
		return nil, err
	}
	var hosts []string
	for _, l := range append([]string{o.Listen}, o.AlsoListen...) {
		host, _, err := net.SplitHostPort(l)
		if err != nil {
			return nil, fmt.Errorf("--listen %q: %w", l, err)
		}
		hosts = append(hosts, host)
	}
	tlsCfg, err := ca.ServerConfig(hosts)
	if err != nil {
		return nil, err
	}
	cfg := Config{Name: o.Name, Store: st, Issuer: iss, AdminToken: admin, Log: o.Log,
		SaveKeys: func(b []byte) error { return secretfile.Write(filepath.Join(o.DataDir, IssuerKeysFile), b) },
		Refused:  o.Refused, Issued: o.Issued, Reported: o.Reported}
	if o.OIDC.Issuer != "" {
		oc, err := oidcConfig(o)
		if err != nil {
			return nil, err
		}
		cfg.OIDC = &oc
		if len(oc.AllowEmails)+len(oc.AllowSubjects) == 0 {
			o.Log.Warn("OIDC enrolment configured with no allow rule: nobody enrols by OIDC (--oidc-allow-email, --oidc-allow-subject)", "issuer", oc.Issuer)
		}
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return nil, err
	}
	var also []net.Listener
	for _, l := range o.AlsoListen {
		al, err := net.Listen("tcp", l)
		if err != nil {
			ln.Close()
			for _, a := range also {
				a.Close()
			}
			return nil, err
		}
		also = append(also, al)
	}
	return &Opened{Server: New(cfg), Store: st, Listener: ln, Also: also, TLS: tlsCfg, AdminToken: admin, Log: o.Log, name: o.Name, dataDir: o.DataDir}, nil
}

// Serve serves h (nil: the control plane's API) over HTTPS on the
// listener until ctx ends. ready, if not nil, is called with the
// address once it serves.
func (op *Opened) Serve(ctx context.Context, h http.Handler, ready func(addr string)) error {
	if h == nil {
		h = op.Server.Handler()
	}
	srv := &http.Server{Handler: h, TLSConfig: op.TLS, ReadHeaderTimeout: 10 * time.Second}
	apis := []string{"https://" + op.Listener.Addr().String()}
	for _, a := range op.Also {
		apis = append(apis, "https://"+a.Addr().String())
	}
	op.Log.Info("control plane serving", "name", op.name, "api", strings.Join(apis, " "), "ca", filepath.Join(op.dataDir, "pki", pki.CAFile),
		"admin_token_file", filepath.Join(op.dataDir, AdminTokenFile), "store", op.Store.Dialect())
	if ready != nil {
		ready(op.Listener.Addr().String())
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	// One server on every listener: the first that fails ends them all.
	lns := append([]net.Listener{op.Listener}, op.Also...)
	errc := make(chan error, len(lns))
	for _, ln := range lns {
		go func() { errc <- srv.ServeTLS(ln, "", "") }()
	}
	var first error
	for range lns {
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) && first == nil {
			first = err
			srv.Close()
		}
	}
	return first
}

// Close closes the store and the listener (if Serve did not).
func (op *Opened) Close() error {
	op.Listener.Close()
	for _, l := range op.Also {
		l.Close()
	}
	return op.Store.Close()
}

// oidcConfig completes o.OIDC: an HTTPS client that trusts --oidc-ca
// (or the system's roots), with a deadline.
func oidcConfig(o Options) (OIDCConfig, error) {
	oc := o.OIDC
	u, err := url.Parse(oc.Issuer)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return oc, fmt.Errorf("--oidc-issuer %q: want an https:// URL", oc.Issuer)
	}
	if oc.ClientID == "" {
		return oc, errors.New("--oidc-issuer needs --oidc-client-id: the audience its ID tokens must be for")
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.OIDCCAFile != "" {
		b, err := os.ReadFile(o.OIDCCAFile)
		if err != nil {
			return oc, fmt.Errorf("--oidc-ca: %w", err)
		}
		tlsCfg.RootCAs = x509.NewCertPool()
		if !tlsCfg.RootCAs.AppendCertsFromPEM(b) {
			return oc, fmt.Errorf("--oidc-ca %s: no PEM certificate", o.OIDCCAFile)
		}
	}
	oc.HTTP = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	return oc, nil
}

// issuer loads the issuer's keys from dataDir, or makes them on the first
// start, so that a restart keeps every credential good.
func issuer(dataDir, name string) (*meshcred.Issuer, error) {
	path := filepath.Join(dataDir, IssuerKeysFile)
	if b, err := os.ReadFile(path); err == nil {
		os.Chmod(path, 0o600)
		return meshcred.LoadIssuer(name, b)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	iss, err := meshcred.NewIssuer(name)
	if err != nil {
		return nil, err
	}
	b, err := iss.MarshalKeys()
	if err != nil {
		return nil, err
	}
	return iss, secretfile.Write(path, b)
}
