package inject

import (
	"fmt"
	"io"
	"net"
	"net/http"

	"golang.org/x/net/http2"
)

// serveH2 passes HTTP/2 requests from the sandbox to the server over one
// HTTP/2 connection each way (gRPC among them: streams both ways at once,
// trailers), each request's markers replaced as over HTTP/1.1. It is
// chosen only when the real server chose h2 (Serve mirrors its ALPN), so
// what the sandbox speaks is what the server speaks. It returns when the
// sandbox closes its connection.
func serveH2(in, up net.Conn, bound []Binding, u, back *usage, touch func()) error {
	cc, err := (&http2.Transport{}).NewClientConn(up)
	if err != nil {
		return fmt.Errorf("HTTP/2 to the server: %w", err)
	}
	defer cc.Close()
	sc := scrubs(bound) // once per connection, not per stream
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		touch()
		forwardH2(w, r, cc, bound, sc, u, back)
	})
	(&http2.Server{}).ServeConn(in, &http2.ServeConnOpts{Handler: h})
	return nil
}

// forwardH2 sends one request on and streams its answer back.
func forwardH2(w http.ResponseWriter, r *http.Request, cc *http2.ClientConn, bound, sc []Binding, u, back *usage) {
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.URL.Scheme, out.URL.Host = "https", r.Host
	u.add(Replace(out, bound)...)
	u.add(SetHeaders(out, bound)...)
	askIdentity(out, sc)
	if err := replaceBody(out, bound, u); err != nil {
		http.Error(w, "sandstorm boundary: "+err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := cc.RoundTrip(out)
	if err != nil {
		http.Error(w, "sandstorm boundary: the server: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	if err := scrubResponse(resp, out, sc, back); err != nil {
		http.Error(w, "sandstorm boundary: "+err.Error(), http.StatusBadGateway)
		return
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	// The header and each read are sent at once: a stream's messages
	// (gRPC, server-sent events) must not wait for a buffer to fill, and
	// a client may wait for the header before it sends more.
	rc := http.NewResponseController(w)
	rc.Flush()
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return // the sandbox reset its stream
			}
			rc.Flush()
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			// Reset the sandbox's stream: ending it cleanly would pass
			// a cut answer for a whole one.
			panic(http.ErrAbortHandler)
		}
	}
	// Trailers (gRPC's status) are known only now; TrailerPrefix sends
	// those not announced in the header too.
	for k, vs := range resp.Trailer {
		for i, v := range vs {
			vs[i] = scrubString(v, sc, back)
		}
		w.Header()[http.TrailerPrefix+k] = vs
	}
}
