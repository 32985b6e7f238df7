package ingress_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/fleet/fleettest"
	"sandstorm/internal/ingress"
	"sandstorm/internal/metrics"
	"sandstorm/internal/nodeapi"
)

// fleet is two nodes in memory, "a" (the ingress's own) and "c" (its
// peer), each with one sandbox, and an ingress on a.
type fleet struct {
	a, c  *fleettest.Node
	table *ingress.Table
	h     http.Handler
	peers []string
}

func newFleet(t *testing.T) *fleet {
	f := &fleet{a: fleettest.NewNode(), c: fleettest.NewNode(), table: ingress.NewTable()}
	f.a.Boxes["sb-a"] = api.Sandbox{ID: "sb-a", Generation: 1}
	f.c.Boxes["sb-c"] = api.Sandbox{ID: "sb-c", Generation: 2}
	f.h = ingress.Handler(ingress.Config{Self: "a", Local: f.a, Domain: "sb.test", Table: f.table, Peer: func(name, address string) (nodeapi.Node, error) {
		f.peers = append(f.peers, name+"@"+address)
		if name != "c" {
			return nil, errdefs.New(errdefs.ErrUnavailable, "no such peer")
		}
		return f.c, nil
	}})
	if err := f.table.Apply(nodeapi.Routes{Full: true, Version: 1, Set: []nodeapi.Route{
		{ID: "sb-a", Node: "a", Generation: 1, AccessToken: "tok-a", TrafficToken: "traffic-a"},
		{ID: "sb-c", Node: "c", Address: "10.0.0.3:7443", Generation: 2, AccessToken: "tok-c", Env: map[string]string{"K": "v"}},
	}}); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fleet) do(method, host, path, token string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, "http://"+host+path, nil)
	if token != "" {
		r.Header.Set("X-Access-Token", token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

// TestIngressServes: a sandbox of this node is served here, another
// node's is forwarded to its holder at the route's address; envd takes
// the sandbox's own token and no other (nor another sandbox's), and the
// token does not go in; a private sandbox's port takes its traffic token;
// an unknown sandbox is E2B's 502, envd or port.
func TestIngressServes(t *testing.T) {
	f := newFleet(t)
	if w := f.do("GET", "49983-sb-a.sb.test", "/health", "tok-a"); w.Code != 200 || w.Body.String() != "envd sb-a /health" {
		t.Errorf("own sandbox's envd: %d %q", w.Code, w.Body.String())
	}
	if w := f.do("GET", "49983-sb-c.sb.test", "/health", "tok-c"); w.Code != 200 || w.Body.String() != "envd sb-c /health" {
		t.Errorf("a peer's sandbox's envd: %d %q", w.Code, w.Body.String())
	}
	if len(f.peers) != 1 || f.peers[0] != "c@10.0.0.3:7443" {
		t.Errorf("peers dialled: %v", f.peers)
	}
	got := f.c.Envd[len(f.c.Envd)-1]
	if got.Header.Get("X-Access-Token") != "" || got.Header.Get(nodeapi.RouteGenerationHeader) != "2" || got.Header.Get(api.EnvdEnvHeader) == "" {
		t.Errorf("what the holder got: token %q, generation %q, env %q", got.Header.Get("X-Access-Token"), got.Header.Get(nodeapi.RouteGenerationHeader), got.Header.Get(api.EnvdEnvHeader))
	}
	if w := f.do("GET", "49983-sb-nope.sb.test", "/health", "tok-a"); w.Code != http.StatusBadGateway {
		t.Errorf("an unknown sandbox's envd: %d, want E2B's 502", w.Code)
	}
	for _, c := range []struct{ host, tok string }{{"49983-sb-c.sb.test", "tok-a"}, {"49983-sb-c.sb.test", ""}} {
		if w := f.do("GET", c.host, "/health", c.tok); w.Code != http.StatusUnauthorized {
			t.Errorf("%s with %q: %d %s, want 401", c.host, c.tok, w.Code, w.Body.String())
		}
	}
	if w := f.do("GET", "8000-sb-c.sb.test", "/page", ""); w.Code != 200 || !strings.HasPrefix(w.Body.String(), "port 8000 of sb-c /page") {
		t.Errorf("a public port: %d %q", w.Code, w.Body.String())
	}
	if w := f.do("GET", "8000-sb-nope.sb.test", "/", ""); w.Code != http.StatusBadGateway {
		t.Errorf("an unknown sandbox's port: %d, want 502", w.Code)
	}
	priv, _ := f.table.Get("sb-a")
	priv.Private = true
	f.table.Apply(nodeapi.Routes{Base: 1, Version: 2, Set: []nodeapi.Route{priv}})
	if w := f.do("GET", "8000-sb-a.sb.test", "/", ""); w.Code != http.StatusForbidden {
		t.Errorf("a private port with no traffic token: %d, want 403", w.Code)
	}
	if w := f.do("GET", "8000-sb-a.sb.test", "/", "", "E2b-Traffic-Access-Token", "traffic-a"); w.Code != 200 {
		t.Errorf("a private port with its traffic token: %d %s", w.Code, w.Body.String())
	}
}

// TestIngressStaleRoute: a route a move left stale (the holder has
// another generation) waits for the master's next push and follows it;
// with none, the answer is E2B's "not found". A paused sandbox is
// answered paused, not woken.
func TestIngressStaleRoute(t *testing.T) {
	f := newFleet(t)
	// The sandbox moved from c to a as generation 3; the route still
	// says c at 2.
	f.a.Boxes["sb-c"] = api.Sandbox{ID: "sb-c", Generation: 3}
	// The master's push lands while the ingress waits: as c answers.
	f.c = nil
	stale := &pushOnMiss{Node: newFleetPeer(f), push: func() {
		f.table.Apply(nodeapi.Routes{Base: 1, Version: 2, Set: []nodeapi.Route{{ID: "sb-c", Node: "a", Generation: 3, AccessToken: "tok-c"}}})
	}}
	f.h = ingress.Handler(ingress.Config{Self: "a", Local: f.a, Domain: "sb.test", Table: f.table, Peer: func(string, string) (nodeapi.Node, error) { return stale, nil }})
	if w := f.do("GET", "49983-sb-c.sb.test", "/health", "tok-c"); w.Code != 200 || w.Body.String() != "envd sb-c /health" {
		t.Errorf("after the move: %d %q", w.Code, w.Body.String())
	}
	f.table.Apply(nodeapi.Routes{Base: 2, Version: 3, Set: []nodeapi.Route{{ID: "sb-a", Node: "a", Generation: 1, AccessToken: "tok-a", Paused: true}}})
	if w := f.do("GET", "49983-sb-a.sb.test", "/health", "tok-a"); w.Code != http.StatusBadGateway || !strings.Contains(w.Body.String(), "paused") {
		t.Errorf("a paused sandbox: %d %s", w.Code, w.Body.String())
	}
}

// TestIngressUndoneMove: a holder whose copy was leaving by a move that
// was then undone (no new route comes) is asked again by the same route
// once the wait is over, and serves; a request to a sandbox whose copy
// is gone everywhere is "not found" after the wait.
func TestIngressUndoneMove(t *testing.T) {
	f := newFleet(t)
	leaving := &missOnce{Node: f.c}
	f.h = ingress.Handler(ingress.Config{Self: "a", Local: f.a, Domain: "sb.test", Table: f.table, StaleWait: 50 * time.Millisecond,
		Peer: func(string, string) (nodeapi.Node, error) { return leaving, nil }})
	if w := f.do("GET", "49983-sb-c.sb.test", "/health", "tok-c"); w.Code != 200 || w.Body.String() != "envd sb-c /health" || leaving.n != 2 {
		t.Errorf("after an undone move: %d %q, %d calls", w.Code, w.Body.String(), leaving.n)
	}
	delete(f.c.Boxes, "sb-c")
	if w := f.do("GET", "49983-sb-c.sb.test", "/health", "tok-c"); w.Code != http.StatusBadGateway {
		t.Errorf("a sandbox gone from its holder: %d %s, want E2B's 502", w.Code, w.Body.String())
	}
}

// TestIngressCountsCutAnswers: a request whose client left mid-answer
// (ReverseProxy then panics with http.ErrAbortHandler, as net/http asks)
// is counted as what it had become: forwarded.
func TestIngressCountsCutAnswers(t *testing.T) {
	f := newFleet(t)
	reg := prometheus.NewRegistry()
	m := metrics.NewIngress(reg, f.table.Stat)
	f.h = ingress.Handler(ingress.Config{Self: "a", Local: f.a, Domain: "sb.test", Table: f.table, Metrics: m,
		Peer: func(string, string) (nodeapi.Node, error) { return abortingPeer{f.c}, nil }})
	func() {
		defer func() {
			if p := recover(); p != http.ErrAbortHandler {
				t.Errorf("the handler's panic: %v, want http.ErrAbortHandler passed on", p)
			}
		}()
		f.do("GET", "49983-sb-c.sb.test", "/health", "tok-c")
	}()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counted := map[string]float64{}
	for _, fam := range fams {
		for _, m := range fam.GetMetric() {
			if fam.GetName() == "sandstorm_ingress_requests_total" {
				counted[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if len(counted) != 1 || counted["forwarded"] != 1 {
		t.Errorf("outcomes counted: %v, want forwarded 1", counted)
	}
}

// abortingPeer answers envd, then its client is gone.
type abortingPeer struct{ nodeapi.Node }

func (p abortingPeer) ServeEnvd(w http.ResponseWriter, r *http.Request, id, path string) error {
	p.Node.ServeEnvd(w, r, id, path)
	panic(http.ErrAbortHandler)
}

// missOnce is a peer whose first envd call finds its copy leaving.
type missOnce struct {
	nodeapi.Node
	n int
}

func (m *missOnce) ServeEnvd(w http.ResponseWriter, r *http.Request, id, path string) error {
	if m.n++; m.n == 1 {
		return errdefs.New(errdefs.ErrNotFound, "sandbox %s: placement 2 is leaving this node by a move", id)
	}
	return m.Node.ServeEnvd(w, r, id, path)
}

// TestTable: a change applies only to the version it was made against;
// a push whole resets the table; Next returns when the route changes.
func TestTable(t *testing.T) {
	tb := ingress.NewTable()
	if err := tb.Apply(nodeapi.Routes{Base: 0, Version: 1, Set: []nodeapi.Route{{ID: "x", Node: "n", Generation: 1, AccessToken: "t"}}}); err != nil {
		t.Fatal(err)
	}
	if err := tb.Apply(nodeapi.Routes{Base: 5, Version: 6}); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Errorf("a change at another version: %v", err)
	}
	if err := tb.Apply(nodeapi.Routes{Full: true, Version: 9, Set: []nodeapi.Route{{ID: "y", Node: "n", Generation: 1, AccessToken: "t"}}}); err != nil {
		t.Fatal(err)
	}
	if _, ok := tb.Get("x"); ok {
		t.Error("a push whole kept a route it did not have")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if r, ok := tb.Next(ctx, "y", 1); !ok || r.Generation != 1 {
		t.Errorf("Next with no change: %+v %v", r, ok)
	}
	if v, n := tb.Stat(); v != 9 || n != 1 {
		t.Errorf("Stat: %d %d", v, n)
	}
}

// pushOnMiss is a peer whose envd answers "not found" and then has the
// master's push land.
type pushOnMiss struct {
	nodeapi.Node
	push func()
}

func (p *pushOnMiss) ServeEnvd(w http.ResponseWriter, r *http.Request, id, path string) error {
	err := p.Node.ServeEnvd(w, r, id, path)
	if errors.Is(err, errdefs.ErrNotFound) {
		go p.push()
	}
	return err
}

func newFleetPeer(*fleet) nodeapi.Node {
	n := fleettest.NewNode()
	n.Boxes["sb-c"] = api.Sandbox{ID: "sb-c", Generation: 9} // another copy's
	return n
}

// TestIngressAutoResume: traffic to a sandbox paused with autoResume asks
// the master (on the node's report stream) and is served once the
// master's push says it runs; with no master answering it is 503, and a
// sandbox deleted meanwhile is E2B's "not found".
func TestIngressAutoResume(t *testing.T) {
	f := newFleet(t)
	f.h = ingress.Handler(ingress.Config{Self: "a", Local: f.a, Domain: "sb.test", Table: f.table, ResumeWait: time.Minute})
	version := int64(1)
	push := func(u nodeapi.Routes) {
		u.Base, u.Version = version, version+1
		version++
		if err := f.table.Apply(u); err != nil {
			t.Fatal(err)
		}
	}
	paused := nodeapi.Route{ID: "sb-a", Node: "a", Generation: 1, AccessToken: "tok-a", Paused: true, AutoResume: true}
	push(nodeapi.Routes{Set: []nodeapi.Route{paused}})
	// The master: hears the ask and pushes the route running.
	go func() {
		ask := <-f.table.Resumes()
		running := paused
		running.Paused = ask.ID != "sb-a" // only the right one
		push(nodeapi.Routes{Set: []nodeapi.Route{running}})
	}()
	if w := f.do("GET", "49983-sb-a.sb.test", "/health", "tok-a"); w.Code != 200 || w.Body.String() != "envd sb-a /health" {
		t.Errorf("a paused autoResume sandbox's traffic: %d %q, want it served once resumed", w.Code, w.Body.String())
	}
	// No master answering: unavailable, after the wait. (Another
	// sandbox: sb-a's first ask still stands, and a request meanwhile
	// waits for it rather than asking again, TestTableAskResume.)
	quiet := paused
	quiet.ID = "sb-q"
	push(nodeapi.Routes{Set: []nodeapi.Route{quiet}})
	f.h = ingress.Handler(ingress.Config{Self: "a", Local: f.a, Domain: "sb.test", Table: f.table, ResumeWait: 50 * time.Millisecond})
	if w := f.do("GET", "49983-sb-q.sb.test", "/health", "tok-a"); w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "master") {
		t.Errorf("no master: %d %s, want 503", w.Code, w.Body.String())
	}
	if ask := <-f.table.Resumes(); ask.ID != "sb-q" {
		t.Errorf("asked for %s, want sb-q", ask.ID)
	}
	// Deleted while it waited.
	gone := paused
	gone.ID = "sb-d"
	push(nodeapi.Routes{Set: []nodeapi.Route{gone}})
	go func() {
		<-f.table.Resumes()
		push(nodeapi.Routes{Drop: []string{"sb-d"}})
	}()
	f.h = ingress.Handler(ingress.Config{Self: "a", Local: f.a, Domain: "sb.test", Table: f.table, ResumeWait: time.Minute})
	if w := f.do("GET", "49983-sb-d.sb.test", "/health", "tok-a"); w.Code != http.StatusBadGateway {
		t.Errorf("deleted while it waited: %d %s, want E2B's 502", w.Code, w.Body.String())
	}
	// A wrong token is refused before anything is asked.
	if w := f.do("GET", "49983-sb-q.sb.test", "/health", "wrong"); w.Code != http.StatusUnauthorized {
		t.Errorf("a wrong token: %d", w.Code)
	}
	select {
	case ask := <-f.table.Resumes():
		t.Errorf("a request with a wrong token asked for a resume of %s", ask.ID)
	default:
	}
}

// TestTableAskResume: one ask per sandbox while it waits; another
// sandbox's, or one asked again once the first stopped waiting, goes.
func TestTableAskResume(t *testing.T) {
	tb := ingress.NewTable()
	now := time.Now()
	for _, c := range []struct {
		id    string
		until time.Time
	}{{"x", now.Add(time.Minute)}, {"x", now.Add(time.Minute)}, {"y", now.Add(time.Minute)}, {"z", now.Add(-time.Second)}, {"z", now.Add(time.Minute)}} {
		if !tb.AskResume(c.id, c.until) {
			t.Fatalf("ask %s dropped", c.id)
		}
	}
	var got []string
	for len(tb.Resumes()) > 0 {
		got = append(got, (<-tb.Resumes()).ID)
	}
	if strings.Join(got, ",") != "x,y,z,z" {
		t.Errorf("asks sent %v, want x,y,z,z", got)
	}
}
