// Package oidctest is a real OpenID Connect issuer for tests (issue 17:
// "tested against a real OIDC issuer you run in the test"): zitadel/oidc's
// provider (pkg/op) with its example in-memory storage, served over HTTPS
// on loopback, and a relying party that gets a real signed ID token from
// it by the authorization code flow (OpenID Connect Core 1.0 §3.1) — the
// authorize request, the user's login (the storage's own username and
// password check, what a login page calls), the callback's redirect with
// a code, and the code's exchange at the token endpoint.
//
// Only tests import it. It is not a stub: the tokens are signed with the
// issuer's RSA key and published in its JWKS, found by discovery.
package oidctest

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/op"
	"golang.org/x/oauth2"
)

// User is a user the issuer knows.
type User struct {
	ID, Username, Password, Email string
	EmailVerified                 bool
}

// Client is a relying party registered with the issuer.
type Client struct{ ID, Secret string }

// RedirectURI is every client's: the flow reads the code from the
// redirect the issuer answers and never dials it.
const RedirectURI = "http://127.0.0.1:9/callback"

// Issuer is a running issuer.
type Issuer struct {
	// URL is its issuer URL (https://127.0.0.1:port), CAPEM the PEM of the
	// certificate its HTTPS is checked against, HTTP a client trusting it.
	URL     string
	CAPEM   []byte
	HTTP    *http.Client
	store   *storage.Storage
	handler http.Handler
}

// Start runs an issuer with users and clients until the test ends.
func Start(t testing.TB, users []User, clients ...Client) *Issuer {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	iss := &Issuer{URL: srv.URL, HTTP: srv.Client(),
		CAPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})}
	iss.HTTP.Timeout = 10 * time.Second

	// The example user store reads its users from a file.
	us := map[string]storage.User{}
	for _, u := range users {
		us[u.ID] = storage.User{ID: u.ID, Username: u.Username, Password: u.Password, Email: u.Email, EmailVerified: u.EmailVerified}
	}
	b, _ := json.Marshal(us)
	path := filepath.Join(t.TempDir(), "users.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	ustore, err := storage.StoreFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cs := map[string]*storage.Client{}
	for _, c := range clients {
		cs[c.ID] = storage.WebClient(c.ID, c.Secret, RedirectURI)
	}
	iss.store = storage.NewStorageWithClients(ustore, cs)
	key := sha256.Sum256([]byte(t.Name()))
	// The issuer names itself by the host it is reached at (as a
	// multi-tenant issuer does): Alias is the same keys under another
	// issuer URL.
	provider, err := op.NewProvider(&op.Config{CryptoKey: key, CodeMethodS256: true}, claimsInIDToken{iss.store}, op.IssuerFromHost(""))
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = provider
	iss.handler = provider
	return iss
}

// Alias serves the same issuer — the same users, clients and signing
// keys — at https://[::1]:port, where it names itself by that URL: its
// ID tokens verify with the keys i publishes but say another "iss".
func (i *Issuer) Alias(t testing.TB) *Issuer {
	t.Helper()
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Fatalf("IPv6 loopback: %v", err)
	}
	srv := httptest.NewUnstartedServer(i.handler)
	srv.Listener.Close()
	srv.Listener = ln
	srv.StartTLS()
	t.Cleanup(srv.Close)
	a := *i
	a.URL = srv.URL
	return &a
}

// claimsInIDToken makes the issuer put the user's claims (email,
// email_verified) in the ID token itself, as issuers commonly do
// (Core §5.4 lets the claims go in either), rather than only at the
// userinfo endpoint: an ID token file is all a joining node has.
type claimsInIDToken struct{ *storage.Storage }

func (s claimsInIDToken) GetClientByClientID(ctx context.Context, id string) (op.Client, error) {
	c, err := s.Storage.GetClientByClientID(ctx, id)
	if err != nil {
		return nil, err
	}
	return assertClaims{c}, nil
}

type assertClaims struct{ op.Client }

func (assertClaims) IDTokenUserinfoClaimsAssertion() bool { return true }

// IDToken signs in as username for client by the authorization code flow
// and returns the ID token the token endpoint answers.
func (i *Issuer) IDToken(t testing.TB, client Client, username, password string) string {
	t.Helper()
	tok, err := i.idToken(client, username, password)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (i *Issuer) idToken(client Client, username, password string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := oauth2.Config{ClientID: client.ID, ClientSecret: client.Secret, RedirectURL: RedirectURI,
		Endpoint: oauth2.Endpoint{AuthURL: i.URL + "/authorize", TokenURL: i.URL + "/oauth/token", AuthStyle: oauth2.AuthStyleInHeader},
		Scopes:   []string{"openid", "email"}}
	noFollow := *i.HTTP
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	redirect := func(u string) (*url.URL, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		resp, err := noFollow.Do(req)
		if err != nil {
			return nil, err
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 3 {
			return nil, fmt.Errorf("GET %s: %s, want a redirect", u, resp.Status)
		}
		return resp.Location()
	}
	// 1. The authorize request: the issuer redirects to its login page
	// with the request's ID.
	login, err := redirect(cfg.AuthCodeURL("state-1", oauth2.SetAuthURLParam("nonce", "n-1")))
	if err != nil {
		return "", err
	}
	id := login.Query().Get("authRequestID")
	if id == "" {
		return "", fmt.Errorf("the authorize request redirected to %s, not a login", login)
	}
	// 2. The user logs in (what the login page does with the form).
	if err := i.store.CheckUsernamePassword(username, password, id); err != nil {
		return "", fmt.Errorf("login as %s: %w", username, err)
	}
	// 3. The callback redirects to the client with a code.
	back, err := redirect(i.URL + "/authorize/callback?id=" + url.QueryEscape(id))
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(back.String(), RedirectURI) || back.Query().Get("state") != "state-1" {
		return "", fmt.Errorf("the callback redirected to %s", back)
	}
	// 4. The code's exchange at the token endpoint.
	tok, err := cfg.Exchange(context.WithValue(ctx, oauth2.HTTPClient, i.HTTP), back.Query().Get("code"))
	if err != nil {
		return "", fmt.Errorf("exchange the code: %w", err)
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return "", fmt.Errorf("the token endpoint answered no id_token")
	}
	return raw, nil
}
