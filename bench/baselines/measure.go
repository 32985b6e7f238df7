package main

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"sandstorm/internal/bench"
	"sandstorm/internal/demo"
	"sandstorm/internal/memguard"
)

// measurer measures runtimes one after another and keeps what each held.
type measurer struct {
	c        config
	br       *bench.Run
	versions map[string]string
	rows     []densityRow
	starts   []startRow
}

// densityRow is one runtime and program's density.
type densityRow struct {
	Runtime, Program string
	densityResult
	// Tiered: the node tiered its idle copies, so they were picked at
	// random (PickWanted asked for, Picked called before the run ended)
	// rather than all called again, and PickAnswered of them answered.
	Tiered                           bool
	PickWanted, Picked, PickAnswered int
	Err                              string
	// Usage is where the memory went with every copy running: the
	// memory of the host's processes by class (breakdown.go), less what
	// each class had before the runtime started. Idle is the same after
	// --idle-wait more, with IdlePerCopyMiB MemAvailable's drop then;
	// Restored the same again once every copy was snapshotted and woken
	// (sandstormd all awake only).
	Usage, Idle, Restored              *memSnapshot
	IdlePerCopyMiB, RestoredPerCopyMiB float64
}

type startRow struct {
	Runtime, Program string
	Poll50, Gateway  *bench.Series
}

// buildProgram builds the demo rootfs for name into dir, or reads the
// one given (a demo rootfs built before: demo.Describe says how it runs).
func buildProgram(name, dir, given string) (program, error) {
	var d demo.Demo
	var err error
	if given != "" {
		dir = given
		d, err = demo.Describe(name)
	} else {
		d, err = demo.Build(name, dir)
	}
	if err != nil {
		return program{}, fmt.Errorf("the %s rootfs: %w", name, err)
	}
	return program{Name: name, Rootfs: dir, Args: d.Args, Env: d.Env}, nil
}

// programPort is where the demo programs listen by default (sandstormd's
// sandboxes each have their own network, so they keep it).
const programPort = demo.Port

var hc = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// measure runs one runtime's series for prog and closes the runtime,
// whatever happened: an error is the row's, and the run goes on.
func (m *measurer) measure(ctx context.Context, name string, prog program) {
	rt := m.newRuntime(name)
	row := densityRow{Runtime: rt.Name(), Program: prog.Name}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		if err := rt.Close(cctx); err != nil {
			m.br.Results.Note("%s %s: cleaning up: %v", rt.Name(), prog.Name, err)
		}
		m.rows = append(m.rows, row)
	}()
	logf("%s, %s: preparing", rt.Name(), prog.Name)
	base, _ := memoryByClass()
	availBefore, _ := memguard.AvailableMiB()
	if err := rt.Prepare(ctx, prog); err != nil {
		row.Err = err.Error()
		m.br.Results.Note("%s %s: %v", rt.Name(), prog.Name, err)
		return
	}
	m.versions[rt.Name()] = rt.Version(ctx)
	m.startSeries(ctx, name, rt, prog)
	logf("%s, %s: density", rt.Name(), prog.Name)
	maxCopies := m.c.maxCopies
	if s, ok := rt.(*sandstormd); ok && s.tiered {
		maxCopies = m.c.tieredCount
		if m.c.maxCopies > 0 {
			maxCopies = min(maxCopies, m.c.maxCopies)
		}
	}
	avail := func() (int64, error) { return memguard.AvailableMiB() }
	s, isSd := rt.(*sandstormd)
	tiered := isSd && s.tiered
	d, err := density(ctx, rt, prog, m.c.budgetMiB, maxCopies, densityEnv{availMiB: avail, noRecall: tiered,
		answer: pollAnswer(hc, 50*time.Millisecond),
		settle: func(ctx context.Context) { sleepCtx(ctx, settleFor) },
		log:    logf})
	row.densityResult = d
	if err != nil {
		row.Err = err.Error()
	}
	row.Usage = snapshotSince(base)
	logf("%s, %s: %d copies, %.1f MiB each (%s)", rt.Name(), prog.Name, d.Copies, d.PerCopyMiB, d.Ended)
	m.idle(ctx, rt, &row, base, availBefore)
	row.Tiered = tiered
	if tiered && m.c.pick > 0 && d.Copies > 0 {
		row.PickWanted = min(m.c.pick, d.Copies)
		row.Picked, row.PickAnswered = m.pickAtRandom(ctx, name, rt, prog, d.Started[:d.Copies])
	}
}

// idle measures row's copies again once they have idled --idle-wait, and
// for sandstormd all awake once more after a snapshot and a wake: what a
// copy costs when nobody calls it, fresh and restored.
func (m *measurer) idle(ctx context.Context, rt runtime, row *densityRow, base map[string]classUsage, availBefore int64) {
	n := len(row.Started)
	if m.c.idleWait <= 0 || n == 0 || row.Err != "" {
		return
	}
	sleepCtx(ctx, m.c.idleWait)
	row.Idle = snapshotSince(base)
	if now, err := memguard.AvailableMiB(); err == nil {
		row.IdlePerCopyMiB = float64(availBefore-now) / float64(n)
	}
	s, ok := rt.(*sandstormd)
	if !ok || s.tiered || s.warm {
		return
	}
	logf("%s, %s: snapshot and wake every copy", rt.Name(), row.Program)
	if err := s.snapshotAndWake(ctx, row.Started[:n]); err != nil {
		m.br.Results.Note("%s %s: snapshot and wake: %v", rt.Name(), row.Program, err)
		return
	}
	sleepCtx(ctx, m.c.idleWait)
	row.Restored = snapshotSince(base)
	if now, err := memguard.AvailableMiB(); err == nil {
		row.RestoredPerCopyMiB = float64(availBefore-now) / float64(n)
	}
}

// startSeries times start → first answer of one copy at a time, polled
// every 50 ms and on the gateway's dial schedule, stopping each copy
// before the next.
func (m *measurer) startSeries(ctx context.Context, key string, rt runtime, prog program) {
	row := startRow{Runtime: rt.Name(), Program: prog.Name}
	polls := []struct {
		name   string
		series **bench.Series
		answer func(context.Context, string, time.Time) error
	}{
		{"poll50", &row.Poll50, pollAnswer(hc, 50*time.Millisecond)},
		{"gateway", &row.Gateway, func(ctx context.Context, url string, deadline time.Time) error {
			return bench.FirstAnswer(ctx, hc, url, deadline)
		}},
	}
	for _, p := range polls {
		s := m.br.Results.AddSeries(fmt.Sprintf("start/%s/%s/%s", prog.Name, key, p.name),
			"start of one copy to its first 200 on GET /, polled "+map[string]string{"poll50": "every 50 ms (the seed's poll)", "gateway": "on the gateway's dial schedule"}[p.name], "")
		*p.series = s
		for i := 0; i < m.c.n && ctx.Err() == nil; i++ {
			t0 := time.Now()
			in, err := rt.Start(ctx, prog, i)
			if err != nil {
				s.Fail("start: %v", err)
				break
			}
			if err := p.answer(ctx, in.URL, time.Now().Add(2*time.Minute)); err != nil {
				s.Fail("%v", err)
			} else {
				s.AddDuration(time.Since(t0))
			}
			if err := rt.Stop(ctx, in); err != nil {
				s.Fail("stop: %v", err)
			}
		}
	}
	m.starts = append(m.starts, row)
}

// pickAtRandom waits for the tiered node's copies to go idle, then calls
// pick of them chosen at random, one at a time, timing each answer.
func (m *measurer) pickAtRandom(ctx context.Context, key string, rt runtime, prog program, copies []instance) (picked, answered int) {
	t := m.c.timers
	wait := t.Snapshot + 5*time.Second
	logf("%s, %s: waiting %s for idle copies to tier", rt.Name(), prog.Name, wait)
	sleepCtx(ctx, wait)
	s := m.br.Results.AddSeries(fmt.Sprintf("pick/%s/%s", prog.Name, key),
		"a copy picked at random once the rest were idle: GET / to its 200, on the gateway's dial schedule", "")
	for _, i := range rand.Perm(len(copies))[:min(m.c.pick, len(copies))] {
		t0 := time.Now()
		err := bench.FirstAnswer(ctx, hc, copies[i].URL, time.Now().Add(time.Minute))
		if ctx.Err() != nil {
			break // the run was stopped: the rest were not picked
		}
		picked++
		if err != nil {
			s.Fail("copy %s: %v", copies[i].ID, err)
			continue
		}
		s.AddDuration(time.Since(t0))
		answered++
	}
	return picked, answered
}

// densityTable is the seed's first table: how many copies each runtime
// held on the same memory, and what one cost.
func (m *measurer) densityTable() *bench.Table {
	t := &bench.Table{Title: "Density: copies held on the same memory",
		Description: "Copies started one after another, each waited for, until MemAvailable had dropped by the budget (or a copy failed); answered: how many of them answered again after the last. Tiered: copies the node was given, and of those picked at random once idle, how many answered.",
		Columns:     []string{"runtime", "program", "copies", "MiB per copy", "answered", "ended"},
		Data:        m.rows}
	for _, r := range m.rows {
		if r.Err != "" && r.Copies == 0 {
			t.Rows = append(t.Rows, []string{r.Runtime, r.Program, "—", "—", "—", bench.OneLine(r.Err)})
			continue
		}
		t.Rows = append(t.Rows, []string{r.Runtime, r.Program, strconv.Itoa(r.Copies),
			fmt.Sprintf("%.1f", r.PerCopyMiB), answeredCell(r), r.Ended})
	}
	return t
}

// answeredCell says how many copies answered when called again, or, for
// the tiered node, how many of those picked at random did; a recall or
// pick the run stopped short of says how far it got rather than counting
// the rest as failures.
func answeredCell(r densityRow) string {
	switch {
	case r.Tiered:
		cell := fmt.Sprintf("picked %d of %d", r.PickAnswered, r.Picked)
		if r.Picked < r.PickWanted {
			cell += fmt.Sprintf(" (run stopped before the other %d)", r.PickWanted-r.Picked)
		}
		return cell
	case r.Recalled < r.Copies:
		return fmt.Sprintf("%d of %d called (run stopped before the other %d)", r.Answered, r.Recalled, r.Copies-r.Recalled)
	}
	return fmt.Sprintf("%d of %d", r.Answered, r.Copies)
}

// breakdownTable says where each runtime's memory went, per copy.
func (m *measurer) breakdownTable() *bench.Table {
	t := &bench.Table{Title: "Where a copy's memory goes (MiB per copy: held of PSS)",
		Description: "The memory of the host's processes by what they are, less what they had before the runtime started, over the copies running: held is what no reclaim takes back without swap (anonymous and shared memory: a Go heap, a sandbox's memory file), of the PSS, the rest being file pages such as runsc's own text. Started: right after the last copy; idle: after --idle-wait more; restored: every copy snapshotted, woken and idle as long again. MemAvailable also counts the kernel's own memory for each copy (page tables, sockets, cgroups), which no process shows.",
		Columns:     []string{"runtime", "program", "copies", "when", "MemAvailable per copy", "per gVisor sandbox, its memory cgroup: usage = anon + memory file + page cache + kernel (sandboxes)", "by process: held of PSS (processes added)"}}
	for _, r := range m.rows {
		n := len(r.Started)
		if n == 0 {
			continue
		}
		for _, w := range []struct {
			when  string
			avail float64
			u     *memSnapshot
		}{{"started", r.PerCopyMiB, r.Usage}, {"idle", r.IdlePerCopyMiB, r.Idle}, {"restored", r.RestoredPerCopyMiB, r.Restored}} {
			if w.u == nil {
				continue
			}
			avail := "—"
			if w.avail > 0 {
				avail = fmt.Sprintf("%.1f", w.avail)
			}
			t.Rows = append(t.Rows, []string{r.Runtime, r.Program, strconv.Itoa(n), w.when, avail, cgroupLine(w.u.Sandboxes), usageLine(w.u.ByClass, n)})
		}
	}
	return t
}

// cgroupLine is s per sandbox, or "—" with none.
func cgroupLine(s sandboxCgroups) string {
	if s.N == 0 {
		return "—"
	}
	n := float64(s.N)
	return fmt.Sprintf("%.1f = %.1f + %.1f + %.1f + %.1f (%d)", s.UsageMiB/n, s.AnonMiB/n, s.ShmemMiB/n, s.CacheMiB/n, s.KernelMiB/n, s.N)
}

// snapshotSince reads the memory now, by class less base.
func snapshotSince(base map[string]classUsage) *memSnapshot {
	now := readMemory()
	now.ByClass = usageSince(now.ByClass, base)
	return &now
}

// usageLine is u per copy of n, class by class.
func usageLine(u map[string]classUsage, n int) string {
	var parts []string
	for _, c := range slices.Sorted(maps.Keys(u)) {
		if v := u[c]; v.PssMiB >= 0.05*float64(n) || v.Procs > 0 {
			parts = append(parts, fmt.Sprintf("%s %.1f of %.1f (%d)", c, v.HeldMiB/float64(n), v.PssMiB/float64(n), v.Procs))
		}
	}
	return strings.Join(parts, "; ")
}

// startTable is the seed's second: start → first answer, p50 and p99.
func (m *measurer) startTable() *bench.Table {
	t := &bench.Table{Title: "Start → first answer, one at a time (ms)",
		Columns: []string{"runtime", "program", "p50 (50 ms poll)", "p99 (50 ms poll)", "p50 (gateway's schedule)", "p99 (gateway's schedule)"}}
	cell := func(s *bench.Series, p99 bool) string {
		d, err := bench.Distribute(s.SamplesMs)
		if err != nil {
			return "—"
		}
		if p99 {
			return bench.FormatMs(d.P99)
		}
		return bench.FormatMs(d.P50)
	}
	for _, r := range m.starts {
		t.Rows = append(t.Rows, []string{r.Runtime, r.Program, cell(r.Poll50, false), cell(r.Poll50, true),
			cell(r.Gateway, false), cell(r.Gateway, true)})
	}
	return t
}
