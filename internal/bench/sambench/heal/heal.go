// Package heal is sam-bench heal: how fast the mesh heals from each fault
// of issue 29, measured on labs of internal/sam/meshlab.
package heal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"sandstorm/internal/bench"
	"sandstorm/internal/sam/meshlab"
)

// The mesh's faults (issue 29, item 4), each run once in every lab, the
// labs at once. Lab k's fault falls k × (Stride + Spread/Runs) after the
// first: with Stride and Spread the members' check interval, at Runs
// points spread over that interval, and a Stride apart so that not every
// lab's probes run dense at once (on this machine's two cores twenty
// labs probing every 100 ms together slowed the mesh they measured).
const (
	RouterRestart     = "router-restart"       // kill -9, started again at once, as a supervisor would
	RouterDown        = "router-down"          // kill -9, started again after RouterDown
	MemberCut         = "member-cut"           // one member's traffic to the router dropped for MemberCut
	ControlPlaneDown  = "control-plane-down"   // kill -9, started again after ControlPlaneDown
	MemberRestart     = "member-restart"       // one member killed -9 and started again at once
	TwoRoutersOneGone = "two-routers-one-gone" // two routers, one killed -9 for good
)

// Scenarios are the faults, in the order they run.
var Scenarios = []string{RouterRestart, RouterDown, MemberCut, ControlPlaneDown, MemberRestart, TwoRoutersOneGone}

// Config is sam-bench heal's shape.
type Config struct {
	Bins meshlab.Bins
	// Dir holds the labs' data dirs and logs.
	Dir string
	// Runs is how many labs run each fault (at once).
	Runs      int
	Scenarios []string
	// Sparse and Dense are the probes' intervals, Dense for DenseFor
	// after a fault begins and after it ends.
	Sparse, Dense, DenseFor time.Duration
	// Watch is how long after a fault's end the probes must go on
	// succeeding.
	Watch time.Duration
	// Spread is the span of the members' check interval the labs' faults
	// are spread over; Stride the whole intervals between two labs'.
	Spread, Stride                          time.Duration
	RouterDown, MemberCut, ControlPlaneDown time.Duration
	// Net is the first of the labs' /24s' second octet ("10.<Net>.k.0").
	Net int
	// LogLevel is the mesh processes' (meshlab.Config).
	LogLevel string
}

// healRun is one lab's run of a fault.
type healRun struct {
	lab    int
	offset time.Duration
	// fault began, ended (the harness undid it: a process asked to start
	// again, a rule removed) and the process restarted serving again.
	at, end, up time.Time
	// said is what the members' status said during the fault, if asked.
	said string
	err  error
}

// Run runs each scenario on cfg.Runs labs and records, for each, how
// long the mesh took from the fault's end until every member's names are
// found again and a cross-node call answers each way, for good (the
// probes succeeding to the end of Watch), and what failed meanwhile.
func Run(ctx context.Context, cfg Config, res *bench.Results, logf func(string, ...any)) error {
	res.Params["heal"] = cfg
	var one, two []string
	for _, s := range cfg.Scenarios {
		switch {
		case s == TwoRoutersOneGone:
			two = append(two, s)
		case slices.Contains(Scenarios, s):
			one = append(one, s)
		default:
			return fmt.Errorf("heal: no scenario %q (want one of %v)", s, Scenarios)
		}
	}
	for i, set := range [][]string{one, two} {
		if len(set) == 0 {
			continue
		}
		labs, err := makeLabs(ctx, cfg, i+1, logf)
		if err != nil {
			return err
		}
		for _, sc := range set {
			if err := healScenario(ctx, cfg, labs, sc, res, logf); err != nil {
				closeLabs(labs)
				return err
			}
		}
		closeLabs(labs)
	}
	return nil
}

// makeLabs starts cfg.Runs labs with routers routers each, a few at a
// time (each start is a handful of processes enrolling at once).
func makeLabs(ctx context.Context, cfg Config, routers int, logf func(string, ...any)) ([]*meshlab.Lab, error) {
	t0 := time.Now()
	labs := make([]*meshlab.Lab, cfg.Runs)
	errs := make([]error, cfg.Runs)
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for k := range cfg.Runs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			labs[k], errs[k] = meshlab.New(ctx, meshlab.Config{
				Bins: cfg.Bins, Net: fmt.Sprintf("10.%d.%d", cfg.Net+routers-1, k), Tag: fmt.Sprintf("%d%d-%d", os.Getpid()%1000, routers, k),
				Routers: routers, LogLevel: cfg.LogLevel, Dir: filepath.Join(cfg.Dir, fmt.Sprintf("routers-%d", routers), fmt.Sprintf("lab-%02d", k)),
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		closeLabs(labs)
		return nil, err
	}
	logf("%d labs up (a control plane, %d router(s), 2 members each, every machine a namespace) in %v", cfg.Runs, routers, time.Since(t0).Round(100*time.Millisecond))
	return labs, nil
}

func closeLabs(labs []*meshlab.Lab) {
	var wg sync.WaitGroup
	for _, l := range labs {
		if l != nil {
			wg.Go(l.Close)
		}
	}
	wg.Wait()
}

// healScenario runs sc on every lab at once, each at its offset, probes
// throughout, and records what the probes say.
func healScenario(ctx context.Context, cfg Config, labs []*meshlab.Lab, sc string, res *bench.Results, logf func(string, ...any)) error {
	logf("%s: %d runs, faults %v apart (%v of the check interval apart)", sc, len(labs), cfg.Stride+cfg.Spread/time.Duration(len(labs)), cfg.Spread/time.Duration(len(labs)))
	probers := make([]*meshlab.Prober, len(labs))
	for i, l := range labs {
		probers[i] = l.Probe(ctx, cfg.Sparse, cfg.Dense)
	}
	start := time.Now().Add(cfg.Sparse + time.Second)
	runs := make([]healRun, len(labs))
	var wg sync.WaitGroup
	for i, l := range labs {
		runs[i] = healRun{lab: i, offset: time.Duration(i) * (cfg.Stride + cfg.Spread/time.Duration(len(labs)))}
		wg.Go(func() {
			at := start.Add(runs[i].offset)
			if !sleepUntil(ctx, at.Add(-cfg.Sparse)) {
				return
			}
			probers[i].Densely(cfg.Sparse + cfg.DenseFor)
			if sleepUntil(ctx, at) {
				fault(ctx, cfg, l, sc, &runs[i], probers[i])
			}
		})
	}
	wg.Wait()
	last := time.Time{}
	for _, r := range runs {
		last = later(last, r.end)
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(last.Add(cfg.Watch))):
	}
	recs := make([]map[string][]meshlab.Probe, len(labs))
	for i, p := range probers {
		p.Stop()
		recs[i] = p.Record()
		// Every probe, beside the lab's logs: what a run's figures came from.
		if b, err := json.Marshal(map[string]any{"fault": runs[i].at, "end": runs[i].end, "up": runs[i].up, "probes": recs[i]}); err == nil {
			os.WriteFile(filepath.Join(labs[i].Dir(), "probes-"+sc+".json"), b, 0o600)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	recordHeal(cfg, sc, runs, recs, res, logf)
	// The next scenario starts from a whole mesh.
	for _, l := range labs {
		if err := l.WaitHealthy(ctx, 2*time.Minute); err != nil && sc != TwoRoutersOneGone {
			return fmt.Errorf("%s: a lab did not come back: %w", sc, err)
		}
	}
	return nil
}

// phase is where in the check interval r's fault fell, from the first's.
func phase(cfg Config, r healRun) time.Duration {
	return cfg.Spread * time.Duration(r.lab) / time.Duration(cfg.Runs)
}

// sleepUntil waits until t; false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(time.Until(t)):
		return true
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// fault does sc to l and fills in when it began and ended.
func fault(ctx context.Context, cfg Config, l *meshlab.Lab, sc string, r *healRun, p *meshlab.Prober) {
	// hold keeps the fault for d, the probes dense from a sparse interval
	// before its end.
	hold := func(d time.Duration) {
		sleepUntil(ctx, time.Now().Add(d-cfg.Sparse))
		p.Densely(cfg.Sparse + cfg.DenseFor)
		sleepUntil(ctx, r.at.Add(d))
	}
	b := l.Members[len(l.Members)-1]
	r.at = time.Now()
	switch sc {
	case RouterRestart, RouterDown:
		l.Routers[0].Proc.Kill()
		if sc == RouterDown {
			hold(cfg.RouterDown)
		}
		r.end, r.up, r.err = l.RestartRouter(ctx, l.Routers[0])
	case MemberCut:
		r.err = l.Cut(b, l.Routers[0])
		hold(cfg.MemberCut)
		r.said = said(ctx, l, b)
		if err := l.Uncut(b, l.Routers[0]); err != nil {
			r.err = errors.Join(r.err, err)
		}
		r.end = time.Now()
		r.up = r.end
	case ControlPlaneDown:
		l.CP.Kill()
		hold(cfg.ControlPlaneDown)
		r.said = said(ctx, l, b)
		r.end, r.up, r.err = l.RestartControlPlane(ctx)
	case MemberRestart:
		b.Proc.Kill()
		r.end, r.up, r.err = l.RestartMember(ctx, b)
	case TwoRoutersOneGone:
		l.Routers[0].Proc.Kill()
		r.end, r.up = r.at, r.at
	}
}

// said is what member m's status says of its routers and control plane.
func said(ctx context.Context, l *meshlab.Lab, m *meshlab.Member) string {
	st, err := l.Status(ctx, m)
	if err != nil {
		return "status: " + err.Error()
	}
	out := ""
	for _, r := range st.Routers {
		out += fmt.Sprintf("router joined=%v; ", r.Joined)
	}
	cp := st.ControlPlane
	return out + fmt.Sprintf("control plane reachable=%v keys from %s policy v%d stale=%v",
		cp.Reachable, cp.KeysAt.Format(time.TimeOnly), cp.PolicyVersion, cp.PolicyStale)
}

// recordHeal adds sc's series, its table of runs and a note.
func recordHeal(cfg Config, sc string, runs []healRun, recs []map[string][]meshlab.Probe, res *bench.Results, logf func(string, ...any)) {
	heal := res.AddSeries(sc+"/heal", "from the fault's end (the process asked to start again, the rule removed; for "+TwoRoutersOneGone+
		": the kill) until every member's names were found again (a lookup past the cache) and a cross-node call answered, each way, for good", "≤ 5 s (issue 29)")
	var up *bench.Series
	if sc != MemberCut && sc != TwoRoutersOneGone {
		up = res.AddSeries(sc+"/heal-from-serving", "as heal, from the moment the restarted process said it serves", "")
	}
	tab := &bench.Table{Title: sc + ": each run",
		Description: "phase: where in the members' check interval the fault fell (lab k's: k/runs of it); calls failed: cross-node calls (both ways) that failed during the fault, then after its end; " +
			"relapses: a success followed by a failure after the end; longest outage: most failed probes in a row after the end",
		Columns: []string{"lab", "phase ms", "heal ms", "calls failed during / after", "relapses", "longest outage", "unhealed", "members said"}}
	var unhealed, failedDuring, failedAfter int
	for i, r := range runs {
		if r.err != nil {
			heal.Fail("lab %d: %v", r.lab, r.err)
			tab.Rows = append(tab.Rows, []string{fmt.Sprint(r.lab), fmt.Sprint(phase(cfg, r).Milliseconds()), "error: " + r.err.Error()})
			continue
		}
		h := meshlab.Measure(recs[i], r.end, r.end.Add(cfg.Watch))
		during := meshlab.Measure(recs[i], r.at, r.end, "call ")
		calls := meshlab.Measure(recs[i], r.end, r.end.Add(cfg.Watch), "call ")
		failedDuring += during.Failed
		failedAfter += calls.Failed
		if err := h.Err(); err != nil {
			unhealed++
			heal.Fail("lab %d: %v", r.lab, err)
		} else {
			heal.AddDuration(h.After)
			if up != nil {
				up.AddDuration(max(h.After-r.up.Sub(r.end), 0))
			}
		}
		tab.Rows = append(tab.Rows, []string{fmt.Sprint(r.lab), fmt.Sprint(phase(cfg, r).Milliseconds()), fmt.Sprint(h.After.Milliseconds()),
			fmt.Sprintf("%d / %d", during.Failed, calls.Failed), fmt.Sprint(h.Relapses), fmt.Sprint(h.LongestOutage),
			fmt.Sprint(h.Unhealed), r.said})
	}
	res.Tables = append(res.Tables, tab)
	heal.Summarize()
	msg := fmt.Sprintf("%s: %d runs, %d not healed; cross-node calls failed %d during the faults and %d after their end", sc, len(runs), unhealed, failedDuring, failedAfter)
	if s := heal.Summary; s != nil {
		msg += fmt.Sprintf("; heal p50 %.0f ms, worst %.0f ms", s.P50Ms, s.MaxMs)
	}
	res.Note("%s", msg)
	logf("%s", msg)
}
