package main

import (
	"reflect"
	"slices"
	"testing"

	"sandstorm/api"
)

func TestWarmRequest(t *testing.T) {
	def := api.Template{Name: "web", Rootfs: "/tmp/x/demo/web", Process: api.Process{Args: []string{"/usr/bin/python3", "/app.py"}, Env: []string{"A=1"}},
		Ports: []int{8000}, MemoryMiB: 256, Principal: "p"}
	req := warmRequest(def, "web-warm", 8000, "/healthz", "SIGUSR1")
	if req.Name != "web-warm" || req.RootfsDir != def.Rootfs || !slices.Equal(req.Process.Args, def.Process.Args) ||
		!slices.Equal(req.Process.Env, def.Process.Env) || !slices.Equal(req.Ports, def.Ports) || req.MemoryMiB != 256 || req.Principal != "p" {
		t.Errorf("the warm copy differs from its template beyond warm: %+v", req)
	}
	if w := req.Warm; w == nil || !reflect.DeepEqual(w.Probe, api.Probe{Port: 8000, Path: "/healthz"}) || w.Reseed.Signal != "SIGUSR1" || w.Reseed.Command != nil {
		t.Errorf("warm = %+v", w)
	}
}

func TestCloneChildren(t *testing.T) {
	all := []api.Sandbox{
		{Name: "bench-a-clone-web-7"}, {Name: "bench-a-clone-web-7-1"}, {Name: "bench-a-clone-web-7-12"},
		{Name: "bench-a-clone-web-70"}, {Name: "bench-a-clone-web-70-1"}, {Name: "bench-a-clone-web-7-"}, {Name: "bench-a-clone-web-7-x"},
	}
	var got []string
	for _, sb := range cloneChildren("bench-a-clone-web-7", all) {
		got = append(got, sb.Name)
	}
	if want := []string{"bench-a-clone-web-7-1", "bench-a-clone-web-7-12"}; !slices.Equal(got, want) {
		t.Errorf("cloneChildren = %q, want %q", got, want)
	}
}

func TestCloneRounds(t *testing.T) {
	for _, c := range []struct{ n, k, want int }{{50, 5, 10}, {20, 5, 4}, {21, 5, 5}, {3, 5, 1}, {1, 1, 1}} {
		if got := cloneRounds(c.n, c.k); got != c.want {
			t.Errorf("cloneRounds(%d, %d) = %d, want %d", c.n, c.k, got, c.want)
		}
	}
}

func TestParseFlagsWarmClone(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.cloneN != 5 || c.cloneRounds != 10 || c.warmProbe != "/healthz" || c.reseedSignal != "SIGUSR1" {
		t.Errorf("defaults: clone-n %d, rounds %d, probe %q, reseed %q", c.cloneN, c.cloneRounds, c.warmProbe, c.reseedSignal)
	}
	// warm-start runs right before the start it is compared with.
	if i := slices.Index(allSeries, "warm-start"); i < 0 || allSeries[i+1] != "start" || !slices.Contains(allSeries, "clone") {
		t.Errorf("series order %v", allSeries)
	}
	if c.runsOn() != "systrap" {
		t.Errorf("runsOn = %q", c.runsOn())
	}
	c, err = parseFlags([]string{"-n", "12", "--clone-n", "3", "--platform", "ptrace", "--series", "clone,warm-start"})
	if err != nil {
		t.Fatal(err)
	}
	if c.cloneRounds != 4 || c.runsOn() != "ptrace" || !c.wants("clone") || c.wantsRaw() {
		t.Errorf("-n 12 --clone-n 3: rounds %d, runsOn %q, series %v", c.cloneRounds, c.runsOn(), c.series)
	}
	if c, _ = parseFlags([]string{"--start", "--backend", "process"}); c.runsOn() != "process" {
		t.Errorf("--backend process: runsOn %q", c.runsOn())
	}
	if c, _ = parseFlags([]string{"--clone-rounds", "2"}); c.cloneRounds != 2 {
		t.Errorf("--clone-rounds 2: %d", c.cloneRounds)
	}
	for _, args := range [][]string{{"--clone-n", "0"}, {"--clone-n", "101"}, {"--warm-probe", "healthz"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q): no error", args)
		}
	}
}
