// Package meshrouter is the mesh's router (issue 17, item 2; sam-router):
// a well-known libp2p peer that runs the mesh's DHT in server mode under
// its own protocol prefix and a circuit relay (v2) for members that cannot
// reach each other — both for members only.
//
// Who is a member: a peer that presented a credential (internal/sam/meshcred)
// bound to the very key of its libp2p identity. A member's libp2p key is
// its Ed25519 mesh key (Identity), so the connection's own handshake,
// which proves the peer holds the key of its peer ID, is also the proof
// that it holds the key the credential names: a credential copied by
// another peer is refused (its key is not that peer's).
//
// What members only may do here:
//   - reserve a relay slot, and be the source or the destination of a
//     relayed connection (the relay's ACL, Gate);
//   - be in the DHT's routing table, and be asked by it (its routing
//     table and query filters), and be answered by it (Guard on its
//     stream handlers): a peer in its grace reads and writes no record;
//   - stay connected: a peer that has presented no good credential
//     within Grace of connecting is disconnected.
//
// A member's credential is checked again on every admission question
// (every reservation, every relayed connection, every routing-table
// entry), with the verifier's current keys and revocations, so a
// revocation takes effect at the next question, not at the credential's
// expiry.
package meshrouter

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"

	"sandstorm/internal/sam/meshcred"
)

// CredentialProtocol is the stream on which a peer presents its
// credential: one line, the credential; the answer one line, "ok" or why
// not, and after "ok" the answering peer's own credential on a second
// line (empty if it has none to give), so that one exchange proves each
// side a member to the other (a member calling another checks whom it
// calls as much as it is checked), and its epoch on a third: a token
// made anew each time the peer starts. A router's records live only in
// its memory, so a member that finds a router's epoch changed knows the
// router lost what the member published there (issue 29: a restart seen
// only as a reconnection left a router with no names). A peer of an
// older version sends no third line; its epoch is "".
const CredentialProtocol protocol.ID = "/sam/credential/1.0.0"

// Grace is how long a connected peer has to present a good credential.
const Grace = 5 * time.Second

// Identity is a member's libp2p key: its Ed25519 mesh key itself.
func Identity(priv ed25519.PrivateKey) (crypto.PrivKey, error) {
	return crypto.UnmarshalEd25519PrivateKey(priv)
}

// Verify checks a credential (a controlplane.Verifier's or a
// membership.Member's Verify).
type Verify func(credential string) (meshcred.Claims, error)

// Gate knows which peers are members: those that presented a credential
// bound to their own key, checked again on every question.
type Gate struct {
	verify Verify
	grace  time.Duration // Grace; shorter in tests
	epoch  string        // this process's: see CredentialProtocol
	mu     sync.Mutex
	creds  map[peer.ID]string
	// refused, if set, is told of each peer refused (OnRefusal).
	refused atomic.Pointer[func(peer.ID, string)]
}

// OnRefusal registers fn, told of every refusal with why: a credential
// refused on CredentialProtocol, a peer disconnected for presenting none
// in time, a relay reservation or connection refused. sam-one's console
// lists them. It is called on libp2p's goroutines and must not block.
func (g *Gate) OnRefusal(fn func(p peer.ID, why string)) { g.refused.Store(&fn) }

func (g *Gate) refuse(p peer.ID, why string) {
	if fn := g.refused.Load(); fn != nil {
		(*fn)(p, why)
	}
}

// NewGate returns a gate that checks credentials with verify, with an
// epoch of its own (random: two starts never share one).
func NewGate(verify Verify) *Gate {
	var b [8]byte
	rand.Read(b[:])
	return &Gate{verify: verify, grace: Grace, epoch: hex.EncodeToString(b[:]), creds: map[peer.ID]string{}}
}

// Epoch is the gate's epoch, which Serve gives every peer that presents
// a good credential.
func (g *Gate) Epoch() string { return g.epoch }

// Admitted reports whether p is a member now: its credential, checked
// again with the verifier's current keys and revocations.
func (g *Gate) Admitted(p peer.ID) bool {
	_, ok := g.Member(p)
	return ok
}

// Member is the name of the member p is, checked now as Admitted checks.
func (g *Gate) Member(p peer.ID) (string, bool) {
	g.mu.Lock()
	cred, ok := g.creds[p]
	g.mu.Unlock()
	if !ok {
		return "", false
	}
	c, err := g.check(p, cred)
	if err != nil {
		return "", false
	}
	return c.Member, true
}

// Accept takes cred as p's, if it is good and bound to p's own key (the
// credential a peer answered Present with).
func (g *Gate) Accept(p peer.ID, cred string) error {
	if _, err := g.check(p, cred); err != nil {
		return err
	}
	g.mu.Lock()
	g.creds[p] = cred
	g.mu.Unlock()
	return nil
}

// Forget drops what p presented (it disconnected: it presents again on
// its next connection, with whatever credential it holds then).
func (g *Gate) Forget(p peer.ID) {
	g.mu.Lock()
	delete(g.creds, p)
	g.mu.Unlock()
}

// check verifies cred as p's: good, and bound to p's own key.
func (g *Gate) check(p peer.ID, cred string) (meshcred.Claims, error) {
	c, err := g.verify(cred)
	if err != nil {
		return c, err
	}
	pub, err := crypto.UnmarshalEd25519PublicKey(c.Key)
	if err != nil {
		return c, err
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		return c, err
	}
	if id != p {
		return c, fmt.Errorf("%w: bound to another peer's key (%s), not %s's", meshcred.ErrInvalid, id, p)
	}
	return c, nil
}

// AllowReserve implements the relay's ACLFilter: members only.
func (g *Gate) AllowReserve(p peer.ID, _ ma.Multiaddr) bool {
	if !g.Admitted(p) {
		g.refuse(p, "relay reservation refused: not a member (no good credential presented)")
		return false
	}
	return true
}

// AllowConnect implements the relay's ACLFilter: a member to a member.
func (g *Gate) AllowConnect(src peer.ID, _ ma.Multiaddr, dst peer.ID) bool {
	switch {
	case !g.Admitted(src):
		g.refuse(src, "relayed connection refused: the source is not a member")
	case !g.Admitted(dst):
		g.refuse(src, fmt.Sprintf("relayed connection refused: the destination %s is not a member", dst))
	default:
		return true
	}
	return false
}

// Guard wraps handler so that it serves members only: a stream from a
// peer that is not a member now (no credential presented yet, or one
// revoked since) is reset unread, and the refusal told (OnRefusal).
func (g *Gate) Guard(pid protocol.ID, handler network.StreamHandler) network.StreamHandler {
	return func(s network.Stream) {
		if p := s.Conn().RemotePeer(); !g.Admitted(p) {
			s.Reset()
			g.refuse(p, fmt.Sprintf("%s stream refused: not a member (no good credential presented)", pid))
			return
		}
		handler(s)
	}
}

// Serve takes credentials on h (CredentialProtocol), answering a good
// one with own() (this peer's credential; nil: none), and disconnects a
// peer that has presented no good one within Grace of connecting.
func (g *Gate) Serve(h host.Host, own func() string) {
	h.SetStreamHandler(CredentialProtocol, func(s network.Stream) {
		defer s.Close()
		s.SetDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(io.LimitReader(s, 8<<10)).ReadString('\n')
		p := s.Conn().RemotePeer()
		// A refusal is told (the console's list) before the peer hears
		// it, so whoever sees the peer refused finds it listed
		// (TestSamOne read the list the moment the peer's Present failed).
		if err != nil {
			g.refuse(p, fmt.Sprintf("no credential: %v", err))
			fmt.Fprintf(s, "no credential: %v\n", err)
			return
		}
		cred := strings.TrimSpace(line)
		if _, err := g.check(p, cred); err != nil {
			g.refuse(p, fmt.Sprintf("credential refused: %v", err))
			fmt.Fprintf(s, "refused: %v\n", err)
			return
		}
		g.mu.Lock()
		g.creds[p] = cred
		g.mu.Unlock()
		mine := ""
		if own != nil {
			mine = own()
		}
		io.WriteString(s, "ok\n"+mine+"\n"+g.epoch+"\n")
	})
	h.Network().Notify(&network.NotifyBundle{
		ConnectedF: func(n network.Network, c network.Conn) {
			p := c.RemotePeer()
			time.AfterFunc(g.grace, func() {
				if !g.Admitted(p) && n.Connectedness(p) == network.Connected {
					g.refuse(p, fmt.Sprintf("disconnected: no good credential within %v of connecting", g.grace))
					n.ClosePeer(p)
				}
			})
		},
		DisconnectedF: func(n network.Network, c network.Conn) {
			// A peer presents again on its next connection; what it
			// presented on this one is not kept for ever.
			if n.Connectedness(c.RemotePeer()) != network.Connected {
				g.Forget(c.RemotePeer())
			}
		},
	})
}

// Answer is what a peer gives back for a good credential.
type Answer struct {
	// Credential is the peer's own (empty if it has none to give), for
	// the caller to Accept if it must know the peer a member.
	Credential string
	// Epoch names the peer's current run (Gate.Epoch); "" from a peer
	// that sends none.
	Epoch string
}

// Present gives p (a router, or any member that gates) this host's
// credential, and returns p's answer as an error unless it is "ok".
func Present(ctx context.Context, h host.Host, p peer.ID, credential string) (Answer, error) {
	s, err := h.NewStream(network.WithAllowLimitedConn(ctx, "sam credential"), p, CredentialProtocol)
	if err != nil {
		return Answer{}, err
	}
	defer s.Close()
	if dl, ok := ctx.Deadline(); ok {
		s.SetDeadline(dl)
	}
	if _, err := io.WriteString(s, credential+"\n"); err != nil {
		return Answer{}, err
	}
	s.CloseWrite()
	rd := bufio.NewReader(io.LimitReader(s, 12<<10))
	line, err := rd.ReadString('\n')
	if err != nil {
		return Answer{}, fmt.Errorf("presenting the credential to %s: %w", p, err)
	}
	if line = strings.TrimSpace(line); line != "ok" {
		return Answer{}, fmt.Errorf("%s: %s", p, line)
	}
	// An old peer may give no credential, or no epoch.
	theirs, _ := rd.ReadString('\n')
	epoch, _ := rd.ReadString('\n')
	return Answer{Credential: strings.TrimSpace(theirs), Epoch: strings.TrimSpace(epoch)}, nil
}
