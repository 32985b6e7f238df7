package remote

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/fullduplex"
	"sandstorm/internal/httpjson"
	"sandstorm/internal/nodeapi"
)

// Client is a node over the network.
type Client struct {
	// NodeName is the node's name (as the master knows it).
	NodeName string
	// Base is the node's seam URL, https://host:port.
	Base string
	// HTTP carries the requests; its transport has the master's client
	// certificate and trusts the CA the node's certificate is from.
	HTTP *http.Client
	// Silence is how long Watch waits for a report (0: nodeapi.SilenceLimit).
	Silence time.Duration

	certMu   sync.Mutex
	notAfter time.Time // of the certificate the node last presented (Dial, or its tunnel)
	tunnel   bool      // the node dials in: its certificate is a client one
}

var _ nodeapi.Node = (*Client)(nil)

// Name implements nodeapi.Node.
func (c *Client) Name() string { return c.NodeName }

// NewClient is a client of node name at base over hc; tunnel says the node
// dials in (its certificate is a client one), notAfter when the
// certificate it presents ends (zero: not seen yet).
func NewClient(name, base string, hc *http.Client, tunnel bool, notAfter time.Time) *Client {
	return &Client{NodeName: name, Base: base, HTTP: hc, tunnel: tunnel, notAfter: notAfter}
}

// PeerNotAfter is when the certificate the node last presented ends (zero
// before it has presented one).
func (c *Client) PeerNotAfter() time.Time {
	c.certMu.Lock()
	defer c.certMu.Unlock()
	return c.notAfter
}

// SetPeerNotAfter records when the certificate the node presented ends.
func (c *Client) SetPeerNotAfter(t time.Time) {
	c.certMu.Lock()
	c.notAfter = t
	c.certMu.Unlock()
}

// Tunnel reports whether the node dials in (its calls ride its tunnel).
func (c *Client) Tunnel() bool { return c.tunnel }

// Do makes one call to the node: body (nil: none) as JSON, an answer of
// okStatus decoded into out (nil: discarded), any other an error of its
// errdefs kind. Pairing, renewal and the tunnel (internal/enrol) speak
// through it too.
func (c *Client) Do(ctx context.Context, method, path string, body, out any, okStatus int) error {
	return c.do(ctx, method, path, body, out, okStatus)
}

func (c *Client) do(ctx context.Context, method, path string, body, out any, okStatus int) error {
	req, err := api.NewJSONRequest(ctx, method, c.Base+path, body)
	if err != nil {
		return err
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != okStatus {
		return readError(resp)
	}
	return httpjson.ReadAnswer(resp, out, 0)
}

// DeadlineHeader carries a call's deadline from the master to the node,
// as Unix milliseconds: a request held up on the way (a partition, whose
// TCP retransmits it once the link heals) is refused by the node if it
// arrives after the master gave up waiting, rather than done late behind
// the back of a caller who was told it failed. Master and node clocks are
// taken to agree to well within a deadline (seconds; NTP keeps them to
// milliseconds).
const DeadlineHeader = "X-Sandstorm-Deadline"

// pastDeadline refuses a request that arrives after its deadline.
func pastDeadline(r *http.Request) error {
	v := r.Header.Get(DeadlineHeader)
	if v == "" {
		return nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return errdefs.New(errdefs.ErrBadInput, "%s %q is not Unix milliseconds", DeadlineHeader, v)
	}
	if late := time.Since(time.UnixMilli(ms)); late > 0 {
		return errdefs.New(errdefs.ErrTimeout, "the master's deadline for %s %s passed %v before it reached the node; it was not done", r.Method, r.URL.Path, late.Round(time.Millisecond))
	}
	return nil
}

// send is c.HTTP.Do, with a failure marked errdefs.ErrUnavailable, and also
// ErrNotSent if not one byte of the request reached the connection (the
// dial or the TLS handshake failed, or no tunnel): then the node cannot
// have acted on it, and a create may be tried elsewhere (fleet).
func (c *Client) send(req *http.Request) (*http.Response, error) {
	return c.sendWith(c.HTTP, req)
}

// sendWith is send over hc (c.stream() for a call that lasts as long as
// its deadline allows, not c.HTTP's time limit).
func (c *Client) sendWith(hc *http.Client, req *http.Request) (*http.Response, error) {
	if dl, ok := req.Context().Deadline(); ok {
		req.Header.Set(DeadlineHeader, strconv.FormatInt(dl.UnixMilli(), 10))
	}
	var wrote atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		WroteHeaderField: func(string, []string) { wrote.Store(true) },
	}))
	resp, err := hc.Do(req)
	if err == nil {
		return resp, nil
	}
	err = errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("node %s: %w", c.NodeName, err))
	if !wrote.Load() {
		err = errdefs.Mark(nodeapi.ErrNotSent, err)
	}
	return nil, err
}

// readError turns an error answer back into an error of its kind
// (errdefs.FromWire), so errors.Is works on the master's side.
func readError(resp *http.Response) error {
	e := httpjson.ErrorBody(resp)
	if e.Code == "" {
		e.Message = fmt.Sprintf("HTTP %d from the node: %s", resp.StatusCode, e.Message)
	}
	return errdefs.FromWire(resp.StatusCode, e)
}

// Create implements nodeapi.Node.
func (c *Client) Create(ctx context.Context, req nodeapi.CreateRequest) (api.Sandbox, error) {
	var sb api.Sandbox
	return sb, c.do(ctx, http.MethodPost, "/node/v1/sandboxes", req, &sb, http.StatusCreated)
}

// Get implements nodeapi.Node.
func (c *Client) Get(ctx context.Context, ref string) (api.Sandbox, error) {
	var sb api.Sandbox
	return sb, c.do(ctx, http.MethodGet, "/node/v1/sandboxes/"+url.PathEscape(ref), nil, &sb, http.StatusOK)
}

// Usage implements nodeapi.Node.
func (c *Client) Usage(ctx context.Context, id string) (api.Usage, error) {
	var u api.Usage
	return u, c.do(ctx, http.MethodGet, "/node/v1/sandboxes/"+url.PathEscape(id)+"/usage", nil, &u, http.StatusOK)
}

// SetEgress implements nodeapi.Node.
func (c *Client) SetEgress(ctx context.Context, id string, e api.Egress) (api.Sandbox, error) {
	var sb api.Sandbox
	return sb, c.do(ctx, http.MethodPut, "/node/v1/sandboxes/"+url.PathEscape(id)+"/egress", e, &sb, http.StatusOK)
}

// EgressLog implements nodeapi.Node.
func (c *Client) EgressLog(ctx context.Context, id string, opt nodeapi.EgressLogOptions, w io.Writer) error {
	q := url.Values{"after": {strconv.FormatInt(opt.After, 10)}, "limit": {strconv.Itoa(opt.Limit)}}
	if opt.Follow {
		q.Set("follow", "1")
	}
	// A followed log lasts as long as its reader wants it.
	resp, err := c.getStream(ctx, "/node/v1/sandboxes/"+url.PathEscape(id)+"/egress?"+q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	fl, _ := w.(interface{ Flush() })
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		if _, err := w.Write(append(sc.Bytes(), '\n')); err != nil {
			return err
		}
		if fl != nil {
			fl.Flush()
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("node %s: egress log of %s cut off: %w", c.NodeName, id, err))
	}
	return nil
}

// getStream GETs path on the stream client (no time limit of its own:
// ctx bounds it) and returns an answer of 200 for the caller to read and
// close; any other is the node's error.
func (c *Client) getStream(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Base+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.stream().Do(req)
	if err != nil {
		return nil, errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("node %s: %w", c.NodeName, err))
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, readError(resp)
	}
	return resp, nil
}

// Layer implements nodeapi.Node.
func (c *Client) Layer(ctx context.Context, id string, w io.Writer) error {
	// As long as the layer takes: the caller's ctx bounds it.
	resp, err := c.getStream(ctx, "/node/v1/sandboxes/"+url.PathEscape(id)+"/layer")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("node %s: layer of %s cut off: %w", c.NodeName, id, err))
	}
	return nil
}

// List implements nodeapi.Node.
func (c *Client) List(ctx context.Context) ([]api.Sandbox, error) {
	var l api.List[api.Sandbox]
	return l.Items, c.do(ctx, http.MethodGet, "/node/v1/sandboxes", nil, &l, http.StatusOK)
}

// Delete implements nodeapi.Node.
func (c *Client) Delete(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/node/v1/sandboxes/"+url.PathEscape(id), nil, nil, http.StatusNoContent)
}

// Transition implements nodeapi.Node.
func (c *Client) Transition(ctx context.Context, id string, op nodeapi.Op) (api.Sandbox, error) {
	var sb api.Sandbox
	return sb, c.do(ctx, http.MethodPost, "/node/v1/sandboxes/"+url.PathEscape(id)+"/"+string(op), nil, &sb, http.StatusOK)
}

// Clone implements nodeapi.Node.
func (c *Client) Clone(ctx context.Context, id string, req nodeapi.CloneRequest) (api.CloneResult, error) {
	b, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.Base+"/node/v1/sandboxes/"+url.PathEscape(id)+"/clone", bytes.NewReader(b))
	if err != nil {
		return api.CloneResult{}, err
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := c.send(hr)
	if err != nil {
		return api.CloneResult{}, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusCreated:
		var res api.CloneResult
		return res, json.NewDecoder(resp.Body).Decode(&res)
	case http.StatusMultiStatus:
		var p partialClone
		if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
			return api.CloneResult{}, err
		}
		return p.Result, errdefs.FromWire(http.StatusMultiStatus, p.Error)
	}
	return api.CloneResult{}, readError(resp)
}

// ServePort implements Node: the call is forwarded to the node's
// /node/v1/sandboxes/{id}/ports/{port}/{path}, as ServeEnvd's is.
func (c *Client) ServePort(w http.ResponseWriter, r *http.Request, id string, port int) error {
	return c.forward(w, r, "/node/v1/sandboxes/"+url.PathEscape(id)+"/ports/"+strconv.Itoa(port)+r.URL.Path)
}

// ServeEnvd implements Node: the call is forwarded to the node's
// /node/v1/sandboxes/{id}/envd/{path}, streamed both ways, on the
// connection the node's calls ride (mutual TLS, or its tunnel).
func (c *Client) ServeEnvd(w http.ResponseWriter, r *http.Request, id, path string) error {
	return c.forward(w, r, "/node/v1/sandboxes/"+url.PathEscape(id)+"/envd"+path)
}

// forward sends r to the node's path, streamed both ways, with r's query
// and the Host it was asked by (X-Forwarded-Host: a sandbox's own port
// may serve by name).
func (c *Client) forward(w http.ResponseWriter, r *http.Request, path string) error {
	base, err := url.Parse(c.Base)
	if err != nil {
		return err
	}
	// Full duplex (Guard), as the node's own forwarding (internal/node/envdlink):
	// the body may still be on its way when the answer starts.
	body := fullduplex.Guard(w, r)
	defer body.Stop()
	var failed error
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = base.Scheme
			pr.Out.URL.Host = base.Host
			pr.Out.URL.Path = path
			pr.Out.URL.RawPath = ""
			pr.Out.Host = base.Host
			pr.Out.Header.Set("X-Forwarded-Host", pr.In.Host)
		},
		Transport:     c.stream().Transport,
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			if resp.Header.Get(SeamErrorHeader) == "" {
				return body.Respond(resp)
			}
			defer resp.Body.Close()
			return seamErr{readError(resp)}
		},
		ErrorHandler: func(_ http.ResponseWriter, _ *http.Request, err error) { failed = err },
	}
	proxy.ServeHTTP(w, r)
	var se seamErr
	if errors.As(failed, &se) {
		return se.error // the node's own answer: the sandbox, not the node
	}
	if failed != nil {
		// Also when r's context ended: the fleet ends it when the node is
		// taken for lost (fleet.bound), and the caller is told so.
		return errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("node %s: %w", c.NodeName, failed))
	}
	return nil
}

// seamErr is the node's own error on a forwarded call.
type seamErr struct{ error }

// Logs implements nodeapi.Node.
func (c *Client) Logs(ctx context.Context, id string, opt nodeapi.LogOptions, w io.Writer) error {
	q := url.Values{}
	if opt.Follow {
		q.Set("follow", "1")
	}
	if opt.Timestamps {
		q.Set("timestamps", "1")
	}
	// A followed log lasts as long as its reader wants it.
	resp, err := c.getStream(ctx, "/node/v1/sandboxes/"+url.PathEscape(id)+"/logs?"+q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	fl, _ := w.(interface{ Flush() })
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if fl != nil {
				fl.Flush()
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil
			}
			return errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("node %s: logs cut off: %w", c.NodeName, err))
		}
	}
}

// Status implements nodeapi.Node.
func (c *Client) Status(ctx context.Context) (api.NodeStatus, error) {
	var st api.NodeStatus
	return st, c.do(ctx, http.MethodGet, "/node/v1/status", nil, &st, http.StatusOK)
}

// Ingress implements nodeapi.Node.
func (c *Client) Ingress(ctx context.Context) (nodeapi.IngressInfo, error) {
	var in nodeapi.IngressInfo
	return in, c.do(ctx, http.MethodGet, "/node/v1/ingress", nil, &in, http.StatusOK)
}

// PrepareTemplate implements nodeapi.Node.
func (c *Client) PrepareTemplate(ctx context.Context, t api.Template) error {
	return c.do(ctx, http.MethodPut, "/node/v1/templates/"+url.PathEscape(t.Name), t, nil, http.StatusNoContent)
}

// PutRootfs implements Node: the tarball is streamed as the body.
func (c *Client) PutRootfs(ctx context.Context, digest string, tar io.Reader) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.Base+"/node/v1/rootfs/"+url.PathEscape(digest), tar)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("node %s: %w", c.NodeName, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return readError(resp)
	}
	return nil
}

// Layers implements nodeapi.Node.
func (c *Client) Layers(ctx context.Context, digests []string) ([]string, error) {
	var res layersBody
	if err := c.do(ctx, http.MethodPost, "/node/v1/layers/missing", layersBody{Digests: digests}, &res, http.StatusOK); err != nil {
		return nil, err
	}
	return res.Digests, nil
}

// PutLayer implements nodeapi.Node: the layer's tar is streamed as the
// body, for as long as the call's deadline allows.
func (c *Client) PutLayer(ctx context.Context, digest string, tar io.Reader) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.Base+"/node/v1/layers/"+url.PathEscape(digest), tar)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.sendWith(c.stream(), req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return readError(resp)
	}
	return nil
}

// Fence implements nodeapi.Node.
func (c *Client) Fence(ctx context.Context, req nodeapi.FenceRequest) (nodeapi.FenceResult, error) {
	var res nodeapi.FenceResult
	return res, c.do(ctx, http.MethodPost, "/node/v1/fence", req, &res, http.StatusOK)
}

// PutRoutes implements nodeapi.Node.
func (c *Client) PutRoutes(ctx context.Context, u nodeapi.Routes) error {
	return c.do(ctx, http.MethodPut, "/node/v1/routes", u, nil, http.StatusNoContent)
}

// DropTemplate implements nodeapi.Node.
func (c *Client) DropTemplate(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/node/v1/templates/"+url.PathEscape(name), nil, nil, http.StatusNoContent)
}

// MoveOut implements Node: the node's move stream, copied to w as it
// comes.
func (c *Client) MoveOut(ctx context.Context, id string, gen int64, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Base+"/node/v1/sandboxes/"+url.PathEscape(id)+"/move-out?generation="+strconv.FormatInt(gen, 10), nil)
	if err != nil {
		return err
	}
	resp, err := c.sendWith(c.stream(), req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return readError(resp)
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("node %s: move stream of %s cut off: %w", c.NodeName, id, err))
	}
	return nil
}

// MoveIn implements Node: r is streamed as the body.
func (c *Client) MoveIn(ctx context.Context, gen int64, r io.Reader) (api.Sandbox, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.Base+"/node/v1/move-in?generation="+strconv.FormatInt(gen, 10), r)
	if err != nil {
		return api.Sandbox{}, err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.sendWith(c.stream(), req)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return api.Sandbox{}, readError(resp)
	}
	var sb api.Sandbox
	return sb, json.NewDecoder(resp.Body).Decode(&sb)
}

// MoveCommit implements nodeapi.Node.
func (c *Client) MoveCommit(ctx context.Context, id string, gen int64) (api.Sandbox, error) {
	var sb api.Sandbox
	return sb, c.do(ctx, http.MethodPost, "/node/v1/sandboxes/"+url.PathEscape(id)+"/move-commit?generation="+strconv.FormatInt(gen, 10), nil, &sb, http.StatusOK)
}

// MoveAbort implements nodeapi.Node.
func (c *Client) MoveAbort(ctx context.Context, id string, gen int64) error {
	return c.do(ctx, http.MethodPost, "/node/v1/sandboxes/"+url.PathEscape(id)+"/move-abort?generation="+strconv.FormatInt(gen, 10), nil, nil, http.StatusNoContent)
}

// Watch implements nodeapi.Node over the network. It returns when ctx ends, the
// stream breaks, or the node is silent for SilenceLimit (a partition
// leaves a TCP connection open with nothing on it), with why.
func (c *Client) Watch(ctx context.Context, send func(nodeapi.Report) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Base+"/node/v1/watch", nil)
	if err != nil {
		return err
	}
	limit := c.Silence
	if limit <= 0 {
		limit = nodeapi.SilenceLimit
	}
	silent := time.AfterFunc(limit, func() {
		cancel(fmt.Errorf("no report for %v", limit))
	})
	defer silent.Stop()
	resp, err := c.stream().Do(req)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
			err = cause
		}
		return errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("node %s: %w", c.NodeName, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return readError(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	// A full report of thousands of sandboxes is one line.
	sc.Buffer(make([]byte, 64<<10), 256<<20)
	for sc.Scan() {
		silent.Reset(limit)
		var rep nodeapi.Report
		if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
			return fmt.Errorf("node %s: a report that is not JSON: %w", c.NodeName, err)
		}
		if err := send(rep); err != nil {
			return err
		}
	}
	err = sc.Err()
	if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
		err = cause
	}
	if err == nil {
		err = errors.New("the node ended its reports")
	}
	return errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("node %s: %w", c.NodeName, err))
}

// stream is c's HTTP client for a request that lasts as long as it is
// wanted (reports, followed logs): the same connections, no time limit.
func (c *Client) stream() *http.Client {
	return &http.Client{Transport: c.HTTP.Transport}
}
