package meshpeer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	libp2phttp "github.com/libp2p/go-libp2p/p2p/http"
	ma "github.com/multiformats/go-multiaddr"

	"sandstorm/internal/sam/meshnode"
	"sandstorm/internal/sam/meshrouter"
)

const (
	// connectTimeout bounds a dial and credential exchange with a member.
	connectTimeout = 10 * time.Second
	// streamTimeout bounds opening a stream on a connection that is up:
	// one relayed through a router that is cut off hangs instead of
	// failing, and the call is then sent over a new connection.
	streamTimeout = 3 * time.Second
)

// Do implements meshnode.Mesh: req to member's mesh handler over a
// libp2p stream, once both are known members on the current connection.
//
// A call the member cannot have acted on is sent once more, over a new
// connection — through another router if the one it was relayed through
// is gone — so an agent sees no error for a router it did not need: one
// whose connection turned out dead before a stream opened (its loss not
// seen yet), or whose request was cut off while it was written (the
// member never had a whole request: its handlers read the whole body
// before they act). A request that was written whole is never sent
// twice. An error that wraps meshnode.ErrNotSent means the member did
// not get a whole request.
func (p *Peer) Do(member string, req *http.Request) (*http.Response, error) {
	id, err := peer.Decode(member)
	if err != nil {
		return nil, fmt.Errorf("meshpeer: %q is not a peer ID: %w", member, err)
	}
	ctx := req.Context()
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			p.log.Debug("meshpeer: a call was not sent; sending it over a new connection", "member", id.String(), "err", err)
			p.Host.Network().ClosePeer(id)
			if req, err = rewind(req); err != nil {
				return nil, err
			}
		}
		var resp *http.Response
		resp, err = p.try(ctx, id, req)
		if err == nil || attempt > 0 || ctx.Err() != nil || !errors.Is(err, meshnode.ErrNotSent) {
			return resp, err
		}
	}
}

// try is one attempt of Do.
func (p *Peer) try(ctx context.Context, id peer.ID, req *http.Request) (*http.Response, error) {
	if err := p.connect(ctx, id); err != nil {
		return nil, fmt.Errorf("%w: %w", meshnode.ErrNotSent, err)
	}
	s, err := p.openStream(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%w: meshpeer: no stream to member %s: %w", meshnode.ErrNotSent, id, err)
	}
	return p.send(s, req)
}

// rewind is req with its body from the start, for a second attempt.
func rewind(req *http.Request) (*http.Request, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return req, nil
	}
	if req.GetBody == nil {
		return nil, fmt.Errorf("%w: meshpeer: the call's body cannot be read again", meshnode.ErrNotSent)
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", meshnode.ErrNotSent, err)
	}
	r := req.Clone(req.Context())
	r.Body = body
	return r, nil
}

func (p *Peer) openStream(ctx context.Context, id peer.ID) (network.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, streamTimeout)
	defer cancel()
	return p.Host.NewStream(ctx, id, libp2phttp.ProtocolIDForMultistreamSelect)
}

// send writes req on s as HTTP/1.1 (libp2p's HTTP-over-streams, one
// request a stream) and reads the answer; the body closes the stream. A
// failure while the request was being written wraps meshnode.ErrNotSent.
func (p *Peer) send(s network.Stream, req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.URL.Path = httpPrefix + req.URL.Path
	req.URL.RawPath = ""
	req.Header.Set("Connection", "close")
	written := make(chan error, 1)
	go func() {
		err := req.Write(s)
		if err == nil {
			s.CloseWrite()
		}
		if req.Body != nil {
			req.Body.Close()
		}
		written <- err
	}()
	if dl, ok := req.Context().Deadline(); ok {
		s.SetReadDeadline(dl)
	}
	stop := context.AfterFunc(req.Context(), func() { s.Reset() })
	resp, err := http.ReadResponse(bufio.NewReader(s), req)
	if err != nil {
		stop()
		s.Reset()
		if werr := <-written; werr != nil && req.Context().Err() == nil {
			return nil, fmt.Errorf("%w: meshpeer: the request was cut off as it was written: %w", meshnode.ErrNotSent, werr)
		}
		return nil, err
	}
	resp.Body = &streamBody{ReadCloser: resp.Body, s: s, stop: stop}
	return resp, nil
}

type streamBody struct {
	io.ReadCloser
	s    network.Stream
	stop func() bool
}

func (b *streamBody) Close() error {
	b.stop()
	b.ReadCloser.Close()
	return b.s.Close()
}

// connect makes sure there is a connection to id — its own addresses
// first, then a circuit through each joined router — and that both sides
// have presented credentials on it; and that id is a member now.
func (p *Peer) connect(ctx context.Context, id peer.ID) error {
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if p.Host.Network().Connectedness(id) != network.Connected {
		if err := p.dial(cctx, id); err != nil {
			return fmt.Errorf("meshpeer: cannot reach member %s: %w", id, err)
		}
	}
	if p.current(id) {
		return nil
	}
	if _, err := p.present(cctx, id); err != nil {
		return fmt.Errorf("meshpeer: %w", err)
	}
	if !p.gate.Admitted(id) {
		return fmt.Errorf("meshpeer: %s is no longer a member (its credential does not verify now)", id)
	}
	return nil
}

// dial connects to member id: its own addresses, and a circuit through
// each joined router. A dial that is still waiting (on an address of the
// member's that drops packets: 5 s to give up) when a router is joined
// starts again at once, so that it goes through that router instead of
// failing after the router came back (issue 29: a call begun while the
// router restarted failed 5 s later).
func (p *Peer) dial(ctx context.Context, id peer.ID) error {
	for {
		for _, r := range p.circuitRouters() {
			circuit := ma.StringCast("/p2p/" + r.info.ID.String() + "/p2p-circuit")
			for _, a := range r.info.Addrs {
				p.Host.Peerstore().AddAddr(id, a.Encapsulate(circuit), peerstore.TempAddrTTL)
			}
		}
		p.clearBackoff(id)
		joined := p.joinedSignal()
		actx, cancel := context.WithCancel(ctx)
		stop := make(chan struct{})
		go func() {
			select {
			case <-joined:
				cancel()
			case <-stop:
			}
		}()
		err := p.Host.Connect(actx, peer.AddrInfo{ID: id})
		close(stop)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		select {
		case <-joined:
			p.log.Debug("meshpeer: a router was joined during a dial; dialling again", "member", id.String())
		default:
			return err
		}
	}
}

// circuitRouters are the routers to relay a call through: those joined
// now. A router that is away is dialled by its own loop only (at most
// once a second), never by every call meanwhile.
func (p *Peer) circuitRouters() []*router {
	var out []*router
	for _, r := range p.routers {
		if p.usable(r) {
			out = append(out, r)
		}
	}
	return out
}

// serveHTTP admits a call from a member whose credential verifies now,
// naming it to the handler in meshnode.HeaderMember.
func (p *Peer) serveHTTP(w http.ResponseWriter, r *http.Request) {
	from := libp2phttp.ClientPeerID(r)
	name, ok := p.gate.Member(from)
	if !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, `{"error":{"message":"not a member: present a credential on %s first","type":"permission_error","code":"not_a_member"}}`+"\n", meshrouter.CredentialProtocol)
		return
	}
	r.Header.Set(meshnode.HeaderMember, name)
	p.cfg.Handler.ServeHTTP(w, r)
}
