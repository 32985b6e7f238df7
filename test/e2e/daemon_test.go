package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/client"
	"sandstorm/internal/mountinfo"
	"sandstorm/internal/testenv"
)

// Daemon is one real `sandstormd serve --master --node` process, with a
// data directory, API port, sandbox subnet and gateway port range of its
// own. Restarts keep all four, so endpoints stay the same.
type Daemon struct {
	t       *testing.T
	DataDir string
	LogPath string
	API     string // https://127.0.0.1:PORT
	Subnet  string
	GwPorts string
	Backend string
	Token   string
	C       *client.Client

	base []string // serve flags of every start; a start's extra flags come after and win
	// bin is the sandstormd binary it runs ("": sandstormdBin); set by a
	// "<binary>PATH" among startDaemon's extra flags.
	bin string
	// wrap, if set, rewrites the command of each start (a test that runs
	// sandstormd as a systemd unit would: service_test.go).
	wrap func(*exec.Cmd)
	// masterOnly: serve --master without a node of its own.
	masterOnly bool
	// noWaitReconcile: Start returns as soon as the API answers, without
	// waiting for the start-up reconcile to finish.
	noWaitReconcile bool
	cmd             *exec.Cmd
	exited          chan struct{}

	mu  sync.Mutex
	ids map[string]bool // every sandbox this daemon was seen to have
}

const (
	apiWait        = 60 * time.Second // for a started daemon to answer
	gatewayTimeout = 60 * time.Second // for one call through the gateway (a wake included)
)

var (
	allocMu     sync.Mutex
	daemonSeq   int
	usedSubnets = map[int]bool{}
	usedPorts   = map[int]bool{}
)

// masterOnly, among startDaemon's extra flags, starts a master with no node
// of its own (serve --master).
const masterOnly = "<master only>"

// binaryFlag+PATH, among startDaemon's extra flags, runs the sandstormd at
// PATH instead of the one TestMain built.
const binaryFlag = "<binary>"

// listenAll, among startDaemon's extra flags, has the API listen on every
// address of the test's namespace, not only loopback.
const listenAll = "<listen on all>"

// startDaemon starts a daemon with the default test flags (no idle timers,
// no memory reserve, gvisor backend), then extra flags, which override
// them. At the end of the test it deletes every sandbox through the API,
// checks that each left nothing behind, and stops the daemon.
func startDaemon(t *testing.T, extra ...string) *Daemon {
	t.Helper()
	d := newDaemon(t, extra...)
	d.Start(t)
	return d
}

// newDaemon is startDaemon without the start: the caller may set up how
// it starts (wrap) first.
func newDaemon(t *testing.T, extra ...string) *Daemon {
	t.Helper()
	allocMu.Lock()
	daemonSeq++
	name := fmt.Sprintf("d%02d", daemonSeq)
	allocMu.Unlock()
	d := &Daemon{
		t:       t,
		DataDir: filepath.Join(workDir, name),
		LogPath: filepath.Join(workDir, name+".log"),
		Subnet:  pickSubnet(t),
		GwPorts: pickGatewayPorts(t, 20),
		Backend: "gvisor",
		ids:     map[string]bool{},
	}
	for i := 0; i+1 < len(extra); i++ {
		if extra[i] == "--backend" {
			d.Backend = extra[i+1]
		}
	}
	port := testenv.FreePort(t)
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	d.API = "https://" + listen
	if slices.Contains(extra, listenAll) {
		// Reachable from the test's own network namespaces too (a node
		// that dials in); the test itself still uses loopback.
		listen = fmt.Sprintf("0.0.0.0:%d", port)
		extra = slices.DeleteFunc(slices.Clone(extra), func(s string) bool { return s == listenAll })
	}
	extra = slices.DeleteFunc(slices.Clone(extra), func(s string) bool {
		p, ok := strings.CutPrefix(s, binaryFlag)
		if ok {
			d.bin = p
		}
		return ok
	})
	roles := []string{"--master", "--node"}
	if slices.Contains(extra, masterOnly) {
		// A master with no node of its own: readiness is GET /v1/nodes.
		roles, d.masterOnly = []string{"--master"}, true
		extra = slices.DeleteFunc(slices.Clone(extra), func(s string) bool { return s == masterOnly })
	}
	d.base = append([]string{"serve"}, roles...)
	d.base = append(d.base,
		"--data-dir", d.DataDir, "--listen", listen,
		"--subnet", d.Subnet, "--gateway-ports", d.GwPorts,
		"--freeze-after", "0", "--snapshot-after", "0", "--detach-after", "0",
		"--memory-reserve", "0",
	)
	d.base = append(d.base, extra...)
	t.Cleanup(d.cleanup)
	return d
}

// Start starts the daemon again over the same data dir (after Stop or
// Kill), with extra flags on top of those it was created with.
func (d *Daemon) Start(t *testing.T, extra ...string) {
	t.Helper()
	if err := d.start(extra...); err != nil {
		t.Fatal(err)
	}
}

func (d *Daemon) start(extra ...string) error {
	if d.running() {
		return errors.New("daemon already running")
	}
	args := append(append([]string{}, d.base...), extra...)
	logf, err := os.OpenFile(d.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "=== e2e %s: sandstormd %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	bin := sandstormdBin
	if d.bin != "" {
		bin = d.bin
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if d.wrap != nil {
		d.wrap(cmd)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	d.cmd, d.exited = cmd, exited

	deadline := time.Now().Add(apiWait)
	for {
		select {
		case <-exited:
			return fmt.Errorf("sandstormd exited at start (%v); log:\n%s", cmd.ProcessState, d.logTail(60))
		default:
		}
		if c, err := client.ForDataDir(d.API, d.DataDir); err == nil {
			tok := c.Token
			c.HTTP.Timeout = 5 * time.Minute
			trustAPI(d.API, client.CAFile(d.DataDir))
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var st api.NodeStatus
			var err error
			if d.masterOnly {
				err = c.Do(ctx, "GET", "/v1/nodes", nil, nil)
			} else {
				st, err = c.Node(ctx)
			}
			cancel()
			if isStandby(err) {
				// A master standing by (PostgreSQL store, another leads)
				// is up: it answers, with 503 "standby".
				d.Token, d.C = tok, c
				return nil
			}
			if err == nil {
				d.Token, d.C = tok, c
				// The API answers at once; the repair of the sandboxes a
				// restart found runs behind it. Tests look at what it made.
				if st.Reconciling == 0 || d.noWaitReconcile {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandstormd did not answer on %s within %v; log:\n%s", d.API, apiWait, d.logTail(60))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// isStandby reports whether err is a standby master's 503.
func isStandby(err error) bool {
	var e *client.Error
	return errors.As(err, &e) && e.Status == http.StatusServiceUnavailable && e.Body.Code == api.CodeStandby
}

func (d *Daemon) running() bool {
	if d.exited == nil {
		return false
	}
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM and waits for the daemon to exit (sandboxes keep
// running; the next start adopts them).
func (d *Daemon) Stop(t *testing.T) {
	t.Helper()
	if err := d.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// Kill is kill -9 of the daemon process (only it: its sandboxes and any
// runsc command it had started live on).
func (d *Daemon) Kill(t *testing.T) {
	t.Helper()
	if err := d.signal(syscall.SIGKILL, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// Restart is Stop then Start with extra flags.
func (d *Daemon) Restart(t *testing.T, extra ...string) {
	t.Helper()
	d.Stop(t)
	d.Start(t, extra...)
}

func (d *Daemon) signal(sig syscall.Signal, wait time.Duration) error {
	if !d.running() {
		return nil
	}
	if stopProcess(d.cmd.Process, d.exited, sig, wait) {
		return fmt.Errorf("sandstormd did not exit within %v of %v; killed it", wait, sig)
	}
	return nil
}

// stopProcess sends p sig and waits for exited to close; if it has not
// within wait, it kills p, waits for it, and reports that it had to.
func stopProcess(p *os.Process, exited <-chan struct{}, sig os.Signal, wait time.Duration) (killed bool) {
	p.Signal(sig)
	select {
	case <-exited:
		return false
	case <-time.After(wait):
		p.Kill()
		<-exited
		return true
	}
}

func (d *Daemon) track(id string) {
	d.mu.Lock()
	d.ids[id] = true
	d.mu.Unlock()
}

func (d *Daemon) trackedIDs() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.ids))
	for id := range d.ids {
		out = append(out, id)
	}
	return out
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// registerWeb registers the web demo under name from its rootfs directory.
func (d *Daemon) registerWeb(t *testing.T, name string) api.Template {
	t.Helper()
	tp, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{
		Name: name, RootfsDir: webRootfs,
		Process: api.Process{Args: webDemo.Args, Env: webDemo.Env}, Ports: webDemo.Ports,
	})
	if err != nil {
		t.Fatalf("register template %s: %v", name, err)
	}
	return tp
}

// registerAgent registers test/agent as "agent" (agentTemplate).
func (d *Daemon) registerAgent(t *testing.T) {
	t.Helper()
	if _, err := d.C.CreateTemplate(ctxT(t), agentTemplate("agent")); err != nil {
		t.Fatalf("register template agent: %v", err)
	}
}

// create starts a sandbox and checks it comes back hot with an endpoint.
func (d *Daemon) create(t *testing.T, template, name string) api.Sandbox {
	t.Helper()
	sb, err := d.C.CreateSandbox(ctxT(t), api.SandboxRequest{Template: template, Name: name})
	if err != nil {
		t.Fatalf("create sandbox %q from %s: %v", name, template, err)
	}
	d.track(sb.ID)
	if sb.Tier != api.TierHot {
		t.Fatalf("new sandbox %s is %q, want hot", sb.ID, sb.Tier)
	}
	endpoint(t, sb)
	return sb
}

// threeTiers registers the web demo as "web" and makes a sandbox of it in
// each tier that keeps its memory, each called once first: "hot",
// "frozen" and "snap" (snapshot). count is what each one's counter said,
// by ID, for the tests to check that its memory lives on.
func (d *Daemon) threeTiers(t *testing.T) (hot, frozen, snap api.Sandbox, count map[string]int) {
	t.Helper()
	d.registerWeb(t, "web")
	hot = d.create(t, "web", "hot")
	frozen = d.create(t, "web", "frozen")
	snap = d.create(t, "web", "snap")
	count = map[string]int{}
	for _, sb := range []api.Sandbox{hot, frozen, snap} {
		count[sb.ID] = getCount(t, endpoint(t, sb))
	}
	d.transition(t, frozen.ID, "freeze", api.TierFrozen)
	d.transition(t, snap.ID, "snapshot", api.TierSnapshot)
	return hot, frozen, snap, count
}

// expectThreeTiers checks that threeTiers' sandboxes are still in their
// tiers and each answers with its memory: the next count after count's,
// which it updates. when says after what, for the failures.
func (d *Daemon) expectThreeTiers(t *testing.T, when string, count map[string]int, hot, frozen, snap api.Sandbox) {
	t.Helper()
	for _, c := range []struct {
		sb   api.Sandbox
		tier api.Tier
	}{{hot, api.TierHot}, {frozen, api.TierFrozen}, {snap, api.TierSnapshot}} {
		if got := d.get(t, c.sb.ID); got.Tier != c.tier {
			t.Errorf("%s %s is %s, want %s", when, c.sb.Name, got.Tier, c.tier)
		}
		count[c.sb.ID]++
		expectCount(t, endpoint(t, c.sb), count[c.sb.ID], c.sb.Name+" "+when+" (its memory)")
	}
}

// logs returns sandbox id's console log as the API serves it.
func (d *Daemon) logs(t *testing.T, id string) string {
	t.Helper()
	var b strings.Builder
	if err := d.C.Logs(ctxT(t), id, false, false, &b); err != nil {
		t.Fatalf("logs of %s: %v", id, err)
	}
	return b.String()
}

// get returns the sandbox as the API shows it.
func (d *Daemon) get(t *testing.T, id string) api.Sandbox {
	t.Helper()
	sb, err := d.C.Sandbox(ctxT(t), id)
	if err != nil {
		t.Fatalf("GET sandbox %s: %v", id, err)
	}
	d.track(sb.ID)
	return sb
}

// transition runs op (freeze, snapshot, detach, wake) and checks the
// sandbox lands in want.
func (d *Daemon) transition(t *testing.T, id, op string, want api.Tier) api.Sandbox {
	t.Helper()
	sb, err := d.C.Transition(ctxT(t), id, op)
	if err != nil {
		t.Fatalf("%s sandbox %s: %v", op, id, err)
	}
	if sb.Tier != want || sb.Transition != "" {
		t.Fatalf("%s sandbox %s: tier %q (transition %q, note %q), want %q", op, id, sb.Tier, sb.Transition, sb.Note, want)
	}
	if got := d.get(t, id); got.Tier != want {
		t.Fatalf("after %s, GET sandbox %s says tier %q, want %q", op, id, got.Tier, want)
	}
	return sb
}

// waitTier polls the API until the sandbox is in tier want with no
// transition in progress.
func (d *Daemon) waitTier(t *testing.T, id string, want api.Tier, timeout time.Duration) api.Sandbox {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last api.Sandbox
	var err error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		last, err = d.C.Sandbox(ctx, id)
		cancel()
		if err == nil && last.Tier == want && last.Transition == "" {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s not %s within %v: last seen tier %q transition %q note %q (err %v)",
				id, want, timeout, last.Tier, last.Transition, last.Note, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// netnsPath and hostLink are the kernel objects the node names after a
// sandbox ID.
func netnsPath(id string) string { return "/var/run/netns/ss-" + id }
func hostLink(id string) string  { return "ssv" + id }

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

func (d *Daemon) sandboxDir(id string) string { return filepath.Join(d.DataDir, "sandboxes", id) }
func (d *Daemon) snapshotDir(id string) string {
	return filepath.Join(d.sandboxDir(id), "snapshot")
}

// runscState lists runsc's state entries for id under <data-dir>/runsc.
func (d *Daemon) runscState(id string) []string {
	ents, _ := os.ReadDir(filepath.Join(d.DataDir, "runsc"))
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), id) || e.Name() == "runsc-"+id+".sock" {
			out = append(out, e.Name())
		}
	}
	return out
}

// runscStatus asks runsc for the container's status ("running", "paused",
// ...).
func (d *Daemon) runscStatus(t *testing.T, id string) string {
	t.Helper()
	out, err := exec.Command(runscBin, "--root", filepath.Join(d.DataDir, "runsc"), "state", id).Output()
	if err != nil {
		t.Fatalf("runsc state %s: %v", id, err)
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("runsc state %s: %v: %s", id, err, out)
	}
	return st.Status
}

// processesMentioning returns the PIDs (and command lines) of processes
// whose command line contains s.
func processesMentioning(s string) map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		cl := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cl, s) {
			out[pid] = cl
		}
	}
	return out
}

// checkOOMScores checks that sandbox id has processes and that every one
// carries the node's sandbox OOM score (800: layout.SandboxOOMScoreAdj),
// when saying at what point.
func (d *Daemon) checkOOMScores(t *testing.T, id, when string) {
	t.Helper()
	procs := processesMentioning(d.sandboxDir(id) + "/")
	if len(procs) == 0 {
		t.Errorf("%s: no process mentions %s", when, d.sandboxDir(id))
	}
	for pid := range procs {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid)); err == nil && strings.TrimSpace(string(b)) != "800" {
			t.Errorf("%s, sandbox process %d has oom_score_adj %s, want 800", when, pid, strings.TrimSpace(string(b)))
		}
	}
}

// leftovers lists what is still on the machine for a sandbox that should
// be entirely gone: network namespace, host veth, runsc state, mounts,
// directory, processes, process-backend record and cgroup.
func (d *Daemon) leftovers(id string) []string {
	var out []string
	if exists(netnsPath(id)) {
		out = append(out, "network namespace "+netnsPath(id))
	}
	if linkExists(hostLink(id)) {
		out = append(out, "host link "+hostLink(id))
	}
	if st := d.runscState(id); len(st) > 0 {
		out = append(out, fmt.Sprintf("runsc state %v under %s/runsc", st, d.DataDir))
	}
	if m := mountinfo.Under(d.sandboxDir(id)); len(m) > 0 {
		out = append(out, fmt.Sprintf("mounts %v", m))
	}
	if exists(d.sandboxDir(id)) {
		out = append(out, "directory "+d.sandboxDir(id))
	}
	for pid, cl := range processesMentioning(d.sandboxDir(id) + "/") {
		out = append(out, fmt.Sprintf("process %d: %.200s", pid, cl))
	}
	if rec := filepath.Join(d.DataDir, "process", id+".json"); exists(rec) {
		out = append(out, "process backend record "+rec)
	}
	if cg := "/sys/fs/cgroup/sandstorm-process/" + id; exists(cg) {
		out = append(out, "cgroup "+cg)
	}
	return out
}

// assertGone fails the test for every leftover of sandbox id.
func (d *Daemon) assertGone(t *testing.T, id string) {
	t.Helper()
	for _, l := range d.leftovers(id) {
		t.Errorf("sandbox %s was deleted but left %s", id, l)
	}
}

// deleteSandbox deletes through the API and checks nothing is left.
func (d *Daemon) deleteSandbox(t *testing.T, id string) {
	t.Helper()
	if err := d.C.DeleteSandbox(ctxT(t), id); err != nil {
		t.Fatalf("DELETE sandbox %s: %v", id, err)
	}
	_, err := d.C.Sandbox(ctxT(t), id)
	expectAPIError(t, err, http.StatusNotFound, api.CodeNotFound)
	d.assertGone(t, id)
}

// checkKernelObjects checks, for every sandbox this daemon has had, that
// its network namespace and host veth exist exactly when the API says it
// is hot or frozen (and not at all when the API no longer lists it).
// A snapshot answers once its image is recorded and removes the stopped
// container and the namespace just after (internal/node: checkpoint's
// finish), so what it finds is looked at again for a few seconds before
// it counts.
func (d *Daemon) checkKernelObjects(t *testing.T) {
	t.Helper()
	for _, p := range settled(func() []string { return d.kernelObjectProblems(t) }) {
		t.Error(p)
	}
}

// settled calls check until it finds nothing or 5 s have passed, and
// returns what it found last.
func settled(check func() []string) []string {
	deadline := time.Now().Add(5 * time.Second)
	for {
		problems := check()
		if len(problems) == 0 || time.Now().After(deadline) {
			return problems
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (d *Daemon) kernelObjectProblems(t *testing.T) []string {
	t.Helper()
	sbs, err := d.C.Sandboxes(ctxT(t))
	if err != nil {
		t.Fatalf("list sandboxes: %v", err)
	}
	tiers := map[string]api.Tier{}
	for _, sb := range sbs {
		d.track(sb.ID)
		tiers[sb.ID] = sb.Tier
	}
	var out []string
	for _, id := range d.trackedIDs() {
		tier, listed := tiers[id]
		want := listed && (tier == api.TierHot || tier == api.TierFrozen)
		if got := exists(netnsPath(id)); got != want {
			out = append(out, fmt.Sprintf("sandbox %s (listed %v, tier %q): network namespace present %v, want %v", id, listed, tier, got, want))
		}
		if got := linkExists(hostLink(id)); got != want {
			out = append(out, fmt.Sprintf("sandbox %s (listed %v, tier %q): host link %s present %v, want %v", id, listed, tier, hostLink(id), got, want))
		}
		if got := len(d.runscState(id)) > 0; d.Backend == "gvisor" && got != want {
			out = append(out, fmt.Sprintf("sandbox %s (listed %v, tier %q): runsc state present %v, want %v", id, listed, tier, got, want))
		}
		// runsc's sandbox and gofer processes name the bundle; the process
		// backend's program does not, so this is for gVisor only.
		if procs := processesMentioning(d.sandboxDir(id) + "/"); d.Backend == "gvisor" && (len(procs) > 0) != want {
			var cls []string
			for pid, cl := range procs {
				cls = append(cls, fmt.Sprintf("%d: %.120s", pid, cl))
			}
			out = append(out, fmt.Sprintf("sandbox %s (listed %v, tier %q): processes present %v, want %v: %q", id, listed, tier, len(procs) > 0, want, cls))
		}
	}
	return out
}

// cleanup runs at the end of the test: delete every sandbox through the API
// (restarting the daemon if the test left it stopped or killed), check each
// left nothing behind, stop the daemon, then scrub whatever is left so the
// machine stays clean even after a failure.
func (d *Daemon) cleanup() {
	t := d.t
	if !d.running() {
		if err := d.start("--memory-reserve", "0"); err != nil {
			t.Errorf("cleanup: restart sandstormd to delete sandboxes: %v", err)
		}
	}
	if d.running() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		sbs, err := d.C.Sandboxes(ctx)
		// A standby master leads once the one leading stops (its cleanup
		// ran first: cleanups run last-registered first).
		for deadline := time.Now().Add(20 * time.Second); client.StatusOf(err) == http.StatusServiceUnavailable && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
			sbs, err = d.C.Sandboxes(ctx)
		}
		if err != nil {
			t.Errorf("cleanup: list sandboxes: %v", err)
		}
		// Masters of one store see each other's sandboxes (their
		// placements are in it), but each reaches only its own nodes: the
		// others' are deleted by their own cleanup.
		var nodes api.List[api.NodeStatus]
		if err := d.C.Do(ctx, "GET", "/v1/nodes", nil, &nodes); err != nil {
			t.Errorf("cleanup: list nodes: %v", err)
		}
		mine := map[string]bool{}
		for _, n := range nodes.Items {
			mine[n.Name] = true
		}
		for _, sb := range sbs {
			if !mine[sb.Node] {
				continue
			}
			d.track(sb.ID)
			if err := d.C.DeleteSandbox(ctx, sb.ID); err != nil {
				t.Errorf("cleanup: delete sandbox %s: %v", sb.ID, err)
			}
		}
		cancel()
		for _, id := range d.trackedIDs() {
			d.assertGone(t, id)
		}
		if err := d.signal(syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
	if t.Failed() {
		t.Logf("sandstormd log (%s), last lines:\n%s", d.LogPath, d.logTail(150))
	}
	d.scrub()
	d.release()
}

// release gives the daemon's subnet and gateway ports back for later
// tests, once scrub has taken whatever of it was left: a run of the
// suite starts more daemons than there are /16s to give each its own.
func (d *Daemon) release() {
	allocMu.Lock()
	defer allocMu.Unlock()
	var x int
	if _, err := fmt.Sscanf(d.Subnet, "10.%d.0.0/16", &x); err == nil {
		delete(usedSubnets, x)
	}
	var lo, hi int
	if _, err := fmt.Sscanf(d.GwPorts, "%d-%d", &lo, &hi); err == nil {
		for p := lo; p <= hi; p++ {
			delete(usedPorts, p)
		}
	}
}

// scrub removes by force whatever the daemon left: processes started for
// its data dir (by PID), namespaces and links of its sandboxes, mounts and
// the data dir itself. Problems are reported by cleanup before this runs.
func (d *Daemon) scrub() {
	for pid := range processesMentioning(d.DataDir + "/") {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, id := range d.trackedIDs() {
		if exists(netnsPath(id)) {
			exec.Command("ip", "netns", "delete", "ss-"+id).Run()
		}
		if linkExists(hostLink(id)) {
			exec.Command("ip", "link", "delete", hostLink(id)).Run()
		}
		os.Remove("/sys/fs/cgroup/sandstorm-process/" + id)
	}
	m := mountinfo.Under(d.DataDir)
	for i := len(m) - 1; i >= 0; i-- {
		syscall.Unmount(m[i], syscall.MNT_DETACH)
	}
	os.RemoveAll(d.DataDir)
	// The node never removes its pool's unreachable route (it only ever
	// refuses); the test's pool is its own, so it goes with the test.
	exec.Command("ip", "route", "del", "unreachable", d.Subnet).Run()
}

// logTail returns the last n lines of the daemon's log.
func (d *Daemon) logTail(n int) string {
	b, _ := os.ReadFile(d.LogPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// pickGatewayPorts finds n consecutive free ports on 127.0.0.1 that no
// other daemon of this run uses, starting from a place that depends on the
// test process's PID so that two runs at once rarely probe the same ports.
func pickGatewayPorts(t *testing.T, n int) string {
	t.Helper()
	allocMu.Lock()
	defer allocMu.Unlock()
	// Below the kernel's ephemeral ports, as sandstormd demands: outgoing
	// connections (the tests' own to the API among them) take their local
	// ports from that range, and would now and then hold a gateway's port.
	lo, hi := 10000, 32000
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var elo, ehi int
		if _, err := fmt.Sscan(string(b), &elo, &ehi); err == nil && elo > lo+2000 {
			hi = elo
		}
	}
	start := lo + (os.Getpid()%50)*200
	for i := 0; i < (hi-lo)/n; i++ {
		base := lo + (start-lo+i*n)%(hi-lo-n)
		ok := true
		for p := base; p < base+n && ok; p++ {
			if usedPorts[p] {
				ok = false
				break
			}
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				ok = false
				break
			}
			ln.Close()
		}
		if ok {
			for p := base; p < base+n; p++ {
				usedPorts[p] = true
			}
			return fmt.Sprintf("%d-%d", base, base+n-1)
		}
	}
	t.Fatal("no free gateway port range")
	return ""
}

// pickSubnet returns a 10.X.0.0/16 (X in 200-254) that no host interface
// has an address in and no other daemon of this run uses.
func pickSubnet(t *testing.T) string {
	t.Helper()
	allocMu.Lock()
	defer allocMu.Unlock()
	var hostAddrs []netip.Addr
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				hostAddrs = append(hostAddrs, p.Addr())
			}
		}
	}
	start := os.Getpid() % 55
	for i := 0; i < 55; i++ {
		x := 200 + (start+i)%55
		if usedSubnets[x] {
			continue
		}
		p := netip.MustParsePrefix(fmt.Sprintf("10.%d.0.0/16", x))
		taken := false
		for _, a := range hostAddrs {
			if p.Contains(a) {
				taken = true
			}
		}
		if !taken {
			usedSubnets[x] = true
			return p.String()
		}
	}
	t.Fatal("no free 10.x.0.0/16 subnet for sandboxes")
	return ""
}
