package inject

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
)

// MaxBufferedBody is the largest request body with a Content-Length whose
// markers are replaced: it is read whole, so its new length can be sent.
// A chunked body (HTTP/1.1) or one of unknown length (HTTP/2) is replaced
// as it streams, at any size; a longer one with a Content-Length goes out
// untouched (an upload, not a credential: its length cannot change
// without holding all of it). Answers are held up to it too (scrub.go).
// It is small because a sandbox decides how many requests are in flight
// (connections, HTTP/2 streams): each may hold this much of the
// boundary's memory, as a spliced flow holds its 32 KiB copy buffer.
const MaxBufferedBody = 64 << 10

// usage is the names of the secrets a flow's requests carried. Bodies are
// read while a request is written out (and, over HTTP/2, by its stream's
// own goroutine), so it is guarded.
type usage struct {
	mu    sync.Mutex
	names []string
}

func (u *usage) add(names ...string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, n := range names {
		if !slices.Contains(u.names, n) {
			u.names = append(u.names, n)
		}
	}
}

func (u *usage) list() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.names)
}

// inBody is the bindings whose secret may go in a request's body: only
// those stored so (Binding.Body). Off by default because a body is where
// a service keeps what it is sent (a gist, an issue, a chat message) and
// can be read back through the same service: a sandbox that may send a
// secret in bodies can make the service store it, and read it back.
func inBody(bound []Binding) []Binding {
	var out []Binding
	for _, b := range bound {
		if b.Body {
			out = append(out, b)
		}
	}
	return out
}

// replaceBody puts the values of bound's body bindings (inBody) in place
// of their markers in req's body, as MaxBufferedBody says, and passes
// the names it put in to u: at once for a buffered body, as it streams
// otherwise. A body that cannot be read is an error; the request must
// not go out.
func replaceBody(req *http.Request, bound []Binding, u *usage) error {
	bound = inBody(bound)
	if len(bound) == 0 || req.Body == nil || req.Body == http.NoBody || req.ContentLength == 0 {
		return nil
	}
	if req.ContentLength < 0 {
		req.Body = &replacer{src: req.Body, bound: bound, used: u}
		return nil
	}
	if req.ContentLength > MaxBufferedBody {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(req.Body, req.ContentLength+1))
	req.Body.Close()
	if err != nil {
		return fmt.Errorf("reading the request's body: %w", err)
	}
	if int64(len(b)) != req.ContentLength {
		return fmt.Errorf("the request's body is %d bytes, its Content-Length says %d", len(b), req.ContentLength)
	}
	for _, bd := range bound {
		if bytes.Contains(b, []byte(bd.Marker)) {
			b = bytes.ReplaceAll(b, []byte(bd.Marker), []byte(bd.Value))
			u.add(bd.Name)
		}
	}
	req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
	if req.Header.Get("Content-Length") != "" {
		req.Header.Set("Content-Length", fmt.Sprint(len(b)))
	}
	return nil
}

// replacer replaces markers in a body as it streams. It holds back the
// last bytes read if they could be the start of a marker cut by a read's
// end, so a marker split across reads (or chunks) is still found.
type replacer struct {
	src     io.ReadCloser
	bound   []Binding
	used    *usage
	pending []byte // read, not yet searched to the end
	out     []byte // ready to return
	eof     bool
	buf     []byte // each read's
}

func (r *replacer) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.eof && len(r.pending) == 0 {
			return 0, io.EOF
		}
		if !r.eof {
			if r.buf == nil {
				r.buf = make([]byte, 32<<10)
			}
			n, err := r.src.Read(r.buf)
			r.pending = append(r.pending, r.buf[:n]...)
			if err == io.EOF {
				r.eof = true
			} else if err != nil {
				return 0, err
			}
		}
		r.search()
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

// search moves what of pending can no longer be part of a marker to out,
// with each whole marker in it replaced.
func (r *replacer) search() {
	for {
		at, which := -1, -1
		for i, b := range r.bound {
			if j := bytes.Index(r.pending, []byte(b.Marker)); j >= 0 && (at < 0 || j < at) {
				at, which = j, i
			}
		}
		if at < 0 {
			break
		}
		b := r.bound[which]
		r.out = append(append(r.out, r.pending[:at]...), b.Value...)
		r.pending = r.pending[at+len(b.Marker):]
		r.used.add(b.Name)
	}
	keep := 0
	if !r.eof {
		keep = r.partial()
	}
	r.out = append(r.out, r.pending[:len(r.pending)-keep]...)
	r.pending = slices.Clone(r.pending[len(r.pending)-keep:])
}

// partial is the length of the longest end of pending that begins a
// marker: only that is held back, so a stream (a request's lines read
// one by one by the server) is not kept waiting for bytes it may never
// send.
func (r *replacer) partial() int {
	longest := 0
	for _, b := range r.bound {
		longest = max(longest, len(b.Marker))
	}
	for k := min(len(r.pending), longest-1); k > 0; k-- {
		tail := r.pending[len(r.pending)-k:]
		for _, b := range r.bound {
			if len(tail) < len(b.Marker) && bytes.HasPrefix([]byte(b.Marker), tail) {
				return k
			}
		}
	}
	return 0
}

func (r *replacer) Close() error { return r.src.Close() }
