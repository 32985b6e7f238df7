package templates

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/dialguard"
)

// A team's build names the image it starts from, and the master pulls
// it: without a check, a team's key could make the master reach what only
// it may (its own loopback services, the node's network, a cloud's
// metadata address at 169.254.169.254) by naming one as a registry, or by
// a registry's redirect there. So a team's pulls dial only addresses the
// boundaries' own dial guard allows a sandbox (dialguard: public unicast,
// checked on the socket, after every resolution), except the mirrors the
// operator configured (--registry-mirror), which are trusted by being
// configured. The operator's own pulls (template create --image) are not
// limited: the operator may name any registry the master reaches.

// teamTransport carries a team's registry requests.
type teamTransport struct {
	// trusted are the configured mirrors' host[:port], as request URLs
	// spell them.
	trusted map[string]bool
	direct  http.RoundTripper
	guarded http.RoundTripper
}

// newTeamTransport is teamTransport over base (nil: go-containerregistry's
// default), guarded by guard (nil: the kernel's routes, dialguard.Guard).
func newTeamTransport(base http.RoundTripper, mirrors map[string]string, guard dialguard.Checker) *teamTransport {
	if base == nil {
		base = remote.DefaultTransport
	}
	if guard == nil {
		guard = &dialguard.Guard{}
	}
	g := remote.DefaultTransport.(*http.Transport).Clone()
	// No proxy: the address dialled must be the registry's own, the one
	// checked.
	g.Proxy = nil
	g.DialContext = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: dialguard.Control(guard, nil)}).DialContext
	t := &teamTransport{trusted: map[string]bool{}, direct: base, guarded: g}
	for _, m := range mirrors {
		t.trusted[m] = true
	}
	return t
}

// RoundTrip sends r to a mirror as is, anywhere else through the guard;
// a redirect is a request of its own, so it is judged again.
func (t *teamTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.trusted[r.URL.Host] {
		return t.direct.RoundTrip(r)
	}
	resp, err := t.guarded.RoundTrip(r)
	var ref *dialguard.Refusal
	if errors.As(err, &ref) {
		// dialguard's words are a sandbox's; say what a team can do.
		return nil, errdefs.Mark(errdefs.ErrForbidden, fmt.Errorf("registry %s: %w; a team's build pulls only from public registries or a mirror the operator configured (serve --registry-mirror)", r.URL.Host, err))
	}
	return resp, err
}
