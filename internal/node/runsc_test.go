package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/netns"
	"sandstorm/internal/node/livemove"
	"sandstorm/internal/runtimes"
	"sandstorm/internal/store"
	"sandstorm/internal/testenv"
)

// buildBackend is the fake backend with a runtime binary, as the gvisor
// one has (sandbox.BinaryRuntime): bin is the runsc it was configured
// with, used the kept copy the node made it run.
type buildBackend struct {
	*fakeBackend
	bin, used string
}

func (b *buildBackend) Binary() string        { return b.bin }
func (b *buildBackend) UseBinary(path string) { b.used = path }
func (b *buildBackend) VersionOf(ctx context.Context, path string) (string, error) {
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimPrefix(line, "runsc version "), err
}

// fakeBuild is a stand-in runsc build saying it is version.
func fakeBuild(t *testing.T, version string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho 'runsc version "+version+"'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// startBuildNode starts a node over dataDir and st whose backend is
// configured with runsc bin, and runs its start-up reconcile (without
// the firewall, which needs root).
func startBuildNode(t *testing.T, dataDir string, st *store.Store, fb *fakeBackend, bin string) (*Node, *buildBackend) {
	t.Helper()
	pool, err := netns.ParsePool(fakeSubnet)
	if err != nil {
		t.Fatal(err)
	}
	be := &buildBackend{fakeBackend: fb, bin: bin}
	n, err := New(Config{Name: "n", DataDir: dataDir, Backend: be, Store: st, Pool: pool,
		GatewayBind: netip.MustParseAddr("127.0.0.1"), PortMin: 31000, PortMax: 31010, SAM: SAM{Firewall: fakeFirewall},
		MemAvailable: func() (int64, error) { return 100000, nil }, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	plan, err := n.planReconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.FinishReconcile(ctx, plan); err != nil {
		t.Fatal(err)
	}
	return n, be
}

// TestRunscUpgradeKeepsBuilds: the node's side of an upgrade of runsc
// (the e2e test TestRunscUpgrade runs real builds). A row from before
// builds were kept is given the current build; after an upgrade, the
// sandboxes of the old build are driven by it (their specs name it), a
// snapshot restores with the build its stamp names, a cold start moves a
// sandbox to the current build, the old build is kept while anything
// needs it — a clone in progress included — and removed once nothing
// does; a build that is gone fails a restore before anything runs.
func TestRunscUpgradeKeepsBuilds(t *testing.T) {
	ctx := context.Background()
	dataDir, err := os.MkdirTemp("", "node")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dataDir) })
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.PutTemplate(ctx, store.Template{Name: "t", Rootfs: filepath.Join(t.TempDir(), "no-rootfs"), Process: api.Process{Args: []string{"/x"}}}); err != nil {
		t.Fatal(err)
	}
	fb := newFakeBackend()
	fb.canCheckpoint = true
	row := func(id string, slot int, tier api.Tier, key string) {
		t.Helper()
		if err := st.CreateSandbox(ctx, store.Sandbox{ID: id, Name: "name-" + id, Template: "t", Node: "n", Tier: tier, Slot: slot, HostPorts: map[int]int{}, Runsc: key}); err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Join(dataDir, "sandboxes", id), 0o700)
	}
	get := func(id string) store.Sandbox {
		t.Helper()
		sb, err := st.GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}

	// Before builds were kept: a hot sandbox and a detached one.
	row("legacy", 0, api.TierHot, "")
	row("gone", 1, api.TierDetached, "")
	fb.set("legacy", "running")
	nA, beA := startBuildNode(t, dataDir, st, fb, fakeBuild(t, "v-a"))
	a := nA.kept.Current()
	if !strings.HasPrefix(string(a), "v-a-") || beA.used != filepath.Join(dataDir, "runsc-versions", string(a), "runsc") {
		t.Fatalf("current build %q, backend runs %q", a, beA.used)
	}
	if got := get("legacy").Runsc; got != string(a) {
		t.Fatalf("a hot row from before builds were kept has build %q, want the current %q", got, a)
	}
	if got := get("gone").Runsc; got != "" {
		t.Fatalf("a detached row got build %q", got)
	}
	// A snapshot under A: its image is stamped with A.
	row("snap", 2, api.TierHot, string(a))
	fb.set("snap", "running")
	nA.tiers.Entry("snap").SetTier(api.TierHot)
	if _, err := nA.Snapshot(ctx, "snap"); err != nil {
		t.Fatal(err)
	}
	if k, err := runtimes.ReadStamp(nA.h.Dir("snap").Snapshot()); k != a || err != nil {
		t.Fatalf("snapshot stamp %q, %v; want %q", k, err, a)
	}
	nA.Close()

	// The upgrade: the node starts with build B.
	nB, beB := startBuildNode(t, dataDir, st, fb, fakeBuild(t, "v-b"))
	t.Cleanup(nB.Close)
	b := nB.kept.Current()
	if b == a || beB.used != filepath.Join(dataDir, "runsc-versions", string(b), "runsc") {
		t.Fatalf("after the upgrade: current %q (was %q), backend runs %q", b, a, beB.used)
	}
	pathA := filepath.Join(dataDir, "runsc-versions", string(a), "runsc")
	if got := nB.h.Spec(get("legacy")).Runtime; got != pathA {
		t.Fatalf("a sandbox running on A is driven by %q, want A's copy %s", got, pathA)
	}
	builds := nB.RunscBuilds(ctx)
	if len(builds) != 2 || builds[0].Key != string(a) && builds[1].Key != string(a) {
		t.Fatalf("kept builds: %+v", builds)
	}
	for _, bl := range builds {
		if bl.Key == string(a) && (bl.Running != 1 || bl.Images != 1 || bl.Current) {
			t.Errorf("A is kept for %+v, want 1 running and 1 image", bl)
		}
		if bl.Key == string(b) && !bl.Current {
			t.Errorf("B is not current: %+v", bl)
		}
	}

	// A restore of the snapshot runs A, whatever its row says.
	snap := get("snap")
	snap.Runsc = string(b)
	if err := nB.tiers.RestoreRunsc(&snap, nB.h.Dir("snap").Snapshot()); err != nil || snap.Runsc != string(a) || get("snap").Runsc != string(a) {
		t.Fatalf("restore picks %q (row %q), %v; want A", snap.Runsc, get("snap").Runsc, err)
	}

	// A new sandbox, and a cold start of an old one, run on B.
	fresh := get("legacy")
	if err := nB.tiers.OnCurrentRunsc(&fresh); err != nil || fresh.Runsc != string(b) || get("legacy").Runsc != string(b) {
		t.Fatalf("a cold start stays on %q, %v", get("legacy").Runsc, err)
	}
	if got := nB.h.Spec(fresh).Runtime; got != "" && got != beB.used {
		t.Fatalf("a sandbox on B is driven by %q", got)
	}

	// A clone of an A sandbox pins A while its children are made.
	stage := filepath.Join(dataDir, "stage")
	nB.kept.Pin(stage, a)
	// The last sandbox on A goes (detached: its memory is gone) …
	nB.tiers.Entry("snap").SetTier(api.TierSnapshot)
	if _, err := nB.Detach(ctx, "snap"); err != nil {
		t.Fatal(err)
	}
	if got := get("snap").Runsc; got != "" {
		t.Fatalf("a detached sandbox still names build %q", got)
	}
	nB.kept.Sweep()
	if _, err := os.Stat(pathA); err != nil {
		t.Fatalf("A removed while a clone needs it: %v", err)
	}
	// … and once the clone is done, nothing needs A: it is removed.
	nB.kept.Unpin(stage)
	testenv.WaitFor(t, 10*time.Second, "build A removed", func() bool {
		_, err := os.Stat(filepath.Dir(pathA))
		return os.IsNotExist(err)
	})
	// (The sweep counts again after it removed A.)
	testenv.WaitFor(t, 10*time.Second, "the node's status to keep only B", func() bool {
		got := nB.RunscBuilds(ctx)
		return len(got) == 1 && got[0].Key == string(b) && got[0].Current
	})

	// A snapshot of a build the node does not have fails before runsc
	// runs, saying which build it needs.
	row("orphan", 3, api.TierSnapshot, string(a))
	os.MkdirAll(nB.h.Dir("orphan").Snapshot(), 0o700)
	o := get("orphan")
	if err := nB.tiers.RestoreRunsc(&o, nB.h.Dir("orphan").Snapshot()); err == nil || !strings.Contains(err.Error(), string(a)) {
		t.Fatalf("restore with a build that is gone: %v", err)
	}
	if got := nB.h.Spec(o).Runtime; got != pathA {
		t.Fatalf("a sandbox of a removed build is driven by %q, want its old (absent) path", got)
	}
	nB.kept.Changed("") // as a create or commit of the row would
	missing := false
	for _, bl := range nB.RunscBuilds(ctx) {
		missing = missing || bl.Key == string(a) && bl.Missing && bl.Images == 1
	}
	if !missing {
		t.Errorf("build A not reported missing: %+v", nB.RunscBuilds(ctx))
	}
}

// TestMoveNeedsTheImagesBuild: a node takes a moved image only if it
// keeps the very runsc build that wrote it (by key: version and
// content), refused before anything is received; the sending node names
// the build from the image's stamp, so a sandbox still on an older build
// than its node's current one is sent as that build's.
func TestMoveNeedsTheImagesBuild(t *testing.T) {
	dataDir := t.TempDir()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	fb := newFakeBackend()
	n, _ := startBuildNode(t, dataDir, st, fb, fakeBuild(t, "v-a"))
	a := n.kept.CurrentBuild()
	if err := canRestore(n.kept, n.be, n.cfg.Name, livemove.Manifest{Name: "mv", Runsc: string(a.Key), Runtime: a.Version}); err != nil {
		t.Errorf("an image of the build it keeps: %v", err)
	}
	other := livemove.Manifest{Name: "mv", Runsc: "v-b-0123456789abcdef", Runtime: "v-b"}
	if err := canRestore(n.kept, n.be, n.cfg.Name, other); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Errorf("an image of a build it does not keep: %v, want a precondition refusal", err)
	}
	same := livemove.Manifest{Name: "mv", Runsc: string(a.Key), Runtime: a.Version + " ptrace"}
	if err := canRestore(n.kept, n.be, n.cfg.Name, same); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Errorf("the same build on another platform: %v, want a precondition refusal", err)
	}

	// The sending side: the stamp names the build, whatever the row says.
	img := filepath.Join(t.TempDir(), "image")
	os.MkdirAll(img, 0o700)
	if err := runtimes.WriteStamp(img, a); err != nil {
		t.Fatal(err)
	}
	if v, k := n.kept.ImageBuild("v-z-0123456789abcdef", img, runtimeOf(n.be)); k != a.Key || v != a.Version {
		t.Errorf("imageBuild of a stamped image: %q %q, want %q %q", v, k, a.Version, a.Key)
	}
}
