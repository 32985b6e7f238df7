package meshrouter

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	ma "github.com/multiformats/go-multiaddr"

	"sandstorm/internal/sam/discovery"
	"sandstorm/internal/sam/meshcred"
	"sandstorm/internal/testenv"
)

// mesh is an issuer, the members' verifier with its revocations, and a
// router on loopback.
type mesh struct {
	iss     *meshcred.Issuer
	mu      sync.Mutex
	revoked map[string]bool
	router  *Router
}

func (m *mesh) verify(cred string) (meshcred.Claims, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.iss.KeySet(time.Now()).Verify(cred, time.Now(), func(c meshcred.Claims) bool { return m.revoked[c.Member] })
}

func newMesh(t *testing.T) *mesh {
	t.Helper()
	iss, err := meshcred.NewIssuer("cp")
	if err != nil {
		t.Fatal(err)
	}
	m := &mesh{iss: iss, revoked: map[string]bool{}}
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	key, _ := Identity(priv)
	if m.router, err = New(key, []string{"/ip4/127.0.0.1/tcp/0"}, m.verify, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.router.Close() })
	return m
}

// member is a host whose libp2p key is its mesh key, with a credential
// issued for it.
func (m *mesh) member(t *testing.T, name string) (host.Host, string) {
	t.Helper()
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	key, err := Identity(priv)
	if err != nil {
		t.Fatal(err)
	}
	h, err := libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.EnableRelay())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	cred, _, err := m.iss.Issue(name, pub, 10*time.Minute, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return h, cred
}

func (m *mesh) info() peer.AddrInfo {
	return peer.AddrInfo{ID: m.router.Host.ID(), Addrs: m.router.Host.Addrs()}
}

// TestRelayForMembersOnly: members that presented their own credential
// reserve a slot on the router's relay and reach each other through it;
// a peer with no credential, or with another member's, may not reserve;
// a revoked member is refused at its next reservation; the DHT's routing
// table holds members only.
func TestRelayForMembersOnly(t *testing.T) {
	m := newMesh(t)
	m.router.Gate.grace = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, credA := m.member(t, "node-a")
	c, credC := m.member(t, "node-c")
	thief, _ := m.member(t, "thief")
	for _, h := range []host.Host{a, c, thief} {
		if err := h.Connect(ctx, m.info()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Present(ctx, thief, m.router.Host.ID(), credA); err == nil {
		t.Fatal("a credential bound to another member's key was accepted")
	}
	if _, err := client.Reserve(ctx, thief, m.info()); err == nil {
		t.Error("a peer with no credential of its own reserved a relay slot")
	}
	for name, p := range map[string]struct {
		h    host.Host
		cred string
	}{"a": {a, credA}, "c": {c, credC}} {
		ans, err := Present(ctx, p.h, m.router.Host.ID(), p.cred)
		if err != nil {
			t.Fatalf("member %s presenting its credential: %v", name, err)
		}
		// The router's epoch, the same to every member of one run.
		if ans.Epoch == "" || ans.Epoch != m.router.Gate.Epoch() {
			t.Errorf("member %s got epoch %q, the router's is %q", name, ans.Epoch, m.router.Gate.Epoch())
		}
	}
	if _, err := client.Reserve(ctx, a, m.info()); err != nil {
		t.Fatalf("a member's reservation: %v", err)
	}

	// c reaches a through the relay: a circuit address of a on the router.
	circuit, _ := ma.NewMultiaddr("/p2p/" + m.router.Host.ID().String() + "/p2p-circuit")
	var addrs []ma.Multiaddr
	for _, ra := range m.router.Host.Addrs() {
		addrs = append(addrs, ra.Encapsulate(circuit))
	}
	a.SetStreamHandler("/sam/test/echo", func(s network.Stream) { s.Write([]byte("hi")); s.Close() })
	c.Peerstore().ClearAddrs(a.ID())
	if err := c.Connect(ctx, peer.AddrInfo{ID: a.ID(), Addrs: addrs}); err != nil {
		t.Fatalf("a member through the relay to another: %v", err)
	}
	for _, conn := range c.Network().ConnsToPeer(a.ID()) {
		if _, err := conn.RemoteMultiaddr().ValueForProtocol(ma.P_CIRCUIT); err != nil {
			t.Errorf("c's connection to a is not through the relay: %s", conn.RemoteMultiaddr())
		}
	}
	s, err := c.NewStream(network.WithAllowLimitedConn(ctx, "test"), a.ID(), "/sam/test/echo")
	if err != nil {
		t.Fatalf("a stream over the relayed connection: %v", err)
	}
	buf := make([]byte, 2)
	if _, err := s.Read(buf); err != nil || string(buf) != "hi" {
		t.Errorf("over the relay: %q, %v", buf, err)
	}
	s.Close()

	if !m.router.Gate.Admitted(a.ID()) || m.router.Gate.Admitted(thief.ID()) {
		t.Error("the gate's view of a and the thief is wrong")
	}
	m.mu.Lock()
	m.revoked["node-a"] = true
	m.mu.Unlock()
	if _, err := client.Reserve(ctx, a, m.info()); err == nil {
		t.Error("a revoked member reserved a relay slot")
	}
	for _, p := range m.router.DHT.RoutingTable().ListPeers() {
		if p == thief.ID() {
			t.Error("a peer with no credential is in the router's DHT routing table")
		}
	}
	// Past the grace, the router has hung up on the peer that never
	// presented a credential of its own, and kept the member.
	testenv.WaitFor(t, 10*time.Second, "the router disconnects the thief", func() bool {
		return m.router.Host.Network().Connectedness(thief.ID()) != network.Connected
	})
	if m.router.Host.Network().Connectedness(c.ID()) != network.Connected {
		t.Error("the router hung up on a member")
	}
}

// TestDHTAnswersMembersOnly: a peer connected to the router but with no
// credential (inside its grace, when the routing-table filter has not
// yet had a reason to drop it) can neither read the provider records
// members published nor write one of its own; a member can do both, and
// finds only the members' records.
func TestDHTAnswersMembersOnly(t *testing.T) {
	m := newMesh(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, credA := m.member(t, "node-a")
	b, credB := m.member(t, "node-b")
	thief, _ := m.member(t, "thief")
	var refused []string
	var mu sync.Mutex
	m.router.Gate.OnRefusal(func(p peer.ID, why string) {
		mu.Lock()
		refused = append(refused, p.String()+": "+why)
		mu.Unlock()
	})
	client := func(h host.Host, cred string) *dht.IpfsDHT {
		t.Helper()
		if err := h.Connect(ctx, m.info()); err != nil {
			t.Fatal(err)
		}
		if cred != "" {
			if _, err := Present(ctx, h, m.router.Host.ID(), cred); err != nil {
				t.Fatal(err)
			}
		}
		d, err := dht.New(h, dht.Mode(dht.ModeClient), dht.ProtocolPrefix(discovery.ProtocolPrefix), dht.BootstrapPeers(m.info()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		d.RoutingTable().TryAddPeer(m.router.Host.ID(), true, false)
		return d
	}
	da, db, dt := client(a, credA), client(b, credB), client(thief, "")
	key := discovery.Key("notes")
	if err := da.Provide(ctx, key, true); err != nil {
		t.Fatalf("a member's provide: %v", err)
	}
	// ADD_PROVIDER is a one-way message: Provide returns once it is sent,
	// not once the router has stored it.
	testenv.WaitFor(t, 10*time.Second, "the router stores the member's record", func() bool {
		ps, _ := m.router.DHT.ProviderStore().GetProviders(ctx, key.Hash())
		return len(ps) > 0
	})
	// The thief's own record goes nowhere: the router resets its
	// ADD_PROVIDER stream (Provide may still report success, as a
	// provide to no peer does), and says so.
	dt.Provide(ctx, key, true)
	thiefRefused := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range refused {
			if strings.HasPrefix(r, thief.ID().String()) && strings.Contains(r, "/sam/kad/") {
				return true
			}
		}
		return false
	}
	testenv.WaitFor(t, 10*time.Second, "the router refuses the thief's DHT stream", thiefRefused)
	if ps, _ := m.router.DHT.ProviderStore().GetProviders(ctx, key.Hash()); len(ps) != 1 || ps[0].ID != a.ID() {
		t.Errorf("the router's records of the name: %v, want only node-a's", ps)
	}
	var got []peer.ID
	for ai := range db.FindProvidersAsync(ctx, key, 0) {
		got = append(got, ai.ID)
	}
	if len(got) != 1 || got[0] != a.ID() {
		t.Errorf("a member found providers %v, want only node-a %s (thief %s)", got, a.ID(), thief.ID())
	}
	// (Its own record is in its own provider store, which a lookup
	// reads first: only a member's would have come from the router.)
	for ai := range dt.FindProvidersAsync(ctx, key, 0) {
		if ai.ID != thief.ID() {
			t.Errorf("a peer with no credential read a member's provider record: %s", ai.ID)
		}
	}
}
