package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/runtimes"
	"sandstorm/internal/testenv"
)

// buildRunsc builds the runsc tools/runsc pins into dir with another
// version string: a second build of the same module, which checkpoint
// images of the first do not restore on (runsc compares the version
// strings). With the Go build cache warm from `make runsc` (make test
// builds it first) only the link runs again: measured 2.5 s here.
func buildRunsc(t *testing.T, dir, version string) string {
	t.Helper()
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "runsc")
	began := time.Now()
	cmd := exec.Command("go", "build", "-trimpath",
		"-ldflags", "-X gvisor.dev/gvisor/runsc/version.version="+version,
		"-o", out, ".")
	cmd.Dir = filepath.Join(root, "tools", "runsc")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build runsc %s: %v: %s", version, err, b)
	}
	t.Logf("second runsc build (%s) took %.1f s", version, time.Since(began).Seconds())
	return out
}

// runscBuilds is what GET /v1/node says of the node's runsc builds:
// the current one's key, and every build by key.
func (d *Daemon) runscBuilds(t *testing.T) (current string, all map[string]api.RunscBuild) {
	t.Helper()
	st, err := d.C.Node(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	all = map[string]api.RunscBuild{}
	for _, b := range st.Runsc {
		all[b.Key] = b
		if b.Current {
			current = b.Key
		}
	}
	return current, all
}

// runsOn is the kept runsc build sandbox id's sentry is: the directory
// name of its runsc-sandbox process's executable (runsc re-executes
// itself, so that is the build that started or restored it).
func (d *Daemon) runsOn(t *testing.T, id string) string {
	t.Helper()
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", d.sandboxPid(t, id)))
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(filepath.Dir(exe)) != filepath.Join(d.DataDir, "runsc-versions") {
		t.Fatalf("sandbox %s runs %s, not a build the node keeps", id, exe)
	}
	return filepath.Base(filepath.Dir(exe))
}

// imageOf says which build wrote sandbox id's snapshot: its stamp (the
// node's record) and its own metadata's runsc version (what runsc checks
// on restore).
func (d *Daemon) imageOf(t *testing.T, id string) (stamp runtimes.Key, version string) {
	t.Helper()
	dir := filepath.Join(d.sandboxDir(id), "snapshot")
	stamp, err := runtimes.ReadStamp(dir)
	if err != nil {
		t.Fatal(err)
	}
	if version, err = runtimes.ImageVersion(dir); err != nil {
		t.Fatal(err)
	}
	return stamp, version
}

// TestRunscUpgrade: an upgrade of the runsc pin keeps every sandbox's
// memory (issue 18). Sandboxes that count requests in memory are made
// under build A and left hot, frozen, snapshotted (two) and detached; a
// warm template's image is made; the daemon stops and starts with build
// B (the same module built with another version string). Then: every
// sandbox wakes with its count (the hot and frozen ones still on A's
// sentry, the snapshots restored by A, twice across a kill -9 of the
// daemon in the middle of a checkpoint and of a restore); new sandboxes,
// cold starts and the warm image are B's, and so is the snapshot of a
// sandbox cold-started on B; and once no sandbox runs on A and no image
// of A is left, A's kept copy is removed.
func TestRunscUpgrade(t *testing.T) {
	b := buildRunsc(t, t.TempDir(), "gvisor.dev/gvisor@v0.0.0-upgrade-test-b")

	d := startDaemon(t)
	d.registerWeb(t, "web")
	if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: "webw", RootfsDir: webRootfs,
		Process: api.Process{Args: webDemo.Args, Env: webDemo.Env}, Ports: webDemo.Ports,
		Warm: &api.Warm{Probe: api.Probe{Path: "/healthz"}, Reseed: api.Reseed{Signal: "SIGUSR1"}}}); err != nil {
		t.Fatal(err)
	}
	keyA, builds := d.runscBuilds(t)
	if len(builds) != 1 || builds[keyA].Version != runscVersion(t) {
		t.Fatalf("before the upgrade the node keeps %+v, want the pinned build only", builds)
	}
	names := []string{"hot", "frozen", "snap1", "snap2", "kill-cp", "det"}
	sbs := map[string]api.Sandbox{}
	for _, name := range names {
		sb := d.create(t, "web", name)
		for i := 1; i <= 3; i++ {
			expectCount(t, endpoint(t, sb), i, name+" before the upgrade")
		}
		if sb.Runsc != keyA || d.runsOn(t, sb.ID) != keyA {
			t.Fatalf("%s runs on %q (row %q), want A %s", name, d.runsOn(t, sb.ID), sb.Runsc, keyA)
		}
		sbs[name] = sb
	}
	d.transition(t, sbs["frozen"].ID, "freeze", api.TierFrozen)
	for _, name := range []string{"snap1", "snap2"} {
		d.transition(t, sbs[name].ID, "snapshot", api.TierSnapshot)
		if stamp, v := d.imageOf(t, sbs[name].ID); string(stamp) != keyA || v != builds[keyA].Version {
			t.Fatalf("%s's image: stamp %q, runsc_version %q; want A (%s, %s)", name, stamp, v, keyA, builds[keyA].Version)
		}
	}
	d.transition(t, sbs["det"].ID, "detach", api.TierDetached)

	// The upgrade.
	d.Stop(t)
	d.Start(t, "--runsc", b)
	keyB, builds := d.runscBuilds(t)
	if keyB == keyA || builds[keyB].Version != "gvisor.dev/gvisor@v0.0.0-upgrade-test-b" {
		t.Fatalf("after the upgrade the current build is %q: %+v", keyB, builds)
	}
	// A runs hot, frozen and kill-cp, and wrote two snapshots.
	if a := builds[keyA]; a.Running != 3 || a.Images != 2 || a.Why == "" {
		t.Fatalf("build A is kept for %+v, want 3 running and 2 images", a)
	}

	// Hot and frozen sandboxes are still A's sentries, driven by A's CLI.
	expectCount(t, endpoint(t, sbs["hot"]), 4, "hot after the upgrade")
	expectCount(t, endpoint(t, sbs["frozen"]), 4, "frozen, woken after the upgrade")
	for _, name := range []string{"hot", "frozen"} {
		if on := d.runsOn(t, sbs[name].ID); on != keyA {
			t.Errorf("%s runs on %s after the upgrade, want A", name, on)
		}
	}
	// A snapshot of A's is restored by A, and runs on A after.
	expectCount(t, endpoint(t, sbs["snap1"]), 4, "snap1, restored after the upgrade")
	if got := d.get(t, sbs["snap1"].ID); got.Runsc != keyA || got.LastWakeFrom != api.TierSnapshot || d.runsOn(t, got.ID) != keyA {
		t.Errorf("snap1 after its wake: runsc %q (on %s), woken from %q, note %q", got.Runsc, d.runsOn(t, got.ID), got.LastWakeFrom, got.Note)
	}

	// kill -9 of the daemon while A's sentry writes a checkpoint: the
	// image is A's whatever the daemon running B knew of it, and the
	// sandbox wakes with its count after the restart.
	cp := sbs["kill-cp"]
	done := make(chan error, 1)
	go func() {
		_, err := d.C.Transition(context.Background(), cp.ID, "snapshot")
		done <- err
	}()
	testenv.WaitFor(t, time.Minute, "kill-cp's checkpoint to start", func() bool {
		select {
		case err := <-done:
			done <- err
			return true
		default:
		}
		return exists(filepath.Join(d.sandboxDir(cp.ID), "snapshot.tmp"))
	})
	d.Kill(t)
	t.Logf("kill -9 mid-checkpoint: the snapshot call returned %v", <-done)
	d.Start(t, "--runsc", b)
	if got := d.get(t, cp.ID); got.Runsc != keyA {
		t.Errorf("kill-cp after kill -9 mid-checkpoint: tier %s, runsc %q, want A", got.Tier, got.Runsc)
	} else {
		t.Logf("kill-cp after kill -9 mid-checkpoint and the restart: %s (%q)", got.Tier, got.Note)
	}
	expectCount(t, endpoint(t, cp), 4, "kill-cp, after kill -9 of the daemon mid-checkpoint")

	// kill -9 while a restore of A's image runs: the restore goes on to
	// its end (runsc outlives the daemon), and the restart adopts it.
	s2 := sbs["snap2"]
	got := make(chan error, 1)
	go func() {
		_, err := call("GET", endpoint(t, s2)+"/", nil, nil, gatewayTimeout)
		got <- err
	}()
	testenv.WaitFor(t, time.Minute, "snap2's restore to run", func() bool {
		for _, cl := range processesMentioning(d.DataDir + "/") {
			if strings.Contains(cl, " restore ") && strings.HasSuffix(cl, " "+s2.ID+" ") {
				return true
			}
		}
		return false
	})
	d.Kill(t)
	t.Logf("kill -9 mid-restore: the request that woke it ended with %v", <-got)
	d.Start(t, "--runsc", b)
	if got := d.get(t, s2.ID); true {
		t.Logf("snap2 after kill -9 mid-restore and the restart: %s (%q)", got.Tier, got.Note)
	}
	// The request cut short by the kill may have reached it: 4 or 5.
	if n := getCount(t, endpoint(t, s2)); n != 4 && n != 5 {
		t.Errorf("snap2 after kill -9 mid-restore answered count=%d, want 4 or 5 (its memory kept)", n)
	}
	if on := d.runsOn(t, s2.ID); on != keyA {
		t.Errorf("snap2 runs on %s after its restore, want A", on)
	}

	// New sandboxes, cold starts and the warm image are B's.
	fresh := d.create(t, "web", "fresh")
	if fresh.Runsc != keyB || d.runsOn(t, fresh.ID) != keyB {
		t.Errorf("a sandbox created after the upgrade: runsc %q, runs on %s; want B", fresh.Runsc, d.runsOn(t, fresh.ID))
	}
	waitLog(t, d.LogPath, `msg="warm image made again" template=webw why="made by another runsc"`, 2*time.Minute)
	testenv.WaitFor(t, 2*time.Minute, "webw's image made with B", func() bool {
		v, err := os.ReadFile(filepath.Join(d.DataDir, "warm", "webw", "runsc-version"))
		return err == nil && strings.HasSuffix(string(v), " "+keyB)
	})
	w := d.create(t, "webw", "warm-b")
	if w.Runsc != keyB || d.runsOn(t, w.ID) != keyB || !strings.Contains(d.logs(t, w.ID), "warm image") {
		t.Errorf("a warm sandbox after the upgrade: runsc %q, runs on %s", w.Runsc, d.runsOn(t, w.ID))
	}
	det := sbs["det"]
	expectCount(t, endpoint(t, det), 1, "det, cold-started after the upgrade")
	d.transition(t, det.ID, "snapshot", api.TierSnapshot)
	if stamp, v := d.imageOf(t, det.ID); string(stamp) != keyB || v != "gvisor.dev/gvisor@v0.0.0-upgrade-test-b" {
		t.Errorf("det, cold-started on B, was checkpointed by %q (%s), want B", stamp, v)
	}
	expectCount(t, endpoint(t, det), 2, "det, restored by B")

	// A is kept while anything needs it, and removed once nothing does:
	// the A sandboxes go (a delete, a detach, and a cold start of a
	// snapshot of A's: its memory is dropped for B's).
	pathA := filepath.Join(d.DataDir, "runsc-versions", keyA)
	d.deleteSandbox(t, sbs["hot"].ID)
	d.transition(t, sbs["frozen"].ID, "detach", api.TierDetached)
	d.transition(t, sbs["snap1"].ID, "detach", api.TierDetached)
	d.transition(t, cp.ID, "detach", api.TierDetached)
	d.transition(t, s2.ID, "snapshot", api.TierSnapshot)
	if stamp, _ := d.imageOf(t, s2.ID); string(stamp) != keyA {
		t.Errorf("snap2, on A's sentry, was checkpointed by %q, want A", stamp)
	}
	if !exists(pathA) {
		t.Fatal("build A was removed while snap2's image of A is on disk")
	}
	if _, all := d.runscBuilds(t); all[keyA].Images != 1 || all[keyA].Running != 0 {
		t.Errorf("build A kept for %+v, want 1 image", all[keyA])
	}
	d.transition(t, s2.ID, "detach", api.TierDetached)
	testenv.WaitFor(t, 30*time.Second, "build A removed once nothing needs it", func() bool { return !exists(pathA) })
	if cur, all := d.runscBuilds(t); len(all) != 1 || cur != keyB {
		t.Errorf("kept after A went: %+v", all)
	}
	// Every sandbox still answers; those that lost their memory were
	// detached on purpose above, and start cold on B.
	for _, name := range []string{"frozen", "snap1", "kill-cp", "snap2"} {
		expectCount(t, endpoint(t, sbs[name]), 1, name+", cold-started on B")
		if on := d.runsOn(t, sbs[name].ID); on != keyB {
			t.Errorf("%s runs on %s after its cold start, want B", name, on)
		}
	}
	env := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN="}
	var checks []struct {
		Name, Detail string
		OK           bool
	}
	out := cli(t, env, "doctor", "--json", "--runsc", b)
	if err := json.Unmarshal([]byte(out.Stdout), &checks); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out.Stdout)
	}
	for _, c := range checks {
		if c.Name == "runsc-kept" && (!c.OK || !strings.Contains(c.Detail, keyB) || strings.Contains(c.Detail, keyA)) {
			t.Errorf("doctor after A went: %+v", c)
		}
	}
}

// runscVersion is what the pinned runsc says it is.
func runscVersion(t *testing.T) string {
	t.Helper()
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	v, err := testenv.PinnedRunsc(root)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
