package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"sandstorm/internal/meshcred"
	"sandstorm/internal/pki"
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
	// Name is the control plane's name (default "sam").
	Name string
	Log  *slog.Logger
}

// The files in a control plane's data dir.
const (
	IssuerKeysFile = "issuer-keys.json"
	AdminTokenFile = "admin-token"
)

// Serve runs the control plane until ctx ends. ready, if not nil, is
// called with the address it listens on once it does.
func Serve(ctx context.Context, o Options, ready func(addr string)) error {
	if o.Name == "" {
		o.Name = "sam"
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return err
	}
	st, err := store.OpenIn(o.DataDir, o.Store)
	if err != nil {
		return err
	}
	defer st.Close()
	iss, err := issuer(o.DataDir, o.Name)
	if err != nil {
		return err
	}
	admin, err := secretfile.Ensure(filepath.Join(o.DataDir, AdminTokenFile))
	if err != nil {
		return err
	}
	ca, err := pki.EnsureCA(filepath.Join(o.DataDir, "pki"))
	if err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(o.Listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", o.Listen, err)
	}
	tlsCfg, err := ca.ServerConfig([]string{host})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: New(Config{Name: o.Name, Store: st, Issuer: iss, AdminToken: admin, Log: o.Log}).Handler(),
		TLSConfig: tlsCfg, ReadHeaderTimeout: 10 * time.Second}
	o.Log.Info("control plane serving", "name", o.Name, "api", "https://"+ln.Addr().String(), "ca", filepath.Join(o.DataDir, "pki", pki.CAFile),
		"admin_token_file", filepath.Join(o.DataDir, AdminTokenFile), "store", st.Dialect())
	if ready != nil {
		ready(ln.Addr().String())
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.ServeTLS(ln, "", ""); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
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
