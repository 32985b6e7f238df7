package client

import (
	"fmt"
	"io"
	"net/http"
	"sync"
)

// InProcess is a client of the API served by h in this very process: a
// master's own work (a template build's steps) goes through the API's
// checks and the fleet like any caller's, without a socket. Answers
// stream as h writes them (a command's output, a layer).
func InProcess(h http.Handler, token string) *Client {
	return &Client{Base: "https://in-process", Token: token, HTTP: &http.Client{Transport: handlerTransport{h}}}
}

// handlerTransport runs each request through a handler, the answer's
// body a pipe the handler writes into.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	pr, pw := io.Pipe()
	w := &pipeWriter{header: http.Header{}, pw: pw, ready: make(chan struct{})}
	if r.Body == nil {
		r.Body = http.NoBody
	}
	go func() {
		defer func() {
			// As net/http's server does: a handler's panic ends its
			// answer, not the process (httputil.ReverseProxy aborts with
			// http.ErrAbortHandler when its reader went away).
			if p := recover(); p != nil && p != http.ErrAbortHandler {
				pw.CloseWithError(fmt.Errorf("in-process %s %s: handler panicked: %v", r.Method, r.URL.Path, p))
			}
			w.WriteHeader(http.StatusOK) // a handler that wrote nothing
			pw.Close()
		}()
		t.h.ServeHTTP(w, r)
	}()
	select {
	case <-w.ready:
	case <-r.Context().Done():
		pr.CloseWithError(r.Context().Err())
		return nil, r.Context().Err()
	}
	return &http.Response{Status: http.StatusText(w.code), StatusCode: w.code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.sent, Body: pr, ContentLength: -1, Request: r}, nil
}

// pipeWriter is the handler's side: the status and header are the
// answer's once it writes either, its body the pipe.
type pipeWriter struct {
	header http.Header
	sent   http.Header
	pw     *io.PipeWriter
	once   sync.Once
	code   int
	ready  chan struct{}
}

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) WriteHeader(code int) {
	w.once.Do(func() {
		// The answer's header is a copy: the handler may go on setting
		// its own (trailers) while the reader reads this one.
		w.sent = w.header.Clone()
		w.code = code
		close(w.ready)
	})
}

func (w *pipeWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.pw.Write(p)
}

// Flush is a no-op: every Write reaches the reader through the pipe.
func (w *pipeWriter) Flush() {}
