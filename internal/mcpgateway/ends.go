package mcpgateway

import (
	"errors"
	"io"
	"net/http"
	"sync"
)

// The go-sdk's streamable client reports an answer's event stream that
// ends before the answer as "request terminated without response",
// whatever ended it: it drops the body's read error (mcp/streamable.go,
// processStream). Whether the stream was closed by the server (a clean
// end, its last chunk sent) or cut under it (a truncated chunked body,
// a reset) says where to look, so the gateway's client keeps how the
// last answer it read ended and its error says so (a cut seen once in
// CI, issue 33, with nothing in either process's log).

// endRecorder is a RoundTripper over base that keeps how the last
// response body read to its end ended.
type endRecorder struct {
	base http.RoundTripper

	mu   sync.Mutex
	last error // nil: none ended yet; io.EOF: a clean end
}

func (e *endRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := e.base.RoundTrip(r)
	if err == nil && resp.Body != nil {
		resp.Body = &endBody{ReadCloser: resp.Body, e: e}
	}
	return resp, err
}

// lastEnd says how the last body read to its end ended ("" if none did).
func (e *endRecorder) lastEnd() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.last == nil:
		return ""
	case errors.Is(e.last, io.EOF):
		return "the server ended the answer's stream"
	default:
		return "the answer's stream was cut: " + e.last.Error()
	}
}

type endBody struct {
	io.ReadCloser
	e    *endRecorder
	once sync.Once
}

func (b *endBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.once.Do(func() {
			b.e.mu.Lock()
			b.e.last = err
			b.e.mu.Unlock()
		})
	}
	return n, err
}

// recording is hc with an endRecorder over its transport.
func recording(hc *http.Client) (*http.Client, *endRecorder) {
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	e := &endRecorder{base: base}
	c := *hc
	c.Transport = e
	return &c, e
}
