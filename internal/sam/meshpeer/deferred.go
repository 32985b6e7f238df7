package meshpeer

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"sandstorm/internal/sam/meshnode"
)

// ErrNotJoined is what a Deferred answers before its peer has joined.
var ErrNotJoined = errors.New("meshpeer: not joined to the mesh yet (no router has taken this member so far)")

// Deferred is a meshnode.Mesh whose Peer is set once it has joined. The
// node is built first, since the peer serves the node's MeshHandler and
// publishes its Names; and the node serves its own agents whether or not
// a router can be reached yet.
type Deferred struct{ p atomic.Pointer[Peer] }

// Set makes p the mesh.
func (d *Deferred) Set(p *Peer) { d.p.Store(p) }

// Peer is the peer set, or nil.
func (d *Deferred) Peer() *Peer { return d.p.Load() }

// Providers implements meshnode.Mesh.
func (d *Deferred) Providers(ctx context.Context, name string) ([]string, error) {
	p := d.p.Load()
	if p == nil {
		return nil, ErrNotJoined
	}
	return p.Providers(ctx, name)
}

// Do implements meshnode.Mesh.
func (d *Deferred) Do(member string, req *http.Request) (*http.Response, error) {
	p := d.p.Load()
	if p == nil {
		return nil, fmt.Errorf("%w: %w", meshnode.ErrNotSent, ErrNotJoined)
	}
	return p.Do(member, req)
}
