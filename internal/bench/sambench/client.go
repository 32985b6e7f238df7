package sambench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/proxy"
)

// Kinds of outcome recorded in Sample.Kind and counted in Phase.Failures.
const (
	KindOK     = "ok"
	KindLeaked = "leaked"
	// KindRefusedPrefix starts the kind of a flow refused by policy:
	// "refused: socks connection not allowed by ruleset", "refused: http 403".
	KindRefusedPrefix = "refused: "
	KindTimeout       = "timeout"
	KindCanceled      = "canceled"
)

// socksNotAllowed is the text golang.org/x/net gives SOCKS5 reply 0x02.
const socksNotAllowed = "connection not allowed by ruleset"

type runner struct {
	cfg *Config
	// dials counts connections opened: SOCKS5 handshakes through a
	// boundary, connections to the node's socket for the baseline.
	dials   atomic.Int64
	client  *http.Client
	tr      *http.Transport
	scraper *http.Client
}

func newRunner(cfg *Config) (*runner, error) {
	r := &runner{cfg: cfg}
	tr := &http.Transport{
		// Never a proxy from the environment: the route is the one asked.
		Proxy:               nil,
		MaxIdleConns:        cfg.Concurrency,
		MaxIdleConnsPerHost: cfg.Concurrency,
		IdleConnTimeout:     90 * time.Second,
		DisableKeepAlives:   cfg.NewFlow,
		TLSHandshakeTimeout: 10 * time.Second,
	}
	if cfg.TargetUnix != "" {
		var d net.Dialer
		path := cfg.TargetUnix
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			r.dials.Add(1)
			return d.DialContext(ctx, "unix", path)
		}
	} else {
		// proxy.SOCKS5 dials the proxy on the network given, so "unix"
		// works; the target address is sent as the name in the URL
		// (ATYP domain name), unresolved: the boundary resolves it.
		pd, err := proxy.SOCKS5("unix", cfg.Socket, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("socks5 dialer: %w", err)
		}
		cd, ok := pd.(proxy.ContextDialer)
		if !ok {
			return nil, errors.New("socks5 dialer has no DialContext")
		}
		tr.DialContext = func(ctx context.Context, _, addr string) (net.Conn, error) {
			r.dials.Add(1)
			return cd.DialContext(ctx, "tcp", addr)
		}
	}
	r.tr = tr
	r.client = &http.Client{
		Transport: tr,
		// A redirect is an outcome of its own, not followed.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	r.scraper = &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}
	return r, nil
}

func (r *runner) close() {
	r.tr.CloseIdleConnections()
	if t, ok := r.scraper.Transport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
}

// one issues request i and times it.
func (r *runner) one(ctx context.Context, i int, phaseStart time.Time) Sample {
	s := Sample{Seq: i}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	var body io.Reader
	if r.cfg.Body != "" {
		body = strings.NewReader(r.cfg.Body)
	}
	var t0 time.Time
	var ttfb atomic.Int64
	trace := &httptrace.ClientTrace{GotFirstResponseByte: func() { ttfb.Store(int64(time.Since(t0))) }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), r.cfg.Method, r.cfg.Target, body)
	if err != nil {
		s.Kind, s.Error = "error", err.Error()
		return s
	}
	for _, h := range r.cfg.Headers {
		if strings.EqualFold(h.Name, "Host") {
			req.Host = h.Value
			continue
		}
		req.Header.Add(h.Name, h.Value)
	}

	t0 = time.Now()
	s.AtUs = t0.Sub(phaseStart).Microseconds()
	resp, err := r.client.Do(req)
	if err != nil {
		s.TotalUs = time.Since(t0).Microseconds()
		s.Kind, s.Error = Classify(err), err.Error()
		s.OK = r.cfg.ExpectDeny && strings.HasPrefix(s.Kind, KindRefusedPrefix)
		return s
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	s.TotalUs = time.Since(t0).Microseconds()
	s.TTFBUs = time.Duration(ttfb.Load()).Microseconds()
	s.Status, s.Bytes = resp.StatusCode, n
	switch {
	case err != nil:
		s.Kind, s.Error = "body: "+Classify(err), err.Error()
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		s.Kind = KindOK
		s.OK = !r.cfg.ExpectDeny
	case r.cfg.ExpectDeny && slices.Contains(r.cfg.DenyStatus, resp.StatusCode):
		s.Kind = KindRefusedPrefix + "http " + strconv.Itoa(resp.StatusCode)
		s.OK = true
	default:
		s.Kind = "http " + strconv.Itoa(resp.StatusCode)
	}
	return s
}

// Classify names the class of a request's error: a closed set of short
// kinds, so that failures can be counted (the full text is kept in the
// sample).
func Classify(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return KindTimeout
	case errors.Is(err, context.Canceled):
		return KindCanceled
	}
	var op *net.OpError
	if errors.As(err, &op) && strings.HasPrefix(op.Op, "socks") {
		// An error of the SOCKS5 exchange: dialling the proxy's socket,
		// or the proxy's reply.
		var inner *net.OpError
		if errors.As(op.Err, &inner) && inner.Op == "dial" {
			return "proxy dial: " + errnoClass(inner.Err)
		}
		msg := op.Err.Error()
		if reply, ok := strings.CutPrefix(msg, "unknown error "); ok {
			if reply == socksNotAllowed {
				return KindRefusedPrefix + "socks " + reply
			}
			return "socks: " + reply
		}
		return "socks: " + errnoClass(op.Err)
	}
	if errors.As(err, &op) && op.Op == "dial" {
		return "dial: " + errnoClass(op.Err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return KindTimeout
	}
	return errnoClass(err)
}

// errnoClass names common low-level causes, or "other".
func errnoClass(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ENOENT), errors.Is(err, os.ErrNotExist):
		return "no such socket"
	case errors.Is(err, syscall.EACCES), errors.Is(err, os.ErrPermission):
		return "permission denied"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EPIPE):
		return "broken pipe"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return KindTimeout
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return KindTimeout
	}
	return "other"
}
