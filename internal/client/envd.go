package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/third_party/envd/filesystem/filesystemconnect"
	"sandstorm/third_party/envd/process/processconnect"
)

// EnvdUserHeader names the user an envd call acts as (internal/master).
const EnvdUserHeader = "X-Sandstorm-User"

// Envd is sandbox ref's envd (the E2B API for commands and files) through
// the master's API: the generated Connect clients of E2B's own services,
// and /files.
type Envd struct {
	Process    processconnect.ProcessClient
	Filesystem filesystemconnect.FilesystemClient
	c          *Client
	base       string
	http       *http.Client
}

// Envd returns the envd of sandbox ref, acting as user ("": the
// sandbox's default). Its calls have no overall timeout: a command
// streams as long as it runs, bounded by the caller's context.
func (c *Client) Envd(ref, user string) *Envd {
	base := c.Base + "/v1/sandboxes/" + url.PathEscape(ref) + "/envd"
	hc := &http.Client{Transport: &envdAuth{next: c.transport(), token: c.Token, user: user}}
	return &Envd{
		Process:    processconnect.NewProcessClient(hc, base),
		Filesystem: filesystemconnect.NewFilesystemClient(hc, base),
		c:          c, base: base, http: hc,
	}
}

func (c *Client) transport() http.RoundTripper {
	if c.HTTP != nil && c.HTTP.Transport != nil {
		return c.HTTP.Transport
	}
	return http.DefaultTransport
}

// envdAuth adds the API token and the acting user to every call.
type envdAuth struct {
	next        http.RoundTripper
	token, user string
}

func (a *envdAuth) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme == "http" {
		return nil, fmt.Errorf("the sandstormd API is HTTPS: use --api https://%s; nothing was sent", r.URL.Host)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+a.token)
	if a.user != "" {
		r.Header.Set(EnvdUserHeader, a.user)
	}
	return a.next.RoundTrip(r)
}

// Download streams the file at path in the sandbox.
func (e *Envd) Download(ctx context.Context, path string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.base+"/files?path="+url.QueryEscape(path), nil)
	if err != nil {
		return nil, err
	}
	resp, err := e.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, envdError(resp)
	}
	return resp.Body, nil
}

// Upload streams body to the file at path in the sandbox (made with its
// parents, replaced if it is there).
func (e *Envd) Upload(ctx context.Context, path string, body io.Reader) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.base+"/files?path="+url.QueryEscape(path), body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := e.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return envdError(resp)
	}
	io.Copy(io.Discard, resp.Body)
	return nil
}

// envdError reads an error answer: the master's (api.Error, its code) or
// envd's own ({"code": status, "message"}).
func envdError(resp *http.Response) error {
	var body struct {
		Code    json.RawMessage `json:"code"`
		Message string          `json:"message"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, &body) != nil || body.Message == "" {
		body.Message = strings.TrimSpace(string(b))
	}
	e := api.Error{Message: body.Message}
	json.Unmarshal(body.Code, &e.Code) // a string for the master's; envd's is its status
	return errdefs.FromWire(resp.StatusCode, e)
}

// CreateAPIKey makes an API key for team; the answer holds the key, which
// is shown this once.
func (c *Client) CreateAPIKey(ctx context.Context, team string) (api.APIKey, error) {
	var k api.APIKey
	err := c.Do(ctx, http.MethodPost, "/v1/api-keys", api.APIKeyRequest{Team: team}, &k)
	return k, err
}

// PutSecret stores a secret for the caller's team (its value is never
// answered back).
func (c *Client) PutSecret(ctx context.Context, req api.SecretRequest) (api.Secret, error) {
	var s api.Secret
	err := c.Do(ctx, http.MethodPost, "/v1/secrets", req, &s)
	return s, err
}

// Secrets lists the caller's team's secrets, without values.
func (c *Client) Secrets(ctx context.Context) ([]api.Secret, error) {
	var l api.List[api.Secret]
	err := c.Do(ctx, http.MethodGet, "/v1/secrets", nil, &l)
	return l.Items, err
}

// DeleteSecret removes the caller's team's secret name.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.Do(ctx, http.MethodDelete, "/v1/secrets/"+url.PathEscape(name), nil, nil)
}

// APIKeys lists the API keys (never the keys themselves).
func (c *Client) APIKeys(ctx context.Context) ([]api.APIKey, error) {
	var l api.List[api.APIKey]
	err := c.Do(ctx, http.MethodGet, "/v1/api-keys", nil, &l)
	return l.Items, err
}

// DeleteAPIKey revokes API key id.
func (c *Client) DeleteAPIKey(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodDelete, "/v1/api-keys/"+url.PathEscape(id), nil, nil)
}
