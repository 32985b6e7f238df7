package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/client"
	"sandstorm/internal/testenv"
)

var randomRE = regexp.MustCompile(`^random=(\S+) urandom=([0-9a-f]{16}) started=(\S+)\n$`)

// TestWarmTemplate: a warm template's sandboxes are restored from one image
// (the demo's start time is the same in all of them) and yet each has its
// own address and fresh entropy: Python's random module (reseeded by
// SIGUSR1) and os.urandom differ in all ten. A warm template without a
// reseed, or whose probe never answers, is refused and not registered.
func TestWarmTemplate(t *testing.T) {
	d := startDaemon(t, "--ready-timeout", "3s")
	warm := &api.Warm{Probe: api.Probe{Path: "/healthz"}, Reseed: api.Reseed{Signal: "SIGUSR1"}}
	if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: "warmweb", RootfsDir: webRootfs,
		Process: api.Process{Args: webDemo.Args, Env: webDemo.Env}, Ports: webDemo.Ports, Warm: warm}); err != nil {
		t.Fatalf("register a warm template: %v", err)
	}
	seen := map[string]map[string]bool{"random": {}, "urandom": {}, "started": {}, "address": {}}
	var warmMs []float64
	for i := 0; i < 10; i++ {
		sb := d.create(t, "warmweb", "warm-"+itoa(i))
		warmMs = append(warmMs, sb.LastWakeMs)
		m := randomRE.FindStringSubmatch(getBody(t, endpoint(t, sb), "/random"))
		if m == nil {
			t.Fatalf("sandbox %d: /random answered something else", i)
		}
		seen["random"][m[1]] = true
		seen["urandom"][m[2]] = true
		seen["started"][m[3]] = true
		seen["address"][sb.Address] = true
		// It serves as any sandbox does, and tiers as any does.
		getCount(t, endpoint(t, sb))
	}
	if n := len(seen["started"]); n != 1 {
		t.Errorf("the ten sandboxes report %d start times; from one warm image they share one", n)
	}
	for _, k := range []string{"random", "urandom", "address"} {
		if n := len(seen[k]); n != 10 {
			t.Errorf("%d distinct %s values among ten warm sandboxes, want 10: %v", n, k, seen[k])
		}
	}
	// Cold, for comparison: a plain template's sandbox starts on its own.
	d.registerWeb(t, "coldweb")
	cold := d.create(t, "coldweb", "cold")
	t.Logf("node's own start times: warm %v ms; cold %.1f ms (timed properly in bench/tiers)", warmMs, cold.LastWakeMs)
	if m := randomRE.FindStringSubmatch(getBody(t, endpoint(t, cold), "/random")); m == nil || seen["started"][m[3]] {
		t.Errorf("a cold sandbox shares the warm image's start time: %v", m)
	}

	bad := []struct {
		name string
		warm *api.Warm
		want string
	}{
		{"noreseed", &api.Warm{Probe: api.Probe{Path: "/healthz"}}, "how to reseed"},
		{"badsignal", &api.Warm{Reseed: api.Reseed{Signal: "SIGKILL"}}, "use one of"},
		{"noanswer", &api.Warm{Probe: api.Probe{Port: 9}, Reseed: api.Reseed{Signal: "SIGUSR1"}}, "did not succeed within"},
	}
	for _, b := range bad {
		_, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: b.name, RootfsDir: webRootfs,
			Process: api.Process{Args: webDemo.Args, Env: webDemo.Env}, Ports: webDemo.Ports, Warm: b.warm})
		e := expectAPIError(t, err, http.StatusBadRequest, api.CodeBadRequest)
		if !strings.Contains(e.Body.Message, b.want) {
			t.Errorf("%s: %q does not say %q", b.name, e.Body.Message, b.want)
		}
		var got api.Template
		if err := d.C.Do(ctxT(t), http.MethodGet, "/v1/templates/"+b.name, nil, &got); client.StatusOf(err) != http.StatusNotFound {
			t.Errorf("%s: a refused warm template is registered anyway (%v)", b.name, err)
		}
		if exists(filepath.Join(d.DataDir, "warm", b.name)) {
			t.Errorf("%s: a refused warm template left its build directory", b.name)
		}
	}
}

// TestWarmPool: a warm template with a pool keeps that many sandboxes
// restored and paused; a create without a name takes one (its console log
// says so), and it is a sandbox like any other: its hostname is its name,
// its address its own, its entropy fresh. The pool refills after a take,
// a create with a name restores the image itself, and removing the
// template leaves no pooled sandbox behind.
func TestWarmPool(t *testing.T) {
	d := startDaemon(t, "--ready-timeout", "3s")
	warm := &api.Warm{Probe: api.Probe{Path: "/healthz"}, Reseed: api.Reseed{Signal: "SIGUSR1"}, Pool: 2}
	if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: "poolweb", RootfsDir: webRootfs,
		Process: api.Process{Args: webDemo.Args, Env: webDemo.Env}, Ports: webDemo.Ports, Warm: warm}); err != nil {
		t.Fatalf("register a warm template with a pool: %v", err)
	}
	pool := func() int {
		st, err := d.C.Node(ctxT(t))
		if err != nil {
			t.Fatalf("GET /v1/node: %v", err)
		}
		return st.WarmPool["poolweb"]
	}
	testenv.WaitFor(t, 30*time.Second, "the warm pool holds 2", func() bool { return pool() == 2 })

	randoms, urandoms := map[string]bool{}, map[string]bool{}
	for i := 0; i < 3; i++ {
		sb := d.create(t, "poolweb", "")
		logs := d.logs(t, sb.ID)
		// The first two come from the pool; the third may too, if the
		// pool refilled in between.
		if taken := strings.Contains(logs, "taken from the warm pool"); !taken && i < 2 {
			t.Errorf("sandbox %d (%s) of a full pool was not taken from it; its log:\n%s", i, sb.Name, logs)
		}
		if got := strings.TrimSpace(getBody(t, endpoint(t, sb), "/hostname")); got != sb.Name {
			t.Errorf("sandbox %s sees hostname %q, want its name", sb.Name, got)
		}
		m := randomRE.FindStringSubmatch(getBody(t, endpoint(t, sb), "/random"))
		if m == nil {
			t.Fatalf("sandbox %d: /random answered something else", i)
		}
		randoms[m[1]], urandoms[m[2]] = true, true
		if c := getCount(t, endpoint(t, sb)); c < 1 {
			t.Errorf("sandbox %s counted %d", sb.Name, c)
		}
		// It tiers and wakes as any sandbox does.
		d.transition(t, sb.ID, "snapshot", api.TierSnapshot)
		getCount(t, endpoint(t, sb))
	}
	if len(randoms) != 3 || len(urandoms) != 3 {
		t.Errorf("pooled sandboxes share random state: random %v, urandom %v", randoms, urandoms)
	}
	testenv.WaitFor(t, 30*time.Second, "the warm pool refills to 2", func() bool { return pool() == 2 })

	named := d.create(t, "poolweb", "named-one")
	if logs := d.logs(t, named.ID); strings.Contains(logs, "taken from the warm pool") || !strings.Contains(logs, "warm image") {
		t.Errorf("a create with a name must restore the warm image itself; its log:\n%s", logs)
	}
	if got := strings.TrimSpace(getBody(t, endpoint(t, named), "/hostname")); got != "named-one" {
		t.Errorf("named sandbox sees hostname %q", got)
	}

	// Removing the template (once no sandbox uses it) empties its pool:
	// no pooled sandbox's namespace or directory is left.
	sbs, _ := d.C.Sandboxes(ctxT(t))
	for _, sb := range sbs {
		if err := d.C.DeleteSandbox(ctxT(t), sb.ID); err != nil {
			t.Fatalf("delete %s: %v", sb.ID, err)
		}
	}
	if err := d.C.DeleteTemplate(ctxT(t), "poolweb"); err != nil {
		t.Fatalf("delete the template: %v", err)
	}
	if n := pool(); n != 0 {
		t.Errorf("the pool holds %d after its template was removed", n)
	}
	ents, _ := os.ReadDir(filepath.Join(d.DataDir, "sandboxes"))
	for _, e := range ents {
		t.Errorf("left behind in sandboxes/: %s", e.Name())
		if exists(netnsPath(e.Name())) {
			t.Errorf("and its network namespace")
		}
	}
}
