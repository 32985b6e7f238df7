package meshpeer

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"sandstorm/internal/meshcred"
	"sandstorm/internal/meshrouter"
)

// TestPublishAndFindThroughTheRouter: two members join the mesh through
// a router on loopback, the only peer either is told of; what one
// publishes, the other finds; a peer with no credential of its own
// cannot join.
func TestPublishAndFindThroughTheRouter(t *testing.T) {
	iss, err := meshcred.NewIssuer("cp")
	if err != nil {
		t.Fatal(err)
	}
	verify := func(c string) (meshcred.Claims, error) { return iss.KeySet(time.Now()).Verify(c, time.Now(), nil) }
	_, rpriv, _ := ed25519.GenerateKey(rand.Reader)
	rkey, _ := meshrouter.Identity(rpriv)
	r, err := meshrouter.New(rkey, []string{"/ip4/127.0.0.1/tcp/0"}, verify)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	routers := []peer.AddrInfo{{ID: r.Host.ID(), Addrs: r.Host.Addrs()}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	member := func(name string, credFor ed25519.PublicKey) (*Peer, error) {
		pub, priv, _ := ed25519.GenerateKey(rand.Reader)
		if credFor != nil {
			pub = credFor
		}
		cred, _, err := iss.Issue(name, pub, 10*time.Minute, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return Join(ctx, Config{Key: priv, Credential: func() string { return cred }, Routers: routers, Listen: []string{"/ip4/127.0.0.1/tcp/0"}})
	}
	a, err := member("node-a", nil)
	if err != nil {
		t.Fatalf("node-a joins: %v", err)
	}
	defer a.Close()
	b, err := member("node-b", nil)
	if err != nil {
		t.Fatalf("node-b joins: %v", err)
	}
	defer b.Close()
	if err := a.Publish(ctx, "model/llama-3-8b", "mcp/files"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"model/llama-3-8b", "mcp/files"} {
		got, err := b.Providers(ctx, name)
		if err != nil {
			t.Fatalf("find %s: %v", name, err)
		}
		if len(got) != 1 || got[0].ID != a.Host.ID() {
			t.Errorf("providers of %s: %v, want node-a (%s)", name, got, a.Host.ID())
		}
	}
	if got, err := b.Providers(ctx, "model/nobody-serves"); err != nil || len(got) != 0 {
		t.Errorf("a name no one serves: %v, %v", got, err)
	}
	other, _, _ := ed25519.GenerateKey(rand.Reader)
	if p, err := member("thief", other); err == nil {
		p.Close()
		t.Error("a peer holding another key's credential joined the mesh")
	}
}
