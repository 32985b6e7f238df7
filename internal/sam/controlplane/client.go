package controlplane

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/httpjson"
	"sandstorm/internal/sam/meshcred"
)

// Client is a member's (or the operator's) client of a control plane.
type Client struct {
	// Base is the control plane's URL; Name its name (the audience of the
	// challenges a member signs).
	Base, Name string
	HTTP       *http.Client
	// AdminToken, for the operator's calls.
	AdminToken string
}

// defaultHTTP bounds every call of a Client given no HTTP client: a
// control plane that stops answering mid-call must not hang its member.
var defaultHTTP = &http.Client{Timeout: 30 * time.Second}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	req, err := api.NewJSONRequest(ctx, method, strings.TrimRight(c.Base, "/")+path, body)
	if err != nil {
		return err
	}
	_, err = c.send(req, out)
	return err
}

// raw sends body as it is (of type ctype), with the headers h, and
// decodes a 2xx answer's JSON into out; a 304 is answered as its status
// with out untouched.
func (c *Client) raw(ctx context.Context, method, path, ctype string, body []byte, h http.Header, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.Base, "/")+path, rd)
	if err != nil {
		return 0, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	return c.send(req, out)
}

func (c *Client) send(req *http.Request, out any) (int, error) {
	if c.AdminToken != "" && req.Header.Get("Authorization") == "" {
		req.Header.Set("Authorization", "Bearer "+c.AdminToken)
	}
	hc := c.HTTP
	if hc == nil {
		hc = defaultHTTP
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("%w (is sam-control-plane serve running at %s, and is that its listen address?)", err, c.Base))
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotModified {
		return resp.StatusCode, nil
	}
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, errdefs.FromWire(resp.StatusCode, httpjson.ErrorBody(resp))
	}
	// A policy document may be up to a MiB, and JSON-escaped a little more.
	return resp.StatusCode, httpjson.ReadAnswer(resp, out, 4<<20)
}

// signed asks for a challenge and signs it with priv for this control
// plane.
func (c *Client) signed(ctx context.Context, priv ed25519.PrivateKey) (challenge, sig string, err error) {
	var ch api.Challenge
	if err := c.do(ctx, http.MethodPost, "/v1/challenge", nil, &ch); err != nil {
		return "", "", err
	}
	return ch.Challenge, base64.StdEncoding.EncodeToString(meshcred.SignChallenge(priv, ch.Challenge, c.Name)), nil
}

// Enrol enrols member with its key priv and a bootstrap token.
func (c *Client) Enrol(ctx context.Context, token, member string, priv ed25519.PrivateKey) (api.Credential, error) {
	return c.enrol(ctx, api.EnrolRequest{Token: token, Name: member}, priv)
}

// EnrolOIDC enrols member with its key priv and an OpenID Connect ID
// token of the control plane's issuer, instead of a bootstrap token.
func (c *Client) EnrolOIDC(ctx context.Context, idToken, member string, priv ed25519.PrivateKey) (api.Credential, error) {
	return c.enrol(ctx, api.EnrolRequest{OIDCToken: idToken, Name: member}, priv)
}

// enrol sends req, which names the member and what vouches for it, with
// priv's public key and its signature of a fresh challenge.
func (c *Client) enrol(ctx context.Context, req api.EnrolRequest, priv ed25519.PrivateKey) (api.Credential, error) {
	ch, sig, err := c.signed(ctx, priv)
	if err != nil {
		return api.Credential{}, err
	}
	req.PublicKey = base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey))
	req.Challenge, req.Signature = ch, sig
	var out api.Credential
	err = c.do(ctx, http.MethodPost, "/v1/enrol", req, &out)
	return out, err
}

// Refresh renews member's credential, proving again it holds priv.
func (c *Client) Refresh(ctx context.Context, member string, priv ed25519.PrivateKey) (api.Credential, error) {
	ch, sig, err := c.signed(ctx, priv)
	if err != nil {
		return api.Credential{}, err
	}
	var out api.Credential
	err = c.do(ctx, http.MethodPost, "/v1/refresh", api.RefreshRequest{Name: member, Challenge: ch, Signature: sig}, &out)
	return out, err
}

// Keys fetches the keys and revocations members check credentials with.
func (c *Client) Keys(ctx context.Context) (api.MeshKeys, error) {
	var out api.MeshKeys
	err := c.do(ctx, http.MethodGet, "/v1/keys", nil, &out)
	return out, err
}

// CreateToken makes a bootstrap token (operator).
func (c *Client) CreateToken(ctx context.Context, req api.MeshTokenRequest) (api.MeshToken, error) {
	var out api.MeshToken
	err := c.do(ctx, http.MethodPost, "/v1/tokens", req, &out)
	return out, err
}

// Members lists the members (operator).
func (c *Client) Members(ctx context.Context) ([]api.MeshMember, error) {
	var out api.List[api.MeshMember]
	err := c.do(ctx, http.MethodGet, "/v1/members", nil, &out)
	return out.Items, err
}

// Revoke revokes member (operator).
func (c *Client) Revoke(ctx context.Context, member string) error {
	return c.do(ctx, http.MethodPost, "/v1/members/"+url.PathEscape(member)+"/revoke", nil, nil)
}
