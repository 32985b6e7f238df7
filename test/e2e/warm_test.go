package e2e

import (
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/client"
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
