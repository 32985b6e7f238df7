package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sys/unix"

	"sandstorm/api"
	"sandstorm/internal/testenv"
)

// scrape is one scrape of a sandstormd's --metrics-addr, parsed with
// Prometheus' own text parser.
type scrape map[string]*dto.MetricFamily

func scrapeMetrics(t *testing.T, addr string) scrape {
	t.Helper()
	r, err := call("GET", "http://"+addr+"/metrics", nil, nil, 30*time.Second)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("scrape %s: %v HTTP %d %.300s", addr, err, r.Status, r.Body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(r.Body))
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	return mfs
}

// get is the value of the series of family name whose labels include
// labels, summed over every such series (a histogram's value is its
// count); ok false when there is none.
func (s scrape) get(name string, labels ...string) (float64, bool) {
	mf := s[name]
	if mf == nil {
		return 0, false
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	sum, found := 0.0, false
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		found = true
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, found
}

// must is get for a series that must be there.
func (s scrape) must(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	v, ok := s.get(name, labels...)
	if !ok {
		t.Fatalf("no series %s%v in the scrape", name, labels)
	}
	return v
}

// runscLog wraps the pinned runsc in a shell script that runs it and
// then appends its exit status and arguments to a file: a count of runsc
// commands by verb made apart from sandstormd's own, to hold its metrics
// to.
func runscLog(t *testing.T) (wrapper string, counts func() (runs, fails map[string]int)) {
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "runsc.log")
	wrapper = filepath.Join(dir, "runsc")
	script := fmt.Sprintf("#!/bin/sh\n%q \"$@\"\nrc=$?\nprintf '%%s %%s\\n' \"$rc\" \"$*\" >> %q\nexit $rc\n", runscBin, log)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return wrapper, func() (map[string]int, map[string]int) {
		runs, fails := map[string]int{}, map[string]int{}
		f, err := os.Open(log)
		if err != nil {
			return runs, fails
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 2 {
				continue
			}
			// The verb: the first argument that is no flag (and not
			// --root's value); none for runsc --version.
			verb := ""
			for i := 1; i < len(fs) && verb == ""; i++ {
				switch {
				case fs[i] == "--root":
					i++
				case !strings.HasPrefix(fs[i], "-"):
					verb = fs[i]
				}
			}
			if verb == "" {
				continue
			}
			runs[verb]++
			if fs[0] != "0" {
				fails[verb]++
			}
		}
		return runs, fails
	}
}

// TestMetricsThroughEveryTier walks a real sandbox through every tier —
// created, refused a second create for want of a gateway port, frozen,
// woken by a request, snapshot, woken, detached, woken cold, deleted —
// scraping the daemon's --metrics-addr before and after, and checks that
// every counter moved by exactly what happened and nothing else did:
// transitions by from, to and outcome, wake times by the tier woken from,
// creates, the refusal and its reason, deletes, API requests by route and
// status, and runsc commands by verb against a count of its own (runsc
// wrapped by a script that logs every command); the gauges as it goes
// (its tier, the gateway's connections and requests in flight, memory and
// disk against /proc/meminfo and statfs, the master's node up).
func TestMetricsThroughEveryTier(t *testing.T) {
	wrapper, runscCounts := runscLog(t)
	maddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	// One gateway port: the second create finds none (refused, "full").
	port := strings.SplitN(pickGatewayPorts(t, 1), "-", 2)[0]
	d := startDaemon(t, "--metrics-addr", maddr, "--runsc", wrapper, "--gateway-ports", port+"-"+port, "--disk-reserve", "64")
	d.registerWeb(t, "web")
	ctx := ctxT(t)

	before := scrapeMetrics(t, maddr)
	runs0, fails0 := runscCounts()
	tierNow := func(want api.Tier) {
		t.Helper()
		s := scrapeMetrics(t, maddr)
		for _, tier := range []api.Tier{api.TierHot, api.TierFrozen, api.TierSnapshot, api.TierDetached} {
			n := 0.0
			if tier == want {
				n = 1
			}
			if got := s.must(t, "sandstorm_sandboxes", "tier", string(tier), "template", "web"); got != n {
				t.Errorf("in %s: sandstorm_sandboxes{tier=%s,template=web} = %v, want %v", want, tier, got, n)
			}
		}
	}
	if got := before.must(t, "sandstorm_sandboxes", "template", "web"); got != 0 {
		t.Fatalf("before any sandbox, %v of template web", got)
	}

	// The walk, each API call counted here by route and status.
	api0 := map[[2]string]float64{}
	called := func(route string, code int) { api0[[2]string{route, strconv.Itoa(code)}]++ }
	sb := d.create(t, "web", "walk")
	called("POST /v1/sandboxes", 201)
	tierNow(api.TierHot)
	if _, err := d.C.CreateSandbox(ctx, api.SandboxRequest{Template: "web", Name: "walk-2"}); err == nil || !strings.Contains(err.Error(), "no free gateway port") {
		t.Fatalf("a second create with the one gateway port taken: %v", err)
	}
	called("POST /v1/sandboxes", 503)
	ep := endpoint(t, sb)
	if n := getCount(t, ep); n != 1 {
		t.Fatalf("first call: count=%d", n)
	}
	for _, step := range []struct {
		op   string
		tier api.Tier
	}{{"freeze", api.TierFrozen}, {"snapshot", api.TierSnapshot}, {"detach", api.TierDetached}} {
		if got, err := d.C.Transition(ctx, sb.ID, step.op); err != nil || got.Tier != step.tier {
			t.Fatalf("%s: %+v %v", step.op, got.Tier, err)
		}
		called("POST /v1/sandboxes/{id}/{op}", 200)
		tierNow(step.tier)
		getCount(t, ep) // a request wakes it
		tierNow(api.TierHot)
	}

	// The gateway's gauges follow a connection: silent (open, in flight),
	// then answered — the demo's Python server speaks HTTP/1.0 and closes
	// after each answer, so the gateway closes the client's side too —
	// (neither). An idle keep-alive connection (open, not in flight) is
	// gateway.TestStats's.
	gauges := func(conns, inFlight float64) func() bool {
		return func() bool {
			s := scrapeMetrics(t, maddr)
			return s.must(t, "sandstorm_gateway_connections") == conns && s.must(t, "sandstorm_gateway_requests_in_flight") == inFlight
		}
	}
	testenv.WaitFor(t, 10*time.Second, "no gateway connection open", gauges(0, 0))
	c, err := net.Dial("tcp", strings.TrimPrefix(ep, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testenv.WaitFor(t, 10*time.Second, "a silent connection: open and in flight", gauges(1, 1))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: walk\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after an HTTP/1.0 answer the gateway kept the connection: %v", err)
	}
	testenv.WaitFor(t, 10*time.Second, "the connection closed", gauges(0, 0))

	// Memory and disk, read as the node reads them, against the kernel's
	// own numbers now (other tests share the machine: within 256 MiB and
	// 5 % of the disk).
	s := scrapeMetrics(t, maddr)
	avail, reserve, promised := s.must(t, "sandstorm_memory_available_bytes"), s.must(t, "sandstorm_memory_reserve_bytes"), s.must(t, "sandstorm_memory_promised_bytes")
	if h := s.must(t, "sandstorm_memory_headroom_bytes"); h != avail-reserve-promised {
		t.Errorf("headroom %v, want available − reserve − promised = %v", h, avail-reserve-promised)
	}
	if mi := memAvailableMiB(t) << 20; absDiff(avail, float64(mi)) > 256<<20 {
		t.Errorf("sandstorm_memory_available_bytes %v, /proc/meminfo says %v", avail, mi)
	}
	if reserve != 0 {
		t.Errorf("sandstorm_memory_reserve_bytes %v with --memory-reserve 0", reserve)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(d.DataDir, &fs); err != nil {
		t.Fatal(err)
	}
	if free, total := float64(fs.Bavail)*float64(fs.Bsize), float64(fs.Blocks)*float64(fs.Bsize); absDiff(s.must(t, "sandstorm_disk_free_bytes"), free) > total/20 {
		t.Errorf("sandstorm_disk_free_bytes %v, statfs says %v", s.must(t, "sandstorm_disk_free_bytes"), free)
	}
	if r := s.must(t, "sandstorm_disk_reserve_bytes"); r != 64<<20 {
		t.Errorf("sandstorm_disk_reserve_bytes %v with --disk-reserve 64", r)
	}
	if up := s.must(t, "sandstorm_master_node_up", "node", "local"); up != 1 {
		t.Errorf("sandstorm_master_node_up{node=local} = %v", up)
	}

	if err := d.C.Do(ctx, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil); err != nil {
		t.Fatal(err)
	}
	called("DELETE /v1/sandboxes/{id}", 204)
	after := scrapeMetrics(t, maddr)
	runs1, fails1 := runscCounts()

	// Every counter of the node moved by exactly the walk.
	moved := func(name string, labels ...string) float64 {
		b, _ := before.get(name, labels...)
		return after.must(t, name, labels...) - b
	}
	want := map[string]float64{}
	for _, k := range []string{"hot frozen ok", "frozen hot ok", "hot snapshot ok", "snapshot hot ok", "hot detached ok", "detached hot ok"} {
		want[k] = 1
	}
	for _, m := range after["sandstorm_transitions_total"].GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		k := l["from"] + " " + l["to"] + " " + l["outcome"]
		if got := moved("sandstorm_transitions_total", "from", l["from"], "to", l["to"], "outcome", l["outcome"]); got != want[k] {
			t.Errorf("sandstorm_transitions_total{%s} moved by %v, want %v", k, got, want[k])
		}
		delete(want, k)
	}
	if len(want) != 0 {
		t.Errorf("no series for transitions %v", want)
	}
	for _, from := range []string{"frozen", "snapshot", "detached"} {
		if got := moved("sandstorm_wake_duration_seconds", "from", from); got != 1 {
			t.Errorf("wakes from %s timed: %v, want 1", from, got)
		}
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"sandstorm_creates_total", []string{"start", "cold", "outcome", "ok"}, 1},
		{"sandstorm_creates_total", []string{"start", "cold", "outcome", "refused"}, 1},
		{"sandstorm_creates_total", nil, 2},
		{"sandstorm_admission_refusals_total", []string{"reason", "full", "op", "create"}, 1},
		{"sandstorm_admission_refusals_total", nil, 1},
		{"sandstorm_deletes_total", nil, 1},
		{"sandstorm_sandboxes", nil, 0},
	} {
		if got := moved(c.name, c.labels...); got != c.want {
			t.Errorf("%s%v moved by %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// The API's requests, by route and status: those made above, and no
	// other (the scrapes go to another listener).
	for _, m := range after["sandstorm_api_requests_total"].GetMetric() {
		var k [2]string
		for _, p := range m.GetLabel() {
			if p.GetName() == "route" {
				k[0] = p.GetValue()
			} else {
				k[1] = p.GetValue()
			}
		}
		if strings.Contains(k[0], sb.ID) {
			t.Errorf("a route label holds the sandbox's ID: %q", k[0])
		}
		if got := moved("sandstorm_api_requests_total", "route", k[0], "code", k[1]); got != api0[k] {
			t.Errorf("sandstorm_api_requests_total{route=%q,code=%s} moved by %v, want %v", k[0], k[1], got, api0[k])
		}
		delete(api0, k)
	}
	if len(api0) != 0 {
		t.Errorf("no series for the API requests %v", api0)
	}
	// runsc, by verb: what the wrapper saw run, and exactly what the walk
	// needs of the verbs it names (two runs: the create and the cold wake).
	for verb, n := range map[string]int{"run": 2, "pause": 1, "resume": 1, "checkpoint": 1, "restore": 1} {
		if runs1[verb]-runs0[verb] != n {
			t.Errorf("the wrapper saw runsc %s %d times in the walk, want %d", verb, runs1[verb]-runs0[verb], n)
		}
	}
	for _, verb := range []string{"run", "restore", "checkpoint", "pause", "resume", "state", "delete", "kill", "exec"} {
		if got, n := moved("sandstorm_runsc_duration_seconds", "verb", verb), runs1[verb]-runs0[verb]; got != float64(n) {
			t.Errorf("sandstorm_runsc_duration_seconds{verb=%s} counted %v commands; runsc ran %d", verb, got, n)
		}
		if got, n := moved("sandstorm_runsc_failures_total", "verb", verb), fails1[verb]-fails0[verb]; got != float64(n) {
			t.Errorf("sandstorm_runsc_failures_total{verb=%s} moved by %v; %d exited non-zero", verb, got, n)
		}
	}
	t.Logf("runsc in the walk: %v (failed: %v)", diff(runs1, runs0), diff(fails1, fails0))
}

func absDiff(a, b float64) float64 {
	if a > b {
		return a - b
	}
	return b - a
}

func diff(a, b map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range a {
		if v != b[k] {
			out[k] = v - b[k]
		}
	}
	return out
}

// TestMetricsUnreachableFromSandbox: the metrics listener bound on every
// address of the node (0.0.0.0, the worst an operator could choose) is
// reachable from the host on each of them and from no sandbox on any:
// not straight from inside (its veth's host end, the node's own address,
// another sandbox's host end), and not through its boundary with a
// policy that allows names the resolver points at them. A name the
// policy allows that is really outside still works, so the probes can
// reach what they may.
func TestMetricsUnreachableFromSandbox(t *testing.T) {
	out := newOutsideNet(t)
	resolver := startTestDNS(t)
	eth, haveEth := nodeAddress()
	mport := testenv.FreePort(t)
	policyPath := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(policyPath, []byte(`
roles:
  - name: outward
    egress: ["*.metrics.test", "good.test"]
bindings:
  - {principal: agent-a, roles: [outward]}
  - {principal: agent-b, roles: [outward]}
`), 0o600)
	d := startDaemon(t, "--metrics-addr", fmt.Sprintf("0.0.0.0:%d", mport), "--policy", policyPath, "--resolver", resolver.addr)
	d.registerAgent(t)
	a := d.create(t, "agent", "agent-a")
	b := d.create(t, "agent", "agent-b")
	aHost := netip.MustParseAddr(a.Address).Prev()
	bHost := netip.MustParseAddr(b.Address).Prev()

	targets := map[string]netip.Addr{"its own veth's host end": aHost, "another sandbox's veth host end": bHost,
		"loopback": netip.MustParseAddr("127.0.0.1"), "the outside network's host end": out.hostEnd}
	if haveEth {
		targets["the node's own address"] = eth
	}
	// From the host it answers on the addresses the test may send to (the
	// others are the same socket, bound to 0.0.0.0).
	for _, addr := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), aHost, bHost} {
		if s := scrapeHostAddr(t, netip.AddrPortFrom(addr, uint16(mport))); !strings.Contains(s, "sandstorm_sandboxes") {
			t.Fatalf("from the host, the metrics on %s did not answer: %.200q", addr, s)
		}
	}
	resolver.set("good.test", out.server)
	var wg sync.WaitGroup
	for what, addr := range targets {
		name := strings.ReplaceAll(strings.ReplaceAll(what, " ", "-"), "'", "") + ".metrics.test"
		resolver.set(name, addr)
		target := netip.AddrPortFrom(addr, uint16(mport)).String()
		wg.Go(func() {
			if p := probeFrom(t, a, "kind", "tcp", "addr", target); p.OK {
				t.Errorf("TCP straight from a sandbox to the metrics on %s (%s) connected", target, what)
			}
		})
		wg.Go(func() {
			if p := probeFrom(t, a, "kind", "http", "url", "http://"+name+":"+strconv.Itoa(mport)+"/metrics"); p.OK || p.Status == 200 || strings.Contains(p.Body, "sandstorm_") {
				t.Errorf("a sandbox reached the metrics on %s (%s) through its boundary by name: %+v", target, what, p)
			}
		})
	}
	wg.Wait()
	if p := probeFrom(t, a, "kind", "http", "url", "http://good.test/"); !strings.Contains(p.Body, "outside ok") {
		t.Errorf("an allowed outside name from the sandbox: %+v, want the outside server's answer (the probes must work)", p)
	}
	// The boundary refused the names pointing at the host by their class.
	s := scrapeMetrics(t, fmt.Sprintf("127.0.0.1:%d", mport))
	if got := s.must(t, "sam_box_address_refusals_total"); got < float64(len(targets)) {
		t.Errorf("sam_box_address_refusals_total = %v, want at least %d (one per name pointing at the host)", got, len(targets))
	}
}

// scrapeHostAddr GETs /metrics at addr from the host (the test's own
// process) and returns the body, or the error as text.
func scrapeHostAddr(t *testing.T, addr netip.AddrPort) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
	if err != nil {
		return err.Error()
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", addr)
	b, _ := io.ReadAll(c)
	return string(b)
}
