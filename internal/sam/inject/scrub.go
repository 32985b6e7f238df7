package inject

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// The secret's way back. A server may send what it was sent back to the
// sandbox: an echo endpoint, an error that quotes the key it refused, a
// body the sandbox had it store (a secret stored for bodies). So what a
// secret's host answers is scrubbed: each secret's value in it becomes
// its marker again, in the headers and in the body, before the sandbox
// reads a byte. Requests ask for no content coding (Accept-Encoding:
// identity) so that the body can be read; a server that compresses
// anyway with gzip or deflate is decoded here, and one that uses any
// other coding is refused (502), as is anything the boundary cannot read
// (fail closed). A WebSocket's frames are scrubbed too (wsscrub.go); an
// upgrade to any other protocol is refused. A header rule's value (E2B's
// transforms) is not a secret and is not scrubbed: E2B's own test reads
// it back.

// MinScrub is the shortest value scrubbed: a shorter one would match
// bytes that are not it (a secret is a key, far longer).
const MinScrub = 8

// scrubs is bound's secrets turned around, value → marker, for
// replace and replacer; nil if there is none to scrub.
func scrubs(bound []Binding) []Binding {
	var out []Binding
	for _, b := range bound {
		if b.Marker != "" && len(b.Value) >= MinScrub {
			out = append(out, Binding{Name: b.Name, Marker: b.Value, Value: b.Marker, Body: true})
		}
	}
	return out
}

// askIdentity asks the server for an uncompressed body, which can be
// scrubbed (sc: scrubs' answer).
func askIdentity(req *http.Request, sc []Binding) {
	if len(sc) > 0 {
		req.Header.Set("Accept-Encoding", "identity")
	}
}

// errUnscrubbable is an answer the boundary cannot read to scrub.
type errUnscrubbable struct{ coding string }

func (e errUnscrubbable) Error() string {
	return fmt.Sprintf("the server answered with content coding %q, which the boundary cannot read to keep the secret out of the answer (it asked for identity); the answer was not passed on", e.coding)
}

// scrubResponse makes resp carry markers where it carried sc's values (sc:
// scrubs' answer): its headers at once, its body as it is read. A body of
// a stated length up to MaxBufferedBody is read whole and keeps a (new)
// stated length; any other is streamed with none (chunked when the
// sandbox's request allows it, else closed at its end).
func scrubResponse(resp *http.Response, req *http.Request, sc []Binding, u *usage) error {
	if len(sc) == 0 {
		return nil
	}
	for k, vs := range resp.Header {
		for i, v := range vs {
			resp.Header[k][i] = scrubString(v, sc, u)
		}
	}
	if req.Method == http.MethodHead || resp.Body == nil || resp.Body == http.NoBody || resp.ContentLength == 0 {
		return nil
	}
	decoded, err := decode(resp)
	if err != nil {
		return err
	}
	if !decoded && resp.ContentLength > 0 && resp.ContentLength <= MaxBufferedBody {
		b, err := io.ReadAll(io.LimitReader(resp.Body, resp.ContentLength+1))
		resp.Body.Close()
		if err != nil || int64(len(b)) != resp.ContentLength {
			return fmt.Errorf("reading the server's answer (%d of %d bytes): %v", len(b), resp.ContentLength, err)
		}
		b = []byte(scrubString(string(b), sc, u))
		resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
		resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
		return nil
	}
	resp.Body = &replacer{src: resp.Body, bound: sc, used: u}
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
	resp.TransferEncoding = nil
	if req.ProtoAtLeast(1, 1) {
		resp.TransferEncoding = []string{"chunked"}
	} else {
		resp.Close = true
	}
	return nil
}

// decode undoes a gzip or deflate content coding (the server compressed
// though it was asked not to); says whether it did.
func decode(resp *http.Response) (bool, error) {
	ce := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding")))
	var r io.Reader
	var err error
	switch ce {
	case "", "identity":
		return false, nil
	case "gzip", "x-gzip":
		r, err = gzip.NewReader(resp.Body)
	case "deflate":
		r, err = zlib.NewReader(resp.Body)
	default:
		return false, errUnscrubbable{ce}
	}
	if err != nil {
		return false, fmt.Errorf("the server's %s answer: %w", ce, err)
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{r, resp.Body}
	resp.Header.Del("Content-Encoding")
	return true, nil
}

// scrubString is s with sc's values as their markers; u hears of each.
func scrubString(s string, sc []Binding, u *usage) string {
	for _, b := range sc {
		if strings.Contains(s, b.Marker) {
			s = strings.ReplaceAll(s, b.Marker, b.Value)
			u.add(b.Name)
		}
	}
	return s
}
