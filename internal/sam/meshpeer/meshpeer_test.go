package meshpeer

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/peer"
	libp2phttp "github.com/libp2p/go-libp2p/p2p/http"

	"sandstorm/internal/sam/meshcred"
	"sandstorm/internal/sam/meshnode"
	"sandstorm/internal/sam/meshrouter"
	"sandstorm/internal/testenv"
)

// testMesh is an issuer with its revocations, and a router on loopback
// that is a member itself.
type testMesh struct {
	t       *testing.T
	iss     *meshcred.Issuer
	mu      sync.Mutex
	revoked map[string]bool
	rpriv   ed25519.PrivateKey
	router  *meshrouter.Router
	routers []peer.AddrInfo
}

func (m *testMesh) verify(c string) (meshcred.Claims, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.iss.KeySet(time.Now()).Verify(c, time.Now(), func(c meshcred.Claims) bool { return m.revoked[c.Member] })
}

func (m *testMesh) revoke(name string) {
	m.mu.Lock()
	m.revoked[name] = true
	m.mu.Unlock()
}

func (m *testMesh) cred(name string, pub ed25519.PublicKey) string {
	c, _, err := m.iss.Issue(name, pub, 10*time.Minute, time.Now())
	if err != nil {
		m.t.Fatal(err)
	}
	return c
}

// startRouter starts the router on listen (its key kept across restarts).
func (m *testMesh) startRouter(listen string) {
	key, _ := meshrouter.Identity(m.rpriv)
	cred := m.cred("router", m.rpriv.Public().(ed25519.PublicKey))
	r, err := meshrouter.New(key, []string{listen}, m.verify, func() string { return cred })
	if err != nil {
		m.t.Fatal(err)
	}
	m.router = r
	m.routers = []peer.AddrInfo{{ID: r.Host.ID(), Addrs: r.Host.Addrs()}}
}

func newTestMesh(t *testing.T) *testMesh {
	iss, err := meshcred.NewIssuer("cp")
	if err != nil {
		t.Fatal(err)
	}
	_, rpriv, _ := ed25519.GenerateKey(rand.Reader)
	m := &testMesh{t: t, iss: iss, revoked: map[string]bool{}, rpriv: rpriv}
	m.startRouter("/ip4/127.0.0.1/tcp/0")
	t.Cleanup(func() { m.router.Close() })
	return m
}

// echo answers with who called (as the transport named it) and the path.
func echo(w http.ResponseWriter, r *http.Request) {
	json.NewEncoder(w).Encode(map[string]string{"member": r.Header.Get(meshnode.HeaderMember), "path": r.URL.Path})
}

func (m *testMesh) member(ctx context.Context, name string, credFor ed25519.PublicKey, names ...string) (*Peer, error) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	if credFor != nil {
		pub = credFor
	}
	cred := m.cred(name, pub)
	return Join(ctx, Config{
		Key: priv, Credential: func() string { return cred }, Verify: m.verify,
		Routers: m.routers, Listen: []string{"/ip4/127.0.0.1/tcp/0"},
		Names:   func() []string { return names },
		Handler: http.HandlerFunc(echo),
	})
}

// mustMember is member for a test that needs it to join: it fails the
// test if it does not, and closes it when the test ends.
func (m *testMesh) mustMember(ctx context.Context, name string, names ...string) *Peer {
	m.t.Helper()
	p, err := m.member(ctx, name, nil, names...)
	if err != nil {
		m.t.Fatalf("%s joins: %v", name, err)
	}
	m.t.Cleanup(func() { p.Close() })
	return p
}

func call(t *testing.T, from *Peer, to *Peer, path string) (int, map[string]string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://member"+path, nil)
	resp, err := from.Do(to.Host.ID().String(), req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var out map[string]string
	data, _ := io.ReadAll(resp.Body)
	json.Unmarshal(data, &out)
	return resp.StatusCode, out, nil
}

// TestMembersCallEachOther: members join through a router on loopback,
// the only peer each is told of; what one publishes the other finds, and
// calls over HTTP on libp2p streams, the callee's handler told the
// caller's checked name; a peer with another key's credential cannot
// join; a peer with none is refused by a member's handler; a revoked
// member is neither called nor answered; a router restarted on its
// address has the mesh back, the members' names published again.
func TestMembersCallEachOther(t *testing.T) {
	m := newTestMesh(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := m.mustMember(ctx, "node-a")
	b := m.mustMember(ctx, "node-b", "inference://m-b", "mcp://files")
	go a.Run(ctx)
	go b.Run(ctx)
	for _, name := range []string{"inference://m-b", "mcp://files"} {
		testenv.WaitFor(t, 20*time.Second, "node-a finding "+name, func() bool {
			got, err := a.Providers(ctx, name)
			if err != nil || len(got) == 0 {
				a.find.Forget(name) // not published yet: ask again, not the cache
				return false
			}
			return len(got) == 1 && got[0] == b.Host.ID().String()
		})
	}
	if got, err := a.Providers(ctx, "inference://nobody-serves"); err != nil || len(got) != 0 {
		t.Errorf("a name no one serves: %v, %v", got, err)
	}

	code, body, err := call(t, a, b, "/v1/catalog")
	if err != nil || code != 200 {
		t.Fatalf("a → b: %d %v", code, err)
	}
	if body["member"] != "node-a" || body["path"] != "/v1/catalog" {
		t.Errorf("b's handler saw %v", body)
	}

	// A peer holding another's credential cannot join.
	if p, err := m.member(ctx, "thief", a.cfg.Key.Public().(ed25519.PublicKey)); err == nil {
		p.Close()
		t.Error("a peer holding another key's credential joined the mesh")
	}
	// A peer that presents nothing is not answered by a member.
	stranger, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	if err := stranger.Connect(ctx, peer.AddrInfo{ID: b.Host.ID(), Addrs: b.Host.Addrs()}); err != nil {
		t.Fatal(err)
	}
	web := &libp2phttp.Host{StreamHost: stranger}
	rt, err := web.NewConstrainedRoundTripper(peer.AddrInfo{ID: b.Host.ID()})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: rt}).Get("http://b/sam/v1/catalog")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(data), "not_a_member") {
		t.Errorf("a stranger's call: %d %s", resp.StatusCode, data)
	}

	// Revoked: b no longer calls a, and a no longer answers b.
	m.revoke("node-a")
	if _, _, err := call(t, b, a, "/v1/catalog"); err == nil || !strings.Contains(err.Error(), "member") {
		t.Errorf("b calling revoked a: %v, want refused", err)
	}
	if code, _, err := call(t, a, b, "/v1/catalog"); err == nil && code != http.StatusForbidden {
		t.Errorf("revoked a calling b: %d, want 403", code)
	}

	// The router dies and comes back on its address: the members join it
	// again and publish again, so a name published before is found anew.
	addr := m.router.Host.Addrs()[0].String()
	m.router.Close()
	m.startRouter(addr)
	c, err := m.member(ctx, "node-c", nil)
	if err != nil {
		t.Fatalf("node-c joins the restarted router: %v", err)
	}
	defer c.Close()
	testenv.WaitFor(t, 30*time.Second, "node-b's names published again after the router's restart", func() bool {
		got, _ := c.Providers(ctx, "mcp://files")
		c.find.Forget("mcp://files")
		return len(got) == 1 && got[0] == b.Host.ID().String()
	})
	if code, body, err := call(t, c, b, "/v1/x"); err != nil || code != 200 || body["member"] != "node-c" {
		t.Errorf("c → b after the restart: %d %v %v", code, body, err)
	}
}
