// Command restoremem takes apart the memory of a sandbox restored from a
// checkpoint against the same sandbox started cold (issue 19: a sandbox
// restored from a warm image or a clone held ≈ 6 MiB more than a cold one,
// 30 against 24.5 MiB for the web demo). It runs raw runsc on the node's
// own bundle, flags and network (internal/bench/raw, as bench/tiers' raw
// series do), so that what it finds is runsc's and not the node's: each
// sample starts the demo cold, reads its memory at the first answer and
// again after --settle, checkpoints it, restores it, and reads the
// restored one the same way. A reading is the sandbox's memory cgroup
// (usage and memory.stat) and every process in it, mapping by mapping
// (internal/bench/memstat). Results, with every reading, go to
// bench/results/restoremem-<date>-<commit>/.
//
//	sudo go run ./bench/restoremem                 # web, 5 samples
//	sudo go run ./bench/restoremem --template app64 -n 3
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/bench/memstat"
	"sandstorm/internal/bench/raw"
	"sandstorm/internal/demo"
	"sandstorm/internal/reclaim"
	"sandstorm/internal/sandbox/gvisor"
)

type config struct {
	template, runsc, platform, out, repo string
	n                                    int
	limitMiB                             int64
	settle, timeout                      time.Duration
}

func main() {
	var c config
	fs := flag.NewFlagSet("restoremem", flag.ContinueOnError)
	fs.StringVar(&c.template, "template", "web", "demo template ("+strings.Join(demo.Names(), ", ")+")")
	fs.IntVar(&c.n, "n", 5, "samples (each a cold start and its restore)")
	fs.Int64Var(&c.limitMiB, "memory", raw.NodeDefaultMemoryMiB, "the sandbox's memory limit, MiB (the node's default)")
	fs.DurationVar(&c.settle, "settle", 10*time.Second, "the second reading comes this long after the first answer")
	fs.DurationVar(&c.timeout, "timeout", time.Minute, "bound on each runsc command and first answer")
	fs.StringVar(&c.runsc, "runsc", "bin/runsc", "runsc binary")
	fs.StringVar(&c.platform, "platform", gvisor.DefaultPlatform, "runsc platform")
	fs.StringVar(&c.out, "out", "bench/results", "where the results directory goes")
	fs.StringVar(&c.repo, "repo", ".", "the source tree (for the commit)")
	bench.ParseFlags(fs, func() error {
		if c.n < 1 {
			return bench.ErrBadArguments
		}
		return nil
	})
	bench.Main("restoremem", func(ctx context.Context) (string, error) { return run(ctx, c) })
}

// reading is one memory reading of one sandbox.
type reading struct {
	Sample int              `json:"sample"`
	Kind   string           `json:"kind"` // cold or restored
	When   string           `json:"when"` // first-answer or settled
	Mem    memstat.Snapshot `json:"mem"`
}

func run(ctx context.Context, c config) (string, error) {
	br, err := bench.Begin(ctx, bench.Plan{Tool: "bench/restoremem", Title: "Memory of a restored sandbox against a cold one (" + c.template + ", raw runsc)",
		Out: c.out, Repo: c.repo, Prefix: "restoremem-", Runsc: c.runsc, Demo: c.template})
	if err != nil {
		return "", err
	}
	defer br.Close()
	res, dir := br.Results, br.Dir
	d := br.Demo
	res.Params = map[string]any{"template": c.template, "n": c.n, "memory_mib": c.limitMiB, "settle": c.settle.String(), "platform": c.platform}
	var id [3]byte
	rand.Read(id[:])
	e, err := raw.New(ctx, br.Runsc, c.platform, hex.EncodeToString(id[:]), nil, c.timeout)
	if err != nil {
		return "", err
	}
	defer e.Cleanup(context.WithoutCancel(ctx))
	t := raw.Template(api.Template{Name: c.template, Rootfs: br.Rootfs, Process: api.Process{Args: d.Args, Env: d.Env}, Ports: d.Ports})
	url := e.URL(d.Ports[0])
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	var readings []reading
	usage := map[string]*bench.Series{}
	series := func(kind, when string) *bench.Series {
		k := kind + "/" + when
		if usage[k] == nil {
			usage[k] = res.AddSeries("usage/"+k, "memory cgroup usage of the "+kind+" sandbox at its "+strings.ReplaceAll(when, "-", " ")+", MiB (not ms)", "")
		}
		return usage[k]
	}
	read := func(i int, kind, when string, b *raw.Box) error {
		pid, err := e.Backend().SandboxPID(b.ID())
		if err != nil {
			return err
		}
		cg, err := reclaim.CgroupOf(pid)
		if err != nil {
			return err
		}
		m, err := memstat.Read(cg.Dir, cg.V2, br.Runsc)
		if err != nil {
			return err
		}
		readings = append(readings, reading{Sample: i, Kind: kind, When: when, Mem: m})
		series(kind, when).Add(float64(m.UsageBytes) / (1 << 20))
		fmt.Fprintf(os.Stderr, "[%d] %s at %s: %.1f MiB\n", i, kind, when, float64(m.UsageBytes)/(1<<20))
		return nil
	}
	both := func(i int, kind string, b *raw.Box, t0 time.Time) error {
		if err := bench.FirstAnswer(ctx, hc, url, t0.Add(c.timeout)); err != nil {
			return err
		}
		if err := read(i, kind, "first-answer", b); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(c.settle):
		}
		return read(i, kind, "settled", b)
	}
	for i := 1; i <= c.n && ctx.Err() == nil; i++ {
		b, err := e.NewBox(c.template, t, c.limitMiB, "")
		if err == nil {
			var t0 time.Time
			if t0, _, err = e.Run(ctx, b); err == nil {
				err = both(i, "cold", b, t0)
			}
		}
		if err == nil {
			var image string
			if image, _, err = e.Checkpoint(ctx, b); err == nil {
				var t0 time.Time
				if t0, _, err = e.Restore(ctx, b, image); err == nil {
					err = both(i, "restored", b, t0)
				}
			}
		}
		if b != nil {
			e.Remove(context.WithoutCancel(ctx), b)
		}
		if err != nil {
			res.Note("sample %d: %v", i, err)
			if ctx.Err() != nil {
				break
			}
		}
	}
	res.Tables = tables(readings)
	res.Params["readings"] = readings
	path, err := dir.Done(res)
	fmt.Fprint(os.Stderr, "\n"+res.Table())
	for _, tb := range res.Tables {
		fmt.Fprint(os.Stderr, "\n"+tb.Markdown())
	}
	return path, err
}

// tables are the medians of each reading's parts, cold against restored:
// the cgroup's counters, and resident memory by process and mapping kind.
func tables(rs []reading) []*bench.Table {
	type key struct{ kind, when string }
	groups := map[key][]reading{}
	for _, r := range rs {
		k := key{r.Kind, r.When}
		groups[k] = append(groups[k], r)
	}
	whens := []string{"first-answer", "settled"}
	var out []*bench.Table
	for _, when := range whens {
		cold, restored := groups[key{"cold", when}], groups[key{"restored", when}]
		if len(cold) == 0 || len(restored) == 0 {
			continue
		}
		tb := &bench.Table{
			Title:       "At the " + strings.ReplaceAll(when, "-", " ") + ": cold against restored (medians, MiB)",
			Description: "The memory cgroup's usage and memory.stat counters, then each process's resident memory (smaps Rss) by kind of mapping: memfd:… is gVisor's memory file (the application's memory) or systrap's shared memory, anon the processes' own anonymous memory (the sentry's Go heap), file a host file the sentry maps.",
			Columns:     []string{"what", "cold", "restored", "restored − cold"},
		}
		rows := map[string][2]float64{}
		add := func(name string, cold, restored []float64) {
			rows[name] = [2]float64{median(cold), median(restored)}
		}
		collect := func(rs []reading, f func(reading) float64) []float64 {
			var v []float64
			for _, r := range rs {
				v = append(v, f(r))
			}
			return v
		}
		add("usage", collect(cold, func(r reading) float64 { return mib(r.Mem.UsageBytes) }), collect(restored, func(r reading) float64 { return mib(r.Mem.UsageBytes) }))
		for _, stat := range []string{"rss", "cache", "shmem", "mapped_file", "active_anon", "inactive_anon", "active_file", "inactive_file", "anon", "file"} {
			if _, ok := cold[0].Mem.Stat[stat]; !ok {
				continue
			}
			add("stat "+stat, collect(cold, func(r reading) float64 { return mib(r.Mem.Stat[stat]) }), collect(restored, func(r reading) float64 { return mib(r.Mem.Stat[stat]) }))
		}
		kinds := map[string]bool{}
		for _, r := range append(append([]reading{}, cold...), restored...) {
			for _, p := range r.Mem.Procs {
				for k := range p.RssKiB {
					kinds[roleOf(p.Role)+" "+k] = true
				}
			}
		}
		var ks []string
		for k := range kinds {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		for _, k := range ks {
			rss := func(r reading) float64 {
				var kib int64
				for _, p := range r.Mem.Procs {
					for kind, v := range p.RssKiB {
						if roleOf(p.Role)+" "+kind == k {
							kib += v
						}
					}
				}
				return float64(kib) / 1024
			}
			add("rss "+k, collect(cold, rss), collect(restored, rss))
		}
		var names []string
		for n := range rows {
			names = append(names, n)
		}
		sort.SliceStable(names, func(i, j int) bool {
			return order(names[i]) < order(names[j]) || order(names[i]) == order(names[j]) && names[i] < names[j]
		})
		for _, n := range names {
			v := rows[n]
			if v[0] < 0.05 && v[1] < 0.05 {
				continue
			}
			tb.Rows = append(tb.Rows, []string{n, fmt.Sprintf("%.1f", v[0]), fmt.Sprintf("%.1f", v[1]), fmt.Sprintf("%+.1f", v[1]-v[0])})
		}
		tb.Data = map[string]any{"cold": cold, "restored": restored}
		out = append(out, tb)
	}
	return out
}

func order(name string) int {
	switch {
	case name == "usage":
		return 0
	case strings.HasPrefix(name, "stat "):
		return 1
	}
	return 2
}

// roleOf shortens a process's role to what it is: the sentry
// (runsc-sandbox boot), the gofer, or a stub.
func roleOf(role string) string {
	f := strings.Fields(role)
	if len(f) == 0 {
		return "?"
	}
	if len(f) > 1 && (f[1] == "boot" || f[1] == "gofer") {
		return f[1]
	}
	return f[0]
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func median(v []float64) float64 {
	d, err := bench.Distribute(v)
	if err != nil {
		return 0
	}
	return d.P50
}
