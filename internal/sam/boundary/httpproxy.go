package boundary

import (
	"bufio"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"

	"sandstorm/internal/sam/policy"
)

// maxHeaderBytes bounds what an HTTP handshake may send before its request
// is complete.
const maxHeaderBytes = 32 << 10

var errHeaderTooLarge = errors.New("request header too large")

// recordingReader keeps what it reads (up to limit), so a request that
// turns out to be for the mesh can be parsed again by the mesh's server.
type recordingReader struct {
	r     io.Reader
	buf   []byte
	limit int
}

func (rr *recordingReader) Read(p []byte) (int, error) {
	room := rr.limit - len(rr.buf)
	if room <= 0 {
		return 0, errHeaderTooLarge
	}
	if len(p) > room {
		p = p[:room]
	}
	n, err := rr.r.Read(p)
	rr.buf = append(rr.buf, p[:n]...)
	return n, err
}

// serveHTTP runs an HTTP flow: CONNECT host:port (RFC 9110 §9.3.6), or an
// absolute-form request for a mesh name (a client whose HTTP proxy is the
// boundary), which the boundary serves itself. Anything else is 405.
func (b *Boundary) serveHTTP(f *flow, r io.Reader) {
	rec := &recordingReader{r: r, limit: maxHeaderBytes}
	br := bufio.NewReaderSize(rec, 2048)
	req, err := http.ReadRequest(br)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errHeaderTooLarge) {
			status = http.StatusRequestHeaderFieldsTooLarge
		}
		b.badHTTPHandshake(f, err, status, "bad_request", "malformed request")
		return
	}
	if len(b.cfg.Users) > 0 && !proxyAuthOK(req.Header.Get("Proxy-Authorization"), b.cfg.Users) {
		b.badHTTPHandshake(f, errors.New("proxy authentication required"),
			http.StatusProxyAuthRequired, "proxy_authentication_required", "proxy authentication required", `Proxy-Authenticate: Basic realm="sam-box"`)
		return
	}
	if req.Method == http.MethodConnect {
		host, port, err := splitHostPort(req.RequestURI)
		if err != nil {
			b.badHTTPHandshake(f, err, http.StatusBadRequest, "bad_request", "CONNECT wants host:port")
			return
		}
		a, ok := b.admitHTTP(f, host, port)
		if !ok {
			return
		}
		if _, err := io.WriteString(f.c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			f.abort()
			return
		}
		var prefix []byte
		if n := br.Buffered(); n > 0 {
			p, _ := br.Peek(n)
			prefix = append([]byte(nil), p...)
		}
		f.c.SetDeadline(noDeadline)
		b.run(f, &a, prefix)
		return
	}
	if req.URL.IsAbs() && req.URL.Scheme == "http" {
		host := req.URL.Hostname()
		if d, err := policy.Classify(host); err == nil && d.Kind != policy.KindExternal {
			port := uint16(80)
			if p := req.URL.Port(); p != "" {
				n, err := strconv.ParseUint(p, 10, 16)
				if err != nil {
					b.badHTTPHandshake(f, err, http.StatusBadRequest, "bad_request", "bad port")
					return
				}
				port = uint16(n)
			}
			a, ok := b.admitHTTP(f, host, port)
			if !ok {
				return
			}
			f.c.SetDeadline(noDeadline)
			// Everything read so far (the request and whatever followed)
			// is parsed again by the mesh's HTTP server.
			b.logFlow(&a, 0, 0)
			b.serveMesh(f, &a, rec.buf)
			return
		}
	}
	b.badHTTPHandshake(f, fmt.Errorf("method %s not allowed", req.Method),
		http.StatusMethodNotAllowed, "method_not_allowed", "this proxy accepts CONNECT only (and plain HTTP to mesh names)", "Allow: CONNECT")
}

// badHTTPHandshake counts a handshake that failed with err, answers it
// (status, code, msg and any extra header lines) and ends the flow.
func (b *Boundary) badHTTPHandshake(f *flow, err error, status int, code, msg string, extra ...string) {
	b.handshakeError(f.c, err)
	writeHTTPError(f.c, status, code, msg, extra...)
	f.end()
}

// admitHTTP admits f to host:port; a refusal is answered with its status
// and ends the flow, and ok is false.
func (b *Boundary) admitHTTP(f *flow, host string, port uint16) (a admission, ok bool) {
	a = b.admit(f, host, port)
	if a.out != outAllowed {
		status, code, msg := httpRefusal(&a)
		writeHTTPError(f.c, status, code, msg)
		f.end()
		return a, false
	}
	return a, true
}

func splitHostPort(s string) (string, uint16, error) {
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	if host == "" {
		return "", 0, errors.New("empty host")
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return host, uint16(n), nil
}

func proxyAuthOK(h string, users map[string]string) bool {
	enc, ok := strings.CutPrefix(h, "Basic ")
	if !ok {
		return false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return false
	}
	user, pass, ok := strings.Cut(string(raw), ":")
	if !ok {
		return false
	}
	want, known := users[user]
	return subtle.ConstantTimeCompare([]byte(want), []byte(pass)) == 1 && known
}

// httpRefusal is the status for an admission that did not succeed.
func httpRefusal(a *admission) (int, string, string) {
	switch a.out {
	case outDenied:
		return http.StatusForbidden, "destination_not_allowed", "destination not allowed for this sandbox"
	case outUnreachable:
		if a.timeout {
			return http.StatusGatewayTimeout, "destination_timeout", "destination did not answer in time"
		}
		return http.StatusBadGateway, "destination_unreachable", "destination unreachable"
	case outRefused:
		return http.StatusBadGateway, "connection_refused", "destination refused the connection"
	default:
		return http.StatusBadGateway, "destination_error", "could not open the destination"
	}
}

// errorBody is an error in the shape OpenAI-compatible clients read.
func errorBody(code, msg string) []byte {
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	e.Error.Message, e.Error.Type = msg, code
	out, _ := json.Marshal(e)
	return append(out, '\n')
}

// writeHTTPError writes a complete response that closes the connection.
func writeHTTPError(w io.Writer, status int, code, msg string, extra ...string) {
	body := errorBody(code, msg)
	var sb strings.Builder
	fmt.Fprintf(&sb, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n", status, http.StatusText(status), len(body))
	for _, h := range extra {
		sb.WriteString(h)
		sb.WriteString("\r\n")
	}
	sb.WriteString("\r\n")
	sb.Write(body)
	io.WriteString(w, sb.String())
}
