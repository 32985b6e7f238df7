package enrol

import (
	"crypto/x509"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/yamux"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/nodeapi/remote"
)

// NodeHeader names the node dialling GET /v1/nodes/tunnel; its
// certificate must say the same.
const NodeHeader = "X-Sandstorm-Node"

// Tunnel is a node's tunnel as the master holds it once it is up: the
// master's calls to the node go through Client, and the tunnel is down
// when Session's CloseChan closes.
type Tunnel struct {
	Node    string
	From    string // the address it dialled from
	Client  *remote.Client
	Session *yamux.Session
}

// AcceptTunnel is the master's end of GET /v1/nodes/tunnel. The
// connection's certificate, which the API's TLS has checked against the
// CA, must name the node the request names, and admit (the fleet's own
// say: a node that joined, a certificate not revoked) must let it in;
// then the connection is taken over for the node's session and up is
// given the tunnel. Any refusal is a 403 before anything is taken over.
func AcceptTunnel(admit func(node string, cert *x509.Certificate) error, up func(Tunnel)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := r.Header.Get(NodeHeader)
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || r.TLS.VerifiedChains[0][0].Subject.CommonName != "node "+name {
			errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrForbidden, "a tunnel needs the certificate of a node that joined this master"))
			return
		}
		cert := r.TLS.VerifiedChains[0][0]
		if err := admit(name, cert); err != nil {
			errdefs.WriteHTTP(w, errdefs.Mark(errdefs.ErrForbidden, err))
			return
		}
		if !strings.EqualFold(r.Header.Get("Upgrade"), TunnelUpgrade) {
			errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrBadInput, "Upgrade: %s expected", TunnelUpgrade))
			return
		}
		hj, ok := w.(http.Hijacker)
		if !ok {
			errdefs.WriteHTTP(w, errors.New("the connection cannot be taken over for a tunnel"))
			return
		}
		conn, bw, err := hj.Hijack()
		if err != nil {
			return
		}
		bw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + TunnelUpgrade + "\r\n\r\n")
		bw.Flush()
		conn.SetDeadline(time.Time{})
		sess, err := TunnelSession(conn)
		if err != nil {
			conn.Close()
			return
		}
		up(Tunnel{Node: name, From: r.RemoteAddr, Client: TunnelClient(name, sess, cert.NotAfter), Session: sess})
	}
}
