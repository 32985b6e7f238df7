// Package client is a Go client of the sandstormd HTTP API, used by the CLI,
// the benchmarks and the end-to-end tests.
package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/httpjson"
)

// Client talks to one sandstormd.
type Client struct {
	// Base is the API URL, e.g. "https://127.0.0.1:8080".
	Base  string
	Token string
	HTTP  *http.Client
	// TokenFrom says where Token came from ("SANDSTORM_TOKEN", or the
	// token file read), so that a 401 can tell a person which token was
	// wrong and how to pick another.
	TokenFrom string
	// CAFrom is the CA file the client trusts for HTTPS (TrustCA).
	CAFrom string
}

// New returns a client for base with token.
func New(base, token string) *Client {
	return &Client{Base: strings.TrimRight(base, "/"), Token: token, HTTP: &http.Client{Timeout: 5 * time.Minute}}
}

// CAFile is where a master keeps its CA certificate: what a client on its
// machine trusts the API by.
func CAFile(dataDir string) string { return filepath.Join(dataDir, "pki", "ca.pem") }

// TrustCA makes the client trust only the CA certificate(s) in the PEM
// file at path for the API's HTTPS (not the system's roots: the master's
// certificate is from its own CA).
func (c *Client) TrustCA(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read the master's CA: %w (the master writes it to <data-dir>/pki/ca.pem at first start; pass --ca FILE or SANDSTORM_CA for another)", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return fmt.Errorf("%s holds no PEM certificate", path)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	c.HTTP.Transport = tr
	c.CAFrom = path
	return nil
}

// ForDataDir is a client of the master at base whose data dir is dataDir
// on this machine: its API token, and for HTTPS its CA.
func ForDataDir(base, dataDir string) (*Client, error) {
	tok, err := ReadToken(dataDir)
	if err != nil {
		return nil, err
	}
	c := New(base, tok)
	if strings.HasPrefix(base, "https://") {
		if err := c.TrustCA(CAFile(dataDir)); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// ReadToken reads the API token from <dataDir>/pki/api-token.
func ReadToken(dataDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "pki", "api-token"))
	if err != nil {
		return "", fmt.Errorf("read API token: %w (is sandstormd running with --data-dir %s? or set SANDSTORM_TOKEN)", err, dataDir)
	}
	return strings.TrimSpace(string(b)), nil
}

// Error is an API error response.
type Error struct {
	Status int
	Body   api.Error
	// RetryAfter is the answer's Retry-After (a 503's), 0 if none.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	// The node's messages start with their sentinel ("conflict: …"), which
	// the code already says.
	msg := strings.TrimPrefix(e.Body.Message, e.Body.Code+": ")
	return fmt.Sprintf("%s (HTTP %d): %s", e.Body.Code, e.Status, msg)
}

// Unwrap is the error's kind (errdefs.FromWire): errors.Is(err,
// errdefs.ErrNotFound) holds for a 404 not_found, and so on for every
// kind in errdefs.Table.
func (e *Error) Unwrap() error { return errdefs.FromWire(e.Status, e.Body) }

// RetryAfterOf is how long a 503 says to wait before trying again (its
// Retry-After; a second if it does not say), and whether err is a 503.
func RetryAfterOf(err error) (time.Duration, bool) {
	var e *Error
	if errors.As(err, &e) && e.Status == http.StatusServiceUnavailable {
		return e.RetryAfter, true
	}
	return 0, false
}

// StatusOf returns the HTTP status of an API error, or 0.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// Do sends a request with a JSON body (nil for none) and decodes a JSON
// answer into out (nil to discard).
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
	req, err := api.NewJSONRequest(ctx, method, c.Base+path, body)
	if err != nil {
		return err
	}
	return c.send(req, out)
}

func (c *Client) send(req *http.Request, out any) error {
	if req.URL.Scheme == "http" {
		// The API is HTTPS only; a plain request would carry the token in
		// the clear and get only Go's "Client sent an HTTP request to an
		// HTTPS server" back.
		return fmt.Errorf("the sandstormd API is HTTPS: use --api https://%s (or SANDSTORM_API=https://%s); nothing was sent", req.URL.Host, req.URL.Host)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		var unknown x509.UnknownAuthorityError
		if errors.As(err, &unknown) {
			// The token was not sent to a server that could not prove it
			// is the master: say which CA was expected.
			return fmt.Errorf("%w: the API at %s has a certificate from another CA than %s; point --data-dir at that master's data dir, or pass --ca / SANDSTORM_CA with its pki/ca.pem", err, c.Base, c.CAFrom)
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("%w: no sandstormd answers at %s; start one ('sandstormd serve --master --node'), or point --api / SANDSTORM_API (and SANDSTORM_DATA_DIR) at your master: 'fleet up' prints both", err, c.Base)
		}
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		e := &Error{Status: resp.StatusCode}
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs >= 0 {
			e.RetryAfter = time.Duration(secs) * time.Second
		} else if resp.StatusCode == http.StatusServiceUnavailable {
			e.RetryAfter = time.Second // a 503 that does not say: a second
		}
		if e.Body = httpjson.ErrorBody(resp); e.Body.Code == "" {
			e.Body.Code = "http"
		}
		if resp.StatusCode == http.StatusUnauthorized && c.TokenFrom != "" {
			e.Body.Message += fmt.Sprintf("; this client's token came from %s and %s does not accept it: point --data-dir (or SANDSTORM_DATA_DIR) at that daemon's data dir, or set SANDSTORM_TOKEN to the contents of its pki/api-token", c.TokenFrom, c.Base)
		}
		return e
	}
	return httpjson.ReadAnswer(resp, out, 0)
}

// CreateTemplate registers a template from a directory on the node.
func (c *Client) CreateTemplate(ctx context.Context, req api.TemplateRequest) (api.Template, error) {
	var t api.Template
	err := c.Do(ctx, http.MethodPost, "/v1/templates", req, &t)
	return t, err
}

// UploadTemplate registers a template from a rootfs tarball (plain or gzip)
// read from tarball, streamed as multipart.
func (c *Client) UploadTemplate(ctx context.Context, req api.TemplateRequest, tarball io.Reader) (api.Template, error) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		err := func() error {
			fw, err := mw.CreateFormField("template")
			if err != nil {
				return err
			}
			if err := json.NewEncoder(fw).Encode(req); err != nil {
				return err
			}
			ff, err := mw.CreateFormFile("rootfs", "rootfs.tar")
			if err != nil {
				return err
			}
			if _, err := io.Copy(ff, tarball); err != nil {
				return err
			}
			return mw.Close()
		}()
		pw.CloseWithError(err)
	}()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.Base+"/v1/templates", pr)
	if err != nil {
		return api.Template{}, err
	}
	hr.Header.Set("Content-Type", mw.FormDataContentType())
	var t api.Template
	err = c.send(hr, &t)
	return t, err
}

// Template returns the template called name.
func (c *Client) Template(ctx context.Context, name string) (api.Template, error) {
	var t api.Template
	err := c.Do(ctx, http.MethodGet, "/v1/templates/"+url.PathEscape(name), nil, &t)
	return t, err
}

// Templates lists templates.
func (c *Client) Templates(ctx context.Context) ([]api.Template, error) {
	var l api.List[api.Template]
	err := c.Do(ctx, http.MethodGet, "/v1/templates", nil, &l)
	return l.Items, err
}

// DeleteTemplate removes a template.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	return c.Do(ctx, http.MethodDelete, "/v1/templates/"+url.PathEscape(name), nil, nil)
}

// CreateSandbox starts a sandbox from a template; it returns hot.
func (c *Client) CreateSandbox(ctx context.Context, req api.SandboxRequest) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.Do(ctx, http.MethodPost, "/v1/sandboxes", req, &sb)
	return sb, err
}

// Sandbox returns one sandbox by ID or name.
func (c *Client) Sandbox(ctx context.Context, ref string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.Do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(ref), nil, &sb)
	return sb, err
}

// Usage is what sandbox ref uses now, as its node measures it.
func (c *Client) Usage(ctx context.Context, ref string) (api.Usage, error) {
	var u api.Usage
	err := c.Do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(ref)+"/usage", nil, &u)
	return u, err
}

// SetNetwork replaces sandbox ref's egress rules (empty: none).
func (c *Client) SetNetwork(ctx context.Context, ref string, e api.Egress) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.Do(ctx, http.MethodPut, "/v1/sandboxes/"+url.PathEscape(ref)+"/network", e, &sb)
	return sb, err
}

// Sandboxes lists sandboxes; with labels ("key=value"), those that carry
// every one.
func (c *Client) Sandboxes(ctx context.Context, labels ...string) ([]api.Sandbox, error) {
	var l api.List[api.Sandbox]
	q := url.Values{"label": labels}
	path := "/v1/sandboxes"
	if len(labels) > 0 {
		path += "?" + q.Encode()
	}
	err := c.Do(ctx, http.MethodGet, path, nil, &l)
	return l.Items, err
}

// DeleteSandbox removes a sandbox and everything it had.
func (c *Client) DeleteSandbox(ctx context.Context, ref string) error {
	return c.Do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(ref), nil, nil)
}

// Transition runs op (freeze, snapshot, detach or wake) on a sandbox.
func (c *Client) Transition(ctx context.Context, ref, op string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.Do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/"+op, nil, &sb)
	return sb, err
}

// Pause pauses sandbox ref until a Resume (POST /v1/sandboxes/{id}/pause):
// with its memory, or, memory false, its files only.
func (c *Client) Pause(ctx context.Context, ref string, memory bool) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.Do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/pause", api.PauseRequest{Memory: &memory}, &sb)
	return sb, err
}

// Resume ends sandbox ref's pause: it is hot again.
func (c *Client) Resume(ctx context.Context, ref string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.Do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/resume", nil, &sb)
	return sb, err
}

// TakeSnapshot takes a snapshot of sandbox ref, named name ("": none).
func (c *Client) TakeSnapshot(ctx context.Context, ref, name string) (api.Snapshot, error) {
	var s api.Snapshot
	err := c.Do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/snapshots", api.SnapshotRequest{Name: name}, &s)
	return s, err
}

// Snapshots lists the snapshots, of one sandbox and by name if given.
func (c *Client) Snapshots(ctx context.Context, of, name string) ([]api.Snapshot, error) {
	var l api.List[api.Snapshot]
	q := url.Values{}
	if of != "" {
		q.Set("of", of)
	}
	if name != "" {
		q.Set("name", name)
	}
	err := c.Do(ctx, http.MethodGet, "/v1/snapshots?"+q.Encode(), nil, &l)
	return l.Items, err
}

// DeleteSnapshot deletes snapshot id.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(id), nil, nil)
}

// FromSnapshot makes a sandbox from snapshot id, with its memory.
func (c *Client) FromSnapshot(ctx context.Context, id string, req api.SandboxRequest) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.Do(ctx, http.MethodPost, "/v1/snapshots/"+url.PathEscape(id)+"/sandboxes", req, &sb)
	return sb, err
}

// Move starts a sandbox whose node is lost again, cold, on another node
// (POST /v1/sandboxes/{id}/move); its note says what stayed behind.
func (c *Client) Move(ctx context.Context, ref string) (api.Sandbox, error) {
	return c.MoveTo(ctx, ref, "")
}

// MoveTo moves sandbox ref: with its memory to node to ("": the one the
// master picks) while its node answers, cold while it is lost.
func (c *Client) MoveTo(ctx context.Context, ref, to string) (api.Sandbox, error) {
	var sb api.Sandbox
	var body any
	if to != "" {
		body = api.MoveRequest{To: to}
	}
	err := c.Do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/move", body, &sb)
	return sb, err
}

// Drain drains node name (POST /v1/nodes/{name}/drain): each is called
// with every sandbox moved (or not) as it happens; the sum is returned.
func (c *Client) Drain(ctx context.Context, name string, each func(api.DrainEvent)) (api.DrainEvent, error) {
	hc := *c.HTTP
	hc.Timeout = 0 // as long as the drain takes: each move has its own deadlines on the master
	cc := *c
	cc.HTTP = &hc
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		err := cc.Do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(name)+"/drain", nil, pw)
		pw.CloseWithError(err)
		errc <- err
	}()
	dec := json.NewDecoder(pr)
	var sum api.DrainEvent
	for {
		var ev api.DrainEvent
		if err := dec.Decode(&ev); err != nil {
			pr.CloseWithError(err)
			if werr := <-errc; werr != nil {
				return sum, werr
			}
			if errors.Is(err, io.EOF) && sum.Done {
				return sum, nil
			}
			return sum, fmt.Errorf("drain of %s: its answer ended early: %w", name, err)
		}
		if ev.Done {
			sum = ev
			continue
		}
		if each != nil {
			each(ev)
		}
	}
}

// Undrain makes node name take new sandboxes again.
func (c *Client) Undrain(ctx context.Context, name string) error {
	return c.Do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(name)+"/undrain", nil, nil)
}

// Clone makes children of a running sandbox from its memory.
// A 207 (some children made, then a failure) is an error here too, with
// the result holding what was made.
func (c *Client) Clone(ctx context.Context, ref string, req api.CloneRequest) (api.CloneResult, error) {
	var res struct {
		api.CloneResult
		Error string `json:"error"`
	}
	if err := c.Do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(ref)+"/clone", req, &res); err != nil {
		return res.CloneResult, err
	}
	if res.Error != "" {
		return res.CloneResult, fmt.Errorf("clone of %s made %d child(ren), then failed: %s", ref, len(res.Children), res.Error)
	}
	return res.CloneResult, nil
}

// Logs writes a sandbox's console output to w; with follow it goes on
// writing what is appended until ctx ends or the sandbox is deleted; with
// timestamps every line starts with the time it was written ("-" if
// unknown).
func (c *Client) Logs(ctx context.Context, ref string, follow, timestamps bool, w io.Writer) error {
	q := url.Values{}
	if follow {
		q.Set("follow", "1")
	}
	if timestamps {
		q.Set("timestamps", "1")
	}
	path := "/v1/sandboxes/" + url.PathEscape(ref) + "/logs"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	if follow {
		hc := *c.HTTP
		hc.Timeout = 0 // a followed log has no end
		cc := *c
		cc.HTTP = &hc
		return cc.Do(ctx, http.MethodGet, path, nil, w)
	}
	return c.Do(ctx, http.MethodGet, path, nil, w)
}

// EgressLog writes sandbox ref's egress log to w: JSON lines, each an
// api.EgressPage, the flows after seq after (at most limit; 0: all kept),
// then with follow each new batch until ctx ends or the sandbox is
// deleted.
func (c *Client) EgressLog(ctx context.Context, ref string, after int64, limit int, follow bool, w io.Writer) error {
	q := url.Values{"after": {strconv.FormatInt(after, 10)}, "limit": {strconv.Itoa(limit)}}
	cc := *c
	if follow {
		q.Set("follow", "1")
		hc := *c.HTTP
		hc.Timeout = 0 // a followed log has no end
		cc.HTTP = &hc
	}
	return cc.Do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(ref)+"/egress?"+q.Encode(), nil, w)
}

// Node returns the node's status.
func (c *Client) Node(ctx context.Context) (api.NodeStatus, error) {
	var st api.NodeStatus
	err := c.Do(ctx, http.MethodGet, "/v1/node", nil, &st)
	return st, err
}
