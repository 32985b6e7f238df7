package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/pki"
)

// serve is an HTTPS API on loopback answering with h, and a client that
// trusts its certificate (as TrustCA does a master's CA) with token "tok".
func serve(t *testing.T, h http.HandlerFunc) (*Client, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644)
	c := New(srv.URL, "tok")
	if err := c.TrustCA(ca); err != nil {
		t.Fatal(err)
	}
	return c, &hits
}

// TestErrorsRoundTrip: every kind the API answers with (errdefs.Table)
// comes back from the client as that kind, with its status and words.
func TestErrorsRoundTrip(t *testing.T) {
	for _, e := range errdefs.Table {
		sent := errdefs.Mark(e.Kind, errors.New("sandbox x: what happened"))
		c, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer tok" {
				t.Errorf("sent %q", r.Header.Get("Authorization"))
			}
			errdefs.WriteHTTP(w, sent)
		})
		_, err := c.Sandbox(context.Background(), "x")
		if !errors.Is(err, e.Kind) || StatusOf(err) != e.Status || !strings.Contains(err.Error(), "sandbox x: what happened") {
			t.Errorf("%s: the client got %v (status %d)", e.Code, err, StatusOf(err))
		}
		for _, other := range errdefs.Table {
			if other.Kind != e.Kind && errors.Is(err, other.Kind) && !errors.Is(e.Kind, other.Kind) {
				t.Errorf("%s also reads as %s", e.Code, other.Code)
			}
		}
	}
}

// TestNoTokenOverPlainHTTP: an http:// API is refused before anything is
// sent (the token would go in the clear), saying to use https.
func TestNoTokenOverPlainHTTP(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer srv.Close()
	_, err := New(srv.URL, "tok").Sandboxes(context.Background())
	if err == nil || !strings.Contains(err.Error(), "https://"+strings.TrimPrefix(srv.URL, "http://")) || hits.Load() != 0 {
		t.Errorf("plain http: %v, %d requests reached the server", err, hits.Load())
	}
}

// TestHints: what the client adds for a person — which token was refused
// and where it came from, that nothing answers, that the server's
// certificate is from another CA (the token is then not sent).
func TestHints(t *testing.T) {
	c, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrUnauthorized, "missing or wrong API token"))
	})
	c.TokenFrom = "/var/lib/x/pki/api-token"
	if _, err := c.Sandboxes(context.Background()); !errors.Is(err, errdefs.ErrUnauthorized) || !strings.Contains(err.Error(), "/var/lib/x/pki/api-token") {
		t.Errorf("401: %v", err)
	}

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	if _, err := New("https://"+addr, "tok").Sandboxes(context.Background()); err == nil || !strings.Contains(err.Error(), "no sandstormd answers") {
		t.Errorf("nothing listening: %v", err)
	}

	// A server whose certificate is from a CA of its own, which the client
	// does not trust.
	var hits atomic.Int64
	ca, err := pki.EnsureCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ca.ServerConfig([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	go http.Serve(tls.NewListener(tl, cfg), http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	mine, _ := serve(t, func(http.ResponseWriter, *http.Request) {})
	other := New("https://"+tl.Addr().String(), "tok")
	other.HTTP, other.CAFrom = mine.HTTP, mine.CAFrom
	_, err = other.Sandboxes(context.Background())
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) || !strings.Contains(err.Error(), "another CA") || hits.Load() != 0 {
		t.Errorf("another CA: %v (%d requests got through)", err, hits.Load())
	}
}

// TestClonePartial: a 207 (children made, then a failure) is an error,
// with what was made.
func TestClonePartial(t *testing.T) {
	c, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusMultiStatus)
		w.Write([]byte(`{"parent": {"id": "p"}, "children": [{"id": "c1", "name": "p-1"}], "error": "child 2 of 2: no room"}`))
	})
	res, err := c.Clone(context.Background(), "p", api.CloneRequest{Count: 2})
	if err == nil || !strings.Contains(err.Error(), "child 2 of 2") || len(res.Children) != 1 || res.Children[0].ID != "c1" {
		t.Errorf("a 207: %+v %v", res, err)
	}
}
