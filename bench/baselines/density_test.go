package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"sandstorm/internal/testenv"
)

func TestStopReason(t *testing.T) {
	for _, c := range []struct {
		base, avail, budget int64
		started, max        int
		stop                bool
	}{
		{base: 2000, avail: 2000, budget: 1400, started: 0},
		{base: 2000, avail: 601, budget: 1400, started: 40},
		{base: 2000, avail: 600, budget: 1400, started: 41, stop: true},
		{base: 2000, avail: 100, budget: 1400, started: 45, stop: true},
		{base: 2000, avail: 1900, budget: 1400, started: 3, max: 3, stop: true},
		{base: 2000, avail: 1900, budget: 1400, started: 2, max: 3},
	} {
		if got := stopReason(c.base, c.avail, c.budget, c.started, c.max); (got != "") != c.stop {
			t.Errorf("%+v: %q, want stop %v", c, got, c.stop)
		}
	}
}

// fake is a runtime whose every copy costs cost MiB of a pretend host, and
// whose copy failAt (if > 0) does not start.
type fake struct {
	avail   int64
	cost    int64
	failAt  int
	running map[string]bool
	closed  bool
}

func (*fake) Name() string                           { return "fake" }
func (*fake) Version(context.Context) string         { return "1" }
func (*fake) Prepare(context.Context, program) error { return nil }
func (f *fake) Start(_ context.Context, _ program, i int) (instance, error) {
	if f.failAt > 0 && i == f.failAt {
		return instance{}, errors.New("no room")
	}
	f.avail -= f.cost
	id := fmt.Sprint(i)
	f.running[id] = true
	return instance{ID: id, URL: id}, nil
}
func (f *fake) Stop(_ context.Context, in instance) error {
	delete(f.running, in.ID)
	f.avail += f.cost
	return nil
}
func (f *fake) Close(ctx context.Context) error {
	for id := range f.running {
		f.Stop(ctx, instance{ID: id})
	}
	f.closed = true
	return nil
}

func fakeEnv(f *fake, answers func(url string) bool) densityEnv {
	return densityEnv{
		availMiB: func() (int64, error) { return f.avail, nil },
		answer: func(_ context.Context, url string, _ time.Time) error {
			if answers(url) {
				return nil
			}
			return errors.New("silent")
		},
		settle: func(context.Context) {},
		log:    func(string, ...any) {},
	}
}

func TestDensityStopsAtTheBudget(t *testing.T) {
	f := &fake{avail: 2000, cost: 30, running: map[string]bool{}}
	d, err := density(context.Background(), f, program{Name: "web"}, 100, 0, fakeEnv(f, func(string) bool { return true }))
	if err != nil {
		t.Fatal(err)
	}
	// 4 copies take 120 MiB, past the budget: the 4th did not fit.
	if d.Copies != 3 || len(d.Started) != 4 || d.Answered != 3 || d.UsedMiB != 120 || d.PerCopyMiB != 30 {
		t.Errorf("%+v, want 3 copies of 4 started, 30 MiB each", d)
	}
	if !strings.Contains(d.Ended, "memory") {
		t.Errorf("ended %q", d.Ended)
	}
}

// TestDensityNoRecall: tiered, the copies are not all called again at
// the end (each would be a cold start); every first answer still is.
func TestDensityNoRecall(t *testing.T) {
	f := &fake{avail: 2000, cost: 30, running: map[string]bool{}}
	calls := 0
	env := fakeEnv(f, func(string) bool { calls++; return true })
	env.noRecall = true
	d, err := density(context.Background(), f, program{Name: "web"}, 100, 0, env)
	if err != nil {
		t.Fatal(err)
	}
	if d.Copies != 3 || d.Answered != 0 || calls != len(d.Started) {
		t.Errorf("%+v after %d calls, want 3 copies, none called again, one call per start", d, calls)
	}
}

func TestDensityStopsAtAFailure(t *testing.T) {
	f := &fake{avail: 2000, cost: 10, failAt: 5, running: map[string]bool{}}
	d, _ := density(context.Background(), f, program{Name: "web"}, 1000, 0, fakeEnv(f, func(string) bool { return true }))
	if d.Copies != 5 || d.UsedMiB != 50 || !strings.Contains(d.Ended, "did not start") {
		t.Errorf("%+v, want 5 copies and why the 6th failed", d)
	}
	// A copy that never answers ends it too, and is not counted.
	f = &fake{avail: 2000, cost: 10, running: map[string]bool{}}
	d, _ = density(context.Background(), f, program{Name: "web"}, 1000, 0, fakeEnv(f, func(url string) bool { return url != "2" }))
	if d.Copies != 2 || !strings.Contains(d.Ended, "did not answer") {
		t.Errorf("%+v, want 2 copies", d)
	}
	// Asked for 3: 3.
	f = &fake{avail: 2000, cost: 10, running: map[string]bool{}}
	d, _ = density(context.Background(), f, program{Name: "web"}, 1000, 3, fakeEnv(f, func(string) bool { return true }))
	if d.Copies != 3 || d.Answered != 3 || d.PerCopyMiB != 10 {
		t.Errorf("%+v, want 3 copies", d)
	}
}

// The plain runtime's Close ends every process it started, and the
// processes' children with them (each copy is a process group).
func TestPlainCloseEndsCopies(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "the plain runtime chroots: needs root")
	}
	r := &plain{}
	prog := program{Name: "sleep", Rootfs: "/", Args: []string{"/bin/sh", "-c", "sleep 600 & sleep 600"}}
	var pids []int
	for i := range 2 {
		if _, err := r.Start(context.Background(), prog, i); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, r.procs[fmt.Sprint(i)].Process.Pid)
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		deadline := time.Now().Add(10 * time.Second)
		for syscall.Kill(-pid, 0) == nil {
			if time.Now().After(deadline) {
				out, _ := exec.Command("ps", "-o", "pid,pgid,cmd", "-g", fmt.Sprint(pid)).CombinedOutput()
				t.Fatalf("process group %d still there after Close:\n%s", pid, out)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// An engine's Close removes its directory even when it never started
// (an engine that is not installed).
func TestEngineCloseRemovesItsState(t *testing.T) {
	dir := t.TempDir()
	e := newEngine("docker", "runc", "/nonexistent/runsc", dir)
	if err := os.MkdirAll(e.dir+"/data", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.dir); !os.IsNotExist(err) {
		t.Errorf("%s after Close: %v", e.dir, err)
	}
}

// What an engine leaves running is found by its directory in the command
// line, and killed; nothing else is.
func TestKillNaming(t *testing.T) {
	dir := t.TempDir()
	// sh's $0 names dir. It waits in its builtin read on a pipe kept
	// open, never forking: a child forked for a sleep names dir too
	// until it has exec'd, and was killed with it now and then (CI:
	// "killed 2, want 1").
	left := exec.Command("sh", "-c", "read x", dir)
	other := exec.Command("sh", "-c", "read x", "other")
	for _, c := range []*exec.Cmd{left, other} {
		in, err := c.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		defer in.Close()
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	defer other.Process.Kill()
	// Start returns before the child has exec'd: until then its command
	// line is this test's.
	for _, c := range []*exec.Cmd{left, other} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c.Process.Pid))
			if strings.HasPrefix(string(b), "sh\x00") {
				break
			}
			if time.Now().After(deadline) {
				st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.Process.Pid))
				t.Fatalf("pid %d (%v) never ran sh: %q; stat %s", c.Process.Pid, c.Args, b, st)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if n := killNaming(dir); n != 1 {
		t.Errorf("killed %d, want 1", n)
	}
	if err := left.Wait(); err == nil {
		t.Error("the process naming the directory was not killed")
	}
	if syscall.Kill(other.Process.Pid, 0) != nil {
		t.Error("a process not naming it was killed")
	}
}

// TestDensityRecallInterrupted: a run stopped while every copy is called
// again counts only the calls made, so the table says how far it got
// rather than reading the rest as copies that failed to answer.
func TestDensityRecallInterrupted(t *testing.T) {
	f := &fake{avail: 2000, cost: 10, running: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	starts := 0
	env := fakeEnv(f, func(string) bool { return true })
	env.answer = func(ctx context.Context, url string, _ time.Time) error {
		if starts++; starts > 5+2 { // 5 first answers, 2 recalls, then the run stops
			cancel()
			return ctx.Err()
		}
		return nil
	}
	d, _ := density(ctx, f, program{Name: "web"}, 1000, 5, env)
	if d.Copies != 5 || d.Recalled != 2 || d.Answered != 2 {
		t.Fatalf("%+v, want 5 copies, 2 called again and answered", d)
	}
	if got := answeredCell(densityRow{densityResult: d}); got != "2 of 2 called (run stopped before the other 3)" {
		t.Errorf("cell %q", got)
	}
}

func TestAnsweredCell(t *testing.T) {
	for _, c := range []struct {
		row  densityRow
		want string
	}{
		{densityRow{densityResult: densityResult{Copies: 4, Recalled: 4, Answered: 3}}, "3 of 4"},
		{densityRow{densityResult: densityResult{Copies: 2600}, Tiered: true, PickWanted: 100, Picked: 100, PickAnswered: 99}, "picked 99 of 100"},
		{densityRow{densityResult: densityResult{Copies: 2600}, Tiered: true, PickWanted: 100, Picked: 40, PickAnswered: 40}, "picked 40 of 40 (run stopped before the other 60)"},
	} {
		if got := answeredCell(c.row); got != c.want {
			t.Errorf("%+v: %q, want %q", c.row, got, c.want)
		}
	}
}
