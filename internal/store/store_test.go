package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/testenv"
)

// The same tests run on both databases the store supports: SQLite (a file
// in the test's directory) and PostgreSQL (a database of the test's own on
// the local server, testenv.Postgres).
var backends = []struct {
	name  string
	where func(testing.TB) string
}{
	{"sqlite", func(t testing.TB) string { return filepath.Join(t.TempDir(), "state.db") }},
	{"postgres", testenv.Postgres},
}

// eachStore runs fn once per database, each with a fresh store at where.
func eachStore(t *testing.T, fn func(t *testing.T, where string)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { fn(t, b.where(t)) })
	}
}

// atOnce runs f(0) … f(n-1) each in a goroutine of its own, all at
// once, and returns their errors by i.
func atOnce(n int, f func(i int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errs
}

// wins counts the nil errors among errs; one that is not lost (the error
// of a call that lost the race) fails the test.
func wins(t *testing.T, errs []error, lost error) int {
	t.Helper()
	n := 0
	for _, err := range errs {
		if err == nil {
			n++
		} else if !errors.Is(err, lost) {
			t.Error(err)
		}
	}
	return n
}

func openAt(t *testing.T, where string) *Store {
	t.Helper()
	s, err := Open(where)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestWarmTemplateRoundTrip: a warm template's probe and reseed survive
// the store; a plain one has none.
func TestWarmTemplateRoundTrip(t *testing.T) { eachStore(t, testWarmTemplateRoundTrip) }

func testWarmTemplateRoundTrip(t *testing.T, where string) {
	ctx := context.Background()
	s := openAt(t, where)
	w := &api.Warm{Probe: api.Probe{Port: 8000, Path: "/healthz"}, Reseed: api.Reseed{Command: []string{"/bin/reseed", "-x"}}}
	if err := s.PutTemplate(ctx, Template{Name: "w", Rootfs: "/r", Process: api.Process{Args: []string{"/a"}}, Warm: w}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutTemplate(ctx, Template{Name: "p", Rootfs: "/r", Process: api.Process{Args: []string{"/a"}}}); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetTemplate(ctx, "w")
	if err != nil || got.Warm == nil || !reflect.DeepEqual(got.Warm.Probe, w.Probe) || len(got.Warm.Reseed.Command) != 2 {
		t.Errorf("warm template back: %+v %v", got.Warm, err)
	}
	if got, err := s.GetTemplate(ctx, "p"); err != nil || got.Warm != nil {
		t.Errorf("plain template back with warm %+v, %v", got.Warm, err)
	}
	d := "sha256:" + strings.Repeat("ab", 32)
	if err := s.SetTemplateDigest(ctx, "p", d); err != nil {
		t.Fatal(err)
	}
	if ts, err := s.ListTemplates(ctx); err != nil || len(ts) != 2 || ts[0].Digest != d || ts[1].Digest != "" {
		t.Errorf("digests back: %+v %v", ts, err)
	}
	// A template a paired node's sandbox was placed with stays.
	if err := s.PutPlacement(ctx, Placement{ID: "x1", Name: "x", Node: "far", Template: "p"}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTemplate(ctx, "p"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("deleting a template placed on a paired node: %v", err)
	}
	s.DeletePlacement(ctx, "x1")
	if err := s.DeleteTemplate(ctx, "p"); err != nil {
		t.Errorf("deleting it once no sandbox uses it: %v", err)
	}
}

func TestTemplatesAndSandboxesSurviveReopen(t *testing.T) {
	eachStore(t, testTemplatesAndSandboxesSurviveReopen)
}

func testTemplatesAndSandboxesSurviveReopen(t *testing.T, path string) {
	ctx := context.Background()
	s := openAt(t, path)
	tmpl := Template{Name: "web", Rootfs: "/srv/web", Owned: true, Process: api.Process{Args: []string{"/bin/sh"}, Env: []string{"A=1"}}, Ports: []int{8000, 9000}, MemoryMiB: 64}
	if err := s.PutTemplate(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	if err := s.PutTemplate(ctx, tmpl); !errors.Is(err, errdefs.ErrExists) {
		t.Fatalf("duplicate template: err = %v, want errdefs.ErrExists", err)
	}
	now := time.Now().Truncate(time.Millisecond)
	sb := Sandbox{ID: "abc", Name: "one", Template: "web", Node: "local", Backend: "gvisor", Tier: api.TierHot,
		Slot: 3, HostPorts: map[int]int{8000: 20001, 9000: 20002}, LastActive: now, CreatedAt: now,
		LastWakeMs: 123.456, Principal: "agent.one", MemoryMiB: 512, Runsc: "v1-0123456789abcdef"}
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	dup := sb
	dup.ID = "other"
	if err := s.CreateSandbox(ctx, dup); !errors.Is(err, errdefs.ErrExists) {
		t.Fatalf("duplicate name and slot: err = %v, want errdefs.ErrExists", err)
	}
	missing := sb
	missing.ID, missing.Name, missing.Slot, missing.Template = "x", "x", 4, "nope"
	if err := s.CreateSandbox(ctx, missing); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown template: err = %v, want errdefs.ErrNotFound", err)
	}
	if _, err := s.UpdateSandbox(ctx, "abc", func(x *Sandbox) error {
		x.Tier, x.Transition, x.Note = api.TierSnapshot, "", "checked"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTemplate(ctx, "web"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete template in use: err = %v, want errdefs.ErrConflict", err)
	}
	s.Close()

	s2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	got, err := s2.GetSandbox(ctx, "one") // by name
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "abc" || got.Tier != api.TierSnapshot || got.Note != "checked" || got.HostPorts[9000] != 20002 || !got.LastActive.Equal(now) ||
		got.LastWakeMs != 123.456 || got.Principal != "agent.one" || got.MemoryMiB != 512 || got.Runsc != "v1-0123456789abcdef" {
		t.Fatalf("after reopen: %+v", got)
	}
	tg, err := s2.GetTemplate(ctx, "web")
	if err != nil || tg.Process.Env[0] != "A=1" || tg.Ports[1] != 9000 || tg.MemoryMiB != 64 || !tg.Owned {
		t.Fatalf("template after reopen: %+v, %v", tg, err)
	}
	slots, ports, err := s2.UsedSlots(ctx, "local")
	if err != nil || !slots[3] || !ports[20001] || !ports[20002] || len(slots) != 1 {
		t.Fatalf("UsedSlots = %v %v %v", slots, ports, err)
	}
	if err := s2.DeleteSandbox(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.GetSandbox(ctx, "abc"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if err := s2.DeleteTemplate(ctx, "web"); err != nil {
		t.Fatal(err)
	}
}

// TestSandboxEgressRoundTrip: a sandbox's egress rules survive the store
// and its updates; a sandbox without them has none.
func TestSandboxEgressRoundTrip(t *testing.T) { eachStore(t, testSandboxEgressRoundTrip) }

func testSandboxEgressRoundTrip(t *testing.T, where string) {
	ctx := context.Background()
	s := openAt(t, where)
	s.PutTemplate(ctx, Template{Name: "t", Rootfs: "/", Process: api.Process{Args: []string{"/x"}}})
	eg := &api.Egress{AllowOut: []string{"api.example.com", "192.0.2.0/24"}, DenyOut: []string{"0.0.0.0/0"}}
	if err := s.CreateSandbox(ctx, Sandbox{ID: "a", Name: "a", Template: "t", Slot: 1, HostPorts: map[int]int{}, Egress: eg}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, Sandbox{ID: "b", Name: "b", Template: "t", Slot: 2, HostPorts: map[int]int{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateSandbox(ctx, "a", func(x *Sandbox) error { x.Tier = api.TierFrozen; return nil }); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, "a")
	if err != nil || !reflect.DeepEqual(got.Egress, eg) {
		t.Errorf("egress back: %+v %v", got.Egress, err)
	}
	if got, _ := s.GetSandbox(ctx, "b"); got.Egress != nil {
		t.Errorf("a sandbox without rules has %+v", got.Egress)
	}
}

func TestUpdateErrorRollsBack(t *testing.T) { eachStore(t, testUpdateErrorRollsBack) }

func testUpdateErrorRollsBack(t *testing.T, where string) {
	ctx := context.Background()
	s := openAt(t, where)
	s.PutTemplate(ctx, Template{Name: "t", Rootfs: "/", Process: api.Process{Args: []string{"/x"}}})
	s.CreateSandbox(ctx, Sandbox{ID: "a", Name: "a", Template: "t", Tier: api.TierHot, HostPorts: map[int]int{}})
	boom := errors.New("boom")
	_, err := s.UpdateSandbox(ctx, "a", func(x *Sandbox) error {
		x.Tier = api.TierDetached
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	got, _ := s.GetSandbox(ctx, "a")
	if got.Tier != api.TierHot {
		t.Fatalf("tier = %s after failed update, want hot", got.Tier)
	}
	if _, err := s.UpdateSandbox(ctx, "zzz", func(*Sandbox) error { return nil }); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("update unknown: %v", err)
	}
}

// TestConcurrentUpdatesLoseNothing: read-modify-writes of one row from many
// goroutines at once all land (on PostgreSQL that takes SELECT … FOR
// UPDATE; without it, READ COMMITTED loses some), and concurrent creates
// of one name or slot let exactly one through.
func TestConcurrentUpdatesLoseNothing(t *testing.T) { eachStore(t, testConcurrentUpdates) }

func testConcurrentUpdates(t *testing.T, where string) {
	ctx := context.Background()
	s := openAt(t, where)
	if err := s.PutTemplate(ctx, Template{Name: "t", Rootfs: "/", Process: api.Process{Args: []string{"/x"}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, Sandbox{ID: "a", Name: "a", Template: "t", Tier: api.TierHot, HostPorts: map[int]int{}}); err != nil {
		t.Fatal(err)
	}
	const n = 40
	// Each even i updates, each odd one creates (only one create can win).
	errs := atOnce(2*n, func(i int) error {
		if i%2 == 0 {
			_, err := s.UpdateSandbox(ctx, "a", func(x *Sandbox) error { x.LastWakeMs++; return nil })
			return err
		}
		return s.CreateSandbox(ctx, Sandbox{ID: fmt.Sprint("b", i/2), Name: "b", Template: "t", Slot: 7, HostPorts: map[int]int{}})
	})
	if created := wins(t, errs, errdefs.ErrExists); created != n+1 { // n updates, one create
		t.Errorf("%d of %d operations succeeded, want every update and one create", created, n+1)
	}
	got, _ := s.GetSandbox(ctx, "a")
	if got.LastWakeMs != n {
		t.Errorf("after %d concurrent increments the row says %v", n, got.LastWakeMs)
	}
	// Every write counted once: created at 1, then one per update.
	if got.Rev != n+1 {
		t.Errorf("after its create and %d updates the row's revision is %d, want %d", n, got.Rev, n+1)
	}
}

// TestNodesAndPlacements: paired nodes and where sandboxes went survive,
// with names unique.
func TestNodesAndPlacements(t *testing.T) { eachStore(t, testNodesAndPlacements) }

func testNodesAndPlacements(t *testing.T, where string) {
	ctx := context.Background()
	s := openAt(t, where)
	at := time.Now().Truncate(time.Millisecond)
	if err := s.PutNode(ctx, Node{Name: "n1", Address: "10.0.0.1:7443", PairedAt: at}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutNode(ctx, Node{Name: "n2", Address: "10.0.0.1:7443", PairedAt: at}); !errors.Is(err, errdefs.ErrExists) {
		t.Errorf("a second node at one address: %v", err)
	}
	ns, err := s.ListNodes(ctx)
	if err != nil || len(ns) != 1 || !ns[0].PairedAt.Equal(at) {
		t.Fatalf("nodes: %+v %v", ns, err)
	}
	if err := s.PutPlacement(ctx, Placement{ID: "a1", Name: "one", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutPlacement(ctx, Placement{ID: "a2", Name: "one", Node: "n1"}); !errors.Is(err, errdefs.ErrExists) {
		t.Errorf("a second sandbox named one: %v", err)
	}
	if p, err := s.GetPlacement(ctx, "one"); err != nil || p.ID != "a1" || p.Node != "n1" {
		t.Errorf("placement by name: %+v %v", p, err)
	}
	if k, _ := s.CountPlacements(ctx, "n1"); k != 1 {
		t.Errorf("count %d", k)
	}
	s.DeletePlacement(ctx, "a1")
	if _, err := s.GetPlacement(ctx, "a1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("after delete: %v", err)
	}
	if err := s.DeleteNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteNode(ctx, "n1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
}

// TestJoinTokens: a join token is good once, and not after it expires.
func TestJoinTokens(t *testing.T) { eachStore(t, testJoinTokens) }

func testJoinTokens(t *testing.T, where string) {
	ctx := context.Background()
	s := openAt(t, where)
	now := time.Now()
	s.Enrol().PutJoinToken(ctx, "h1", now.Add(time.Hour))
	s.Enrol().PutJoinToken(ctx, "h2", now.Add(-time.Second))
	if ok, err := s.Enrol().UseJoinToken(ctx, "h1", now); !ok || err != nil {
		t.Errorf("a fresh token: %v %v", ok, err)
	}
	if ok, _ := s.Enrol().UseJoinToken(ctx, "h1", now); ok {
		t.Error("a token was good twice")
	}
	if ok, _ := s.Enrol().UseJoinToken(ctx, "h2", now); ok {
		t.Error("an expired token was good")
	}
	if ok, _ := s.Enrol().UseJoinToken(ctx, "nope", now); ok {
		t.Error("an unknown token was good")
	}
}

// TestReported: what nodes report is replaced whole by a node's full
// report (leaving other nodes' alone), updated and deleted one by one,
// found by ID or name, and forgotten with its node.
func TestReported(t *testing.T) { eachStore(t, testReported) }

func testReported(t *testing.T, where string) {
	ctx := context.Background()
	s := openAt(t, where)
	sb := func(id, name string, tier api.Tier) api.Sandbox { return api.Sandbox{ID: id, Name: name, Tier: tier} }
	if err := s.ReplaceReported(ctx, "n1", []api.Sandbox{sb("a", "x", api.TierHot), sb("b", "y", api.TierHot)}); err != nil {
		t.Fatal(err)
	}
	if err := s.ReplaceReported(ctx, "n2", []api.Sandbox{sb("c", "x", api.TierFrozen)}); err != nil {
		t.Fatal(err)
	}
	if err := s.ReplaceReported(ctx, "n1", []api.Sandbox{sb("a", "x", api.TierSnapshot)}); err != nil {
		t.Fatal(err)
	}
	all, err := s.ListReported(ctx)
	if err != nil || len(all) != 2 || all[0].Sandbox.Tier != api.TierSnapshot || all[1].Node != "n2" {
		t.Fatalf("after n1's second full report: %+v %v", all, err)
	}
	if err := s.PutReported(ctx, "n2", sb("c", "x", api.TierHot)); err != nil {
		t.Fatal(err)
	}
	if err := s.PutReported(ctx, "n2", sb("d", "z", api.TierHot)); err != nil {
		t.Fatal(err)
	}
	if got, err := s.FindReported(ctx, "x"); err != nil || len(got) != 2 || got[1].Sandbox.Tier != api.TierHot {
		t.Errorf("two copies named x: %+v %v", got, err)
	}
	if got, _ := s.FindReported(ctx, "d"); len(got) != 1 || got[0].Sandbox.Name != "z" {
		t.Errorf("d by ID: %+v", got)
	}
	// A node cannot take over another's sandbox by reporting its ID.
	s.PutReported(ctx, "n1", sb("d", "stolen", api.TierHot))
	s.ReplaceReported(ctx, "n1", []api.Sandbox{sb("a", "x", api.TierSnapshot), sb("d", "stolen", api.TierHot)})
	s.DeleteReported(ctx, "n1", "d")
	if got, _ := s.FindReported(ctx, "d"); len(got) != 1 || got[0].Node != "n2" || got[0].Sandbox.Name != "z" {
		t.Errorf("n2's sandbox after n1 reported its ID: %+v", got)
	}
	// A move of d to n1 commits: n1's report takes the place of n2's
	// (the master's, not n1's own word), n2's report of the copy it left
	// and its deletion change nothing, and a second MoveReported leaves
	// what n1 reported since.
	if err := s.MoveReported(ctx, "n1", sb("d", "z", api.TierFrozen)); err != nil {
		t.Fatal(err)
	}
	s.PutReported(ctx, "n1", sb("d", "z", api.TierHot))
	s.PutReported(ctx, "n2", sb("d", "z", api.TierSnapshot))
	s.DeleteReported(ctx, "n2", "d")
	s.MoveReported(ctx, "n1", sb("d", "z", api.TierFrozen))
	if got, _ := s.FindReported(ctx, "d"); len(got) != 1 || got[0].Node != "n1" || got[0].Sandbox.Tier != api.TierHot {
		t.Errorf("d after its move to n1: %+v", got)
	}
	// Accounts out of order: a report read before an answer (a lower
	// revision) arrives after it and is dropped; the same revision again
	// replaces it (its last activity), a higher one too.
	at := func(tier api.Tier, rev int64) api.Sandbox {
		v := sb("d", "z", tier)
		v.Revision = rev
		return v
	}
	for _, step := range []struct {
		put  api.Sandbox
		want api.Tier
	}{{at(api.TierSnapshot, 7), api.TierSnapshot}, {at(api.TierHot, 6), api.TierSnapshot}, {at(api.TierSnapshot, 7), api.TierSnapshot}, {at(api.TierFrozen, 8), api.TierFrozen}} {
		if err := s.PutReported(ctx, "n1", step.put); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.FindReported(ctx, "d"); len(got) != 1 || got[0].Sandbox.Tier != step.want {
			t.Errorf("after %s at revision %d: %+v, want %s", step.put.Tier, step.put.Revision, got, step.want)
		}
	}
	s.DeleteReported(ctx, "n1", "d")
	if got, _ := s.FindReported(ctx, "z"); len(got) != 0 {
		t.Errorf("deleted, still found: %+v", got)
	}
	s.PutNode(ctx, Node{Name: "n2", Address: "10.0.0.2:1"})
	if err := s.DeleteNode(ctx, "n2"); err != nil {
		t.Fatal(err)
	}
	if all, _ := s.ListReported(ctx); len(all) != 1 || all[0].Node != "n1" {
		t.Errorf("a forgotten node's reports are kept: %+v", all)
	}
}

func TestAttempts(t *testing.T) { eachStore(t, testAttempts) }

// testAttempts: generations are taken once each, also by two handles on
// one database at once (two masters); an attempt holds its name, and
// resolving it replaces it by what was made, once (a second resolve finds
// no attempt and changes nothing); a counter never goes down.
func testAttempts(t *testing.T, where string) {
	ctx := context.Background()
	a, b := openAt(t, where), openAt(t, where)
	seen := map[int64]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, st := range []*Store{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				g, err := st.NextGeneration(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[g] {
					t.Errorf("generation %d taken twice", g)
				}
				seen[g] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if g, _ := a.Generation(ctx); g != 40 || len(seen) != 40 {
		t.Errorf("after 40 taken: generation %d, %d distinct", g, len(seen))
	}
	att := Placement{ID: PendingID(7), Name: "n", Node: "x", Generation: 7, State: PlacementCreating}
	if err := a.PutPlacement(ctx, att); err != nil {
		t.Fatal(err)
	}
	if err := a.PutPlacement(ctx, Placement{ID: "other", Name: "n", Node: "y"}); !errors.Is(err, errdefs.ErrExists) {
		t.Errorf("a name held by an attempt: %v", err)
	}
	if us, _ := a.ListUnsettled(ctx); len(us) != 1 || us[0].ID != att.ID {
		t.Errorf("unsettled: %+v", us)
	}
	made := Placement{ID: "abc", Name: "n", Node: "x", Generation: 7}
	for i := 0; i < 2; i++ {
		if err := a.ResolveAttempt(ctx, 7, []Placement{made}); err != nil {
			t.Fatalf("resolve %d: %v", i, err)
		}
	}
	if p, err := a.GetPlacement(ctx, "n"); err != nil || p.ID != "abc" || p.State != "" || p.Generation != 7 {
		t.Errorf("after the resolve: %+v %v", p, err)
	}
	if us, _ := a.ListUnsettled(ctx); len(us) != 0 {
		t.Errorf("unsettled after the resolve: %+v", us)
	}
	if err := a.SetPlacementState(ctx, "abc", PlacementDeleting); err != nil {
		t.Fatal(err)
	}
	if p, _ := a.GetPlacement(ctx, "abc"); p.State != PlacementDeleting {
		t.Errorf("state: %+v", p)
	}
	if err := a.SetPlacementNode(ctx, "nothing", "x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a node for no placement: %v", err)
	}
	for _, v := range []int64{5, 3, 9} {
		if err := a.RaiseCounter(ctx, "fence", v); err != nil {
			t.Fatal(err)
		}
	}
	if v, _ := b.Counter(ctx, "fence"); v != 9 {
		t.Errorf("counter %d after raising to 5, 3, 9", v)
	}
}

func TestOldDatabaseMigrates(t *testing.T) { eachStore(t, testOldDatabaseMigrates) }

// testOldDatabaseMigrates: a database made by the first version (its
// tables without the columns added since) opens, gains every column the
// schema has now, and keeps its rows.
func testOldDatabaseMigrates(t *testing.T, where string) {
	ctx := context.Background()
	driver, dsn := "sqlite", "file:"+where
	if IsPostgres(where) {
		driver, dsn = "pgx", where
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE templates (name TEXT PRIMARY KEY, rootfs TEXT NOT NULL, owned INTEGER NOT NULL DEFAULT 0, process TEXT NOT NULL, ports TEXT NOT NULL, memory_mib INTEGER NOT NULL DEFAULT 0, created_at BIGINT NOT NULL)`,
		`CREATE TABLE sandboxes (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, template TEXT NOT NULL REFERENCES templates(name), node TEXT NOT NULL, backend TEXT NOT NULL, tier TEXT NOT NULL, transition TEXT NOT NULL DEFAULT '', slot INTEGER NOT NULL, host_ports TEXT NOT NULL, last_active BIGINT NOT NULL, created_at BIGINT NOT NULL, last_wake_ms DOUBLE PRECISION NOT NULL DEFAULT 0, last_wake_from TEXT NOT NULL DEFAULT '', note TEXT NOT NULL DEFAULT '', UNIQUE (node, slot))`,
		`CREATE TABLE placements (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, node TEXT NOT NULL, template TEXT NOT NULL DEFAULT '', principal TEXT NOT NULL DEFAULT '', memory_mib INTEGER NOT NULL DEFAULT 0)`,
		`INSERT INTO templates VALUES ('web', '/srv', 0, '{"args":["/x"]}', '[8000]', 0, 1)`,
		`INSERT INTO sandboxes(id, name, template, node, backend, tier, slot, host_ports, last_active, created_at) VALUES ('a1', 'one', 'web', 'n', 'gvisor', 'hot', 0, '{}', 1, 1)`,
		`INSERT INTO placements(id, name, node) VALUES ('b2', 'two', 'far')`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()
	st := openAt(t, where)
	sb, err := st.GetSandbox(ctx, "one")
	if err != nil || sb.ID != "a1" || sb.Principal != "" || sb.Generation != 0 || sb.LeftBehind || sb.Runsc != "" {
		t.Fatalf("an old sandbox row: %+v %v", sb, err)
	}
	if _, err := st.UpdateSandbox(ctx, "a1", func(s *Sandbox) error { s.Generation, s.Principal, s.Runsc = 5, "p", "v-0123456789abcdef"; return nil }); err != nil {
		t.Fatalf("writing the new columns of an old row: %v", err)
	}
	if p, err := st.GetPlacement(ctx, "two"); err != nil || p.Node != "far" || p.State != "" {
		t.Errorf("an old placement: %+v %v", p, err)
	}
	if tm, err := st.GetTemplate(ctx, "web"); err != nil || tm.Digest != "" || tm.Warm != nil {
		t.Errorf("an old template: %+v %v", tm, err)
	}
}

// TestTemplateLayersRoundTrip: an image template's layers come back from
// a get and a list, in their order; a template without any has none.
func TestTemplateLayersRoundTrip(t *testing.T) { eachStore(t, testTemplateLayersRoundTrip) }

func testTemplateLayersRoundTrip(t *testing.T, where string) {
	ctx := context.Background()
	s := openAt(t, where)
	layers := []string{"sha256:" + strings.Repeat("01", 32), "sha256:" + strings.Repeat("02", 32)}
	if err := s.PutTemplate(ctx, Template{Name: "img", Rootfs: "/r", Process: api.Process{Args: []string{"/a"}}, Layers: layers}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutTemplate(ctx, Template{Name: "dir", Rootfs: "/r", Process: api.Process{Args: []string{"/a"}}}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetTemplate(ctx, "img"); err != nil || !slices.Equal(got.Layers, layers) {
		t.Errorf("layers back from a get: %v %v", got.Layers, err)
	}
	if got, err := s.GetTemplate(ctx, "dir"); err != nil || got.Layers != nil {
		t.Errorf("a template of no image came back with layers %v, %v", got.Layers, err)
	}
	ts, err := s.ListTemplates(ctx)
	if err != nil || len(ts) != 2 || ts[0].Name != "dir" || ts[0].Layers != nil || !slices.Equal(ts[1].Layers, layers) {
		t.Errorf("layers back from a list: %+v %v", ts, err)
	}
}

// TestCanceledWriteTellsWhatHappened: on SQLite, a write whose context
// ends while it runs answers what happened: an error only when the row is
// not there, nil only when it is. modernc.org/sqlite answers ctx.Err()
// for a statement that finished while its context ended, and a node told
// "canceled" for a sandbox it had recorded left it detached/hot for good
// (Store.writeCtx). The cancels land at spread moments around the insert.
func TestCanceledWriteTellsWhatHappened(t *testing.T) {
	s := openAt(t, filepath.Join(t.TempDir(), "state.db"))
	bg := context.Background()
	if err := s.PutTemplate(bg, Template{Name: "t", Rootfs: "/", Process: api.Process{Args: []string{"/x"}}}); err != nil {
		t.Fatal(err)
	}
	// How long one insert takes here, to spread the cancels across it.
	began := time.Now()
	if err := s.CreateSandbox(bg, Sandbox{ID: "probe", Name: "probe", Template: "t", Slot: 0, HostPorts: map[int]int{}}); err != nil {
		t.Fatal(err)
	}
	span := 2 * time.Since(began)
	refused := 0
	for i := range 400 {
		id := fmt.Sprintf("s%d", i)
		ctx, cancel := context.WithCancel(bg)
		delay := span * time.Duration(i%40) / 40
		timer := time.AfterFunc(delay, cancel)
		err := s.CreateSandbox(ctx, Sandbox{ID: id, Name: id, Template: "t", Slot: i + 1, HostPorts: map[int]int{}})
		timer.Stop()
		cancel()
		_, gerr := s.GetSandbox(bg, id)
		switch {
		case err != nil && gerr == nil:
			t.Fatalf("insert %d (cancel after %v) answered %v, yet its row is there", i, delay, err)
		case err == nil && gerr != nil:
			t.Fatalf("insert %d answered nil, yet its row is not there: %v", i, gerr)
		case err != nil:
			refused++
		}
	}
	t.Logf("%d of 400 refused before they wrote (the template's read saw the cancel)", refused)
}
