package sambench

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"sandstorm/internal/bench"
	"sandstorm/internal/sam/fakellm"
	"sandstorm/internal/sam/meshcred"
	"sandstorm/internal/sam/meshnode"
	"sandstorm/internal/sam/meshpeer"
	"sandstorm/internal/sam/meshrouter"
	"sandstorm/internal/sam/policy"
)

// MeshConfig is the cross-node call benchmark's shape.
type MeshConfig struct {
	Requests int // per series
}

type fixedPolicy struct{ p *policy.Policy }

func (f fixedPolicy) Current() *policy.Policy { return f.p }

// loopMesh is Mesh's mesh: a router and members A and B in this process
// on loopback, B serving model "m" from fakellm.
type loopMesh struct {
	a, b    *meshnode.Node
	llm     *fakellm.Server
	closers []func()
}

func (lm *loopMesh) close() {
	for i := len(lm.closers) - 1; i >= 0; i-- {
		lm.closers[i]()
	}
}

func startLoopMesh(ctx context.Context) (lm *loopMesh, err error) {
	lm = &loopMesh{}
	defer func() {
		if err != nil {
			lm.close()
		}
	}()
	iss, err := meshcred.NewIssuer("bench")
	if err != nil {
		return nil, err
	}
	verify := func(c string) (meshcred.Claims, error) { return iss.KeySet(time.Now()).Verify(c, time.Now(), nil) }
	cred := func(name string, pub ed25519.PublicKey) func() string {
		c, _, err := iss.Issue(name, pub, time.Hour, time.Now())
		if err != nil {
			panic(err)
		}
		return func() string { return c }
	}
	rpub, rpriv, _ := ed25519.GenerateKey(rand.Reader)
	rkey, _ := meshrouter.Identity(rpriv)
	r, err := meshrouter.New(rkey, []string{"/ip4/127.0.0.1/tcp/0"}, verify, cred("router", rpub))
	if err != nil {
		return nil, err
	}
	lm.closers = append(lm.closers, func() { r.Close() })
	routers := []peer.AddrInfo{{ID: r.Host.ID(), Addrs: r.Host.Addrs()}}
	if lm.llm, err = fakellm.Listen("127.0.0.1:0", "m"); err != nil {
		return nil, err
	}
	lm.closers = append(lm.closers, lm.llm.Close)
	pol, err := policy.Parse([]byte("roles: [{name: r, services: [\"inference://m\"]}]\nbindings: [{principal: agent, roles: [r]}]\n"))
	if err != nil {
		return nil, err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	member := func(name string, c meshnode.Config) (*meshnode.Node, error) {
		pub, priv, _ := ed25519.GenerateKey(rand.Reader)
		d := &meshpeer.Deferred{}
		c.Mesh, c.Member, c.Policy, c.Logger = d, name, fixedPolicy{pol}, quiet
		n, err := meshnode.New(c)
		if err != nil {
			return nil, err
		}
		p, err := meshpeer.Join(ctx, meshpeer.Config{Key: priv, Credential: cred(name, pub), Verify: verify, Routers: routers,
			Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Names: n.Names, Handler: n.MeshHandler(), Logger: quiet})
		if err != nil {
			n.Close()
			return nil, err
		}
		lm.closers = append(lm.closers, func() { n.Close() }, func() { p.Close() })
		d.Set(p)
		go p.Run(ctx)
		return n, nil
	}
	if lm.b, err = member("node-b", meshnode.Config{Providers: []meshnode.Provider{{Name: "llm", URL: lm.llm.BaseURL(), Models: []string{"m"}}}}); err != nil {
		return nil, err
	}
	if lm.a, err = member("node-a", meshnode.Config{}); err != nil {
		return nil, err
	}
	return lm, nil
}

// Mesh measures what a call to a model served by another member costs
// over the same call served by the node itself (issue 17: "a cross-node
// call's overhead over a local one"), on loopback, in one process: a
// router and two members (meshrouter, meshpeer: libp2p, credentials
// checked on every call), node B serving a model from a real
// OpenAI-protocol server (fakellm), node A serving nothing and using B's
// through the mesh. Three series, interleaved request by request so that
// the machine's noise falls on all three alike:
//   - mesh/provider-direct: the provider itself, no node;
//   - mesh/local: the same chat completion through B's own agent API;
//   - mesh/cross-node: through A's agent API, which sends it to B.
func Mesh(ctx context.Context, cfg MeshConfig, res *bench.Results, logf func(string, ...any)) error {
	if cfg.Requests < 1 {
		return fmt.Errorf("mesh: want at least one request")
	}
	res.Params["mesh"] = cfg
	lm, err := startLoopMesh(ctx)
	if err != nil {
		return err
	}
	defer lm.close()
	a, b, llm := lm.a, lm.b, lm.llm
	sa, sb := httptest.NewServer(a.Handler()), httptest.NewServer(b.Handler())
	defer sa.Close()
	defer sb.Close()

	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	hc := &http.Client{Timeout: 30 * time.Second}
	post := func(url string, principal bool) (time.Duration, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if principal {
			req.Header.Set(meshnode.HeaderPrincipal, "agent")
		}
		return timed(hc, req)
	}
	// Until A finds B's model through the DHT (B publishes it from its
	// first maintenance round); the first call's time is reported apart.
	t0 := time.Now()
	var first time.Duration
	for {
		d, err := post(sa.URL+"/v1/chat/completions", true)
		if err == nil {
			first = d
			break
		}
		if time.Since(t0) > 30*time.Second {
			return fmt.Errorf("node A never reached B's model through the mesh: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	logf("node A reached B's model through the mesh after %v (that call %v)", time.Since(t0).Round(time.Millisecond), first.Round(time.Microsecond))
	res.Note("the first cross-node call, once the model was published: %v (a cold DHT lookup, a connection and the credential exchange)", first.Round(time.Microsecond))
	direct := res.AddSeries("mesh/provider-direct", "POST /v1/chat/completions to the provider itself (fakellm on loopback)", "")
	local := res.AddSeries("mesh/local", "the same through node B's agent API, which serves the model itself", "")
	cross := res.AddSeries("mesh/cross-node", "the same through node A's agent API, sent to B over libp2p (HTTP on a stream, B's credential checked before, A's on B)", "")
	for i := 0; i < cfg.Requests; i++ {
		for _, s := range []struct {
			series    *bench.Series
			url       string
			principal bool
		}{{direct, llm.BaseURL() + "/chat/completions", false}, {local, sb.URL + "/v1/chat/completions", true}, {cross, sa.URL + "/v1/chat/completions", true}} {
			d, err := post(s.url, s.principal)
			if err != nil {
				s.series.Fail("request %d: %v", i, err)
				continue
			}
			s.series.AddDuration(d)
		}
	}
	return nil
}
