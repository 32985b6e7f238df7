package meshpeer

// Keeping a member joined to its routers (issue 29). One loop per router,
// so that a router that hangs never delays another's; each is woken at
// once when its router's connection drops (the host's disconnect
// notification), and otherwise looks at its router every CheckInterval.
//
// A router keeps provider records in memory only, so the member publishes
// its names there whenever the router may have lost them:
//   - the member was admitted again (its connection had dropped);
//   - the router is a run the member has not published to (its epoch,
//     given in the credential exchange, changed: it restarted) — however
//     the member came to be connected again, by this loop or by a call's
//     dial through it;
//   - a record of the member's is missing when it asks (every
//     verifyInterval; a GET_PROVIDERS message per name, to that router);
//   - its names changed, or republishInterval passed.
//
// Records go to each router directly (an ADD_PROVIDER message), not by a
// DHT walk: the routers are the DHT's only servers, and a member that
// joins every router has no one else to ask or tell.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	"github.com/libp2p/go-libp2p/p2p/protocol/ping"

	"sandstorm/api"
	"sandstorm/internal/sam/discovery"
)

const (
	// CheckInterval is how often a joined router is looked at when nothing
	// happened: pinged, its slot renewed when due, records checked when
	// due. (A router's restart is not waited for: its loop is woken when
	// its connection drops.)
	CheckInterval = 2 * time.Second
	// verifyInterval is how often a member asks each router whether it
	// still holds the member's records: a loss the epoch does not show is
	// repaired within about this.
	verifyInterval = 10 * time.Second
	// republishInterval renews provider records well within kad-dht's
	// provider record lifetime (48 h), and refreshes the addresses they
	// carry.
	republishInterval = 10 * time.Minute
	// renewReservation is how long before its expiry a relay slot is
	// reserved again (a reservation lasts an hour, relay v2's default).
	renewReservation = 15 * time.Minute
	// joinTimeout bounds one attempt at a router: dial, credentials both
	// ways, reservation.
	joinTimeout = 5 * time.Second
	// pingTimeout and pingMisses: a router that answers no ping within
	// pingTimeout pingMisses times in a row is taken for gone and its
	// connection closed, so that the member dials it again (and calls
	// go through another router) instead of waiting for TCP to give up,
	// which after a partition takes many minutes.
	pingTimeout = 2 * time.Second
	pingMisses  = 2
	// retryMin and retryMax bound the wait between attempts at a router
	// that is away: doubling from retryMin, so a router back from a
	// restart is joined again within retryMax of answering.
	retryMin = 100 * time.Millisecond
	retryMax = time.Second
	// publishTimeout bounds putting or checking a member's records on one
	// router.
	publishTimeout = 5 * time.Second
)

// router is one router a member joins, and how the member stands with it.
type router struct {
	info peer.AddrInfo
	kick chan struct{}

	mu sync.Mutex
	st routerState
}

type routerState struct {
	Joined bool
	Ever   bool      // joined once at least
	Since  time.Time // joined at, or lost at
	Epoch  string    // the run it was joined in
	// unknown counts joins to a router that gives no epoch (an older
	// version): each is taken as a new run.
	unknown  int
	Reserved time.Time // the relay slot's expiry
	// PubEpoch is the epoch this member's names were put in, Published
	// those names, at PubAt; Checked is when they were last looked for
	// there, Verified when last found whole.
	PubEpoch  string
	Published []string
	PubAt     time.Time
	Checked   time.Time
	Verified  time.Time
	Misses    int // pings unanswered in a row
	Fails     int // attempts failed in a row
	Rejoins   int
	Republish int
	Err       string
}

func newRouter(ai peer.AddrInfo) *router {
	return &router{info: ai, kick: make(chan struct{}, 1)}
}

func (r *router) snapshot() routerState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st
}

func (r *router) update(f func(*routerState)) {
	r.mu.Lock()
	f(&r.st)
	r.mu.Unlock()
}

// wake asks the router's loop to run now.
func (r *router) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// lost: the router's connection dropped; its loop joins it again now.
func (r *router) lost() {
	r.update(func(s *routerState) {
		if s.Joined {
			s.Joined, s.Since = false, time.Now()
		}
	})
	r.wake()
}

func (r *router) failed(err error) {
	r.update(func(s *routerState) {
		s.Fails++
		s.Err = err.Error()
		if s.Since.IsZero() {
			s.Since = time.Now()
		}
	})
}

func (r *router) status() api.RouterStatus {
	s := r.snapshot()
	addr := ""
	if len(r.info.Addrs) > 0 {
		addr = r.info.Addrs[0].String()
	}
	return api.RouterStatus{
		Addr: addr + "/p2p/" + r.info.ID.String(), Joined: s.Joined, Since: s.Since, Epoch: s.Epoch,
		Published: s.Joined && s.PubEpoch == s.Epoch && s.Epoch != "", Verified: s.Verified,
		Rejoins: s.Rejoins, Republished: s.Republish, Error: s.Err,
	}
}

// Run keeps the member joined to every router until ctx ends.
func (p *Peer) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, r := range p.routers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.keep(ctx, r)
		}()
	}
	wg.Wait()
}

// keep is one router's loop.
func (p *Peer) keep(ctx context.Context, r *router) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-t.C:
		}
		wait := p.tend(ctx, r)
		t.Reset(wait)
	}
}

// tend does what router r needs now and says when to look again.
func (p *Peer) tend(ctx context.Context, r *router) time.Duration {
	if !p.isJoined(r) {
		before := r.snapshot()
		if err := p.joinRouter(ctx, r); err != nil {
			if ctx.Err() != nil {
				return retryMax
			}
			r.failed(err)
			s := r.snapshot()
			if s.Fails == 1 {
				p.log.Warn("meshpeer: cannot join a router; retrying", "router", r.info.ID.String(), "err", err)
			} else {
				p.log.Debug("meshpeer: cannot join a router; retrying", "router", r.info.ID.String(), "err", err, "tries", s.Fails)
			}
			return min(retryMin<<min(s.Fails-1, 10), retryMax)
		}
		s := r.snapshot()
		if before.Ever && !before.Joined {
			p.log.Info("meshpeer: joined the router again", "router", r.info.ID.String(),
				"away", time.Since(before.Since).Round(time.Millisecond).String(), "restarted", before.Epoch != s.Epoch)
		}
	}
	if err := p.publishDue(ctx, r); err != nil {
		if ctx.Err() == nil {
			r.update(func(s *routerState) { s.Err = err.Error() })
			p.log.Warn("meshpeer: publishing on a router failed; retrying", "router", r.info.ID.String(), "err", err)
		}
		return retryMax
	}
	p.renewDue(ctx, r)
	p.ping(ctx, r)
	return CheckInterval
}

// usable: joined, still connected, and the router's credential as it
// gave it still good here — what a lookup or a relayed call needs.
func (p *Peer) usable(r *router) bool {
	s := r.snapshot()
	return s.Joined && p.Host.Network().Connectedness(r.info.ID) == network.Connected && p.gate.Admitted(r.info.ID)
}

// isJoined: usable, and current credentials exchanged on this connection.
// A renewal on either side is taken by joining again on the same
// connection, while the router stays usable: the credentials given before
// still have two thirds of their lives (a member renews at a third), so
// a lookup made meanwhile must not find the member joined to no router
// (it did, for the moment between a renewal and the loop's next look,
// measured: a relapse 3.3 min into every mesh's life).
func (p *Peer) isJoined(r *router) bool {
	return p.usable(r) && p.current(r.info.ID)
}

// joinRouter connects to r, presents this member's credential and checks
// the router's (learning its epoch), and reserves a relay slot, within
// joinTimeout.
func (p *Peer) joinRouter(ctx context.Context, r *router) error {
	ctx, cancel := context.WithTimeout(ctx, joinTimeout)
	defer cancel()
	p.clearBackoff(r.info.ID)
	if err := p.Host.Connect(ctx, r.info); err != nil {
		return err
	}
	ans, err := p.present(ctx, r.info.ID)
	if err != nil {
		return err
	}
	res, err := client.Reserve(ctx, p.Host, r.info)
	if err != nil {
		return fmt.Errorf("reserving a relay slot: %w", err)
	}
	r.update(func(s *routerState) {
		epoch := ans.Epoch
		if epoch == "" {
			s.unknown++
			epoch = fmt.Sprintf("unknown-%d", s.unknown)
		}
		if !s.Joined {
			if s.Ever {
				s.Rejoins++
			}
			s.Since = time.Now()
			// Every admission publishes (issue 29: "on every
			// (re)admission"): a router that kept its epoch may still
			// have dropped what this member gave it while it was away.
			s.PubEpoch = ""
		}
		s.Joined, s.Ever, s.Epoch = true, true, epoch
		s.Reserved, s.Misses, s.Fails, s.Err = res.Expiration, 0, 0, ""
	})
	// A drop between the dial and here was told to lost() before Joined
	// was set: look again.
	if p.Host.Network().Connectedness(r.info.ID) != network.Connected {
		r.lost()
		return errors.New("the connection dropped while joining")
	}
	p.routerJoined()
	return nil
}

// publishDue puts this member's names on r when r may not hold them, and
// checks that it does when a check is due.
func (p *Peer) publishDue(ctx context.Context, r *router) error {
	names := p.names()
	if len(names) == 0 {
		return nil
	}
	s := r.snapshot()
	if s.PubEpoch != s.Epoch || !slices.Equal(names, s.Published) || time.Since(s.PubAt) > republishInterval {
		if err := p.publishTo(ctx, r, names); err != nil {
			return err
		}
		r.update(func(st *routerState) {
			if !st.PubAt.IsZero() {
				st.Republish++
			}
			st.PubEpoch, st.Published, st.PubAt = s.Epoch, names, time.Now()
			// Checked at the next look: the router files a record as it
			// reads the message, which this side does not wait for.
			st.Checked = time.Now().Add(CheckInterval - verifyInterval)
		})
		return nil
	}
	if time.Since(s.Checked) < verifyInterval {
		return nil
	}
	missing, err := p.missing(ctx, r, names)
	r.update(func(st *routerState) { st.Checked = time.Now() })
	if err != nil {
		return fmt.Errorf("asking for this member's records: %w", err)
	}
	if len(missing) == 0 {
		r.update(func(st *routerState) { st.Verified = time.Now() })
		return nil
	}
	p.log.Info("meshpeer: a router no longer holds names of this member; publishing them again", "router", r.info.ID.String(), "names", missing)
	if err := p.publishTo(ctx, r, missing); err != nil {
		return err
	}
	r.update(func(st *routerState) {
		st.Republish++
		st.Checked = time.Now().Add(CheckInterval - verifyInterval)
	})
	return nil
}

// publishTo puts a provider record of this member for each name on r.
func (p *Peer) publishTo(ctx context.Context, r *router, names []string) error {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	self := peer.AddrInfo{ID: p.Host.ID(), Addrs: p.Host.Addrs()}
	for _, n := range names {
		if err := p.msgr.PutProviderAddrs(ctx, r.info.ID, discovery.Key(n).Hash(), self); err != nil {
			return fmt.Errorf("publish %s: %w", n, err)
		}
	}
	return nil
}

// missing is the names of which r holds no record of this member.
func (p *Peer) missing(ctx context.Context, r *router, names []string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	var out []string
	for _, n := range names {
		provs, _, err := p.msgr.GetProviders(ctx, r.info.ID, discovery.Key(n).Hash())
		if err != nil {
			return nil, err
		}
		if !slices.ContainsFunc(provs, func(ai *peer.AddrInfo) bool { return ai.ID == p.Host.ID() }) {
			out = append(out, n)
		}
	}
	return out, nil
}

// renewDue reserves r's relay slot again before it expires.
func (p *Peer) renewDue(ctx context.Context, r *router) {
	if time.Until(r.snapshot().Reserved) > renewReservation {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, joinTimeout)
	defer cancel()
	res, err := client.Reserve(ctx, p.Host, r.info)
	if err != nil {
		p.log.Warn("meshpeer: renewing a relay slot failed; retrying", "router", r.info.ID.String(), "err", err)
		return
	}
	r.update(func(s *routerState) { s.Reserved = res.Expiration })
}

// ping checks that r still answers; after pingMisses misses in a row its
// connection is closed, which wakes the loop to join it again.
func (p *Peer) ping(ctx context.Context, r *router) {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	var err error
	select {
	case res := <-ping.Ping(ctx, p.Host, r.info.ID):
		err = res.Error
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err == nil {
		r.update(func(s *routerState) { s.Misses = 0 })
		return
	}
	if ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	var misses int
	r.update(func(s *routerState) { s.Misses++; misses = s.Misses })
	if misses >= pingMisses {
		p.log.Warn("meshpeer: a router stopped answering; closing its connection to join it again", "router", r.info.ID.String(), "err", err)
		p.Host.Network().ClosePeer(r.info.ID)
		r.lost()
	}
}
