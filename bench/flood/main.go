// Command flood is issue 7's memory flood as a benchmark: N sandboxes that
// each fill a heap of H MiB right after they start, created C at a time
// against a memory reserve that leaves room for only a few. It reports how
// many creates were accepted and refused, how many sandboxes the node
// pushed to disk to make room, the lowest MemAvailable seen (sampled every
// 20 ms), the kernel's OOM kills (expected: none), create latency, and
// whether every accepted sandbox answers afterwards — with the machine,
// the commit and every raw sample in bench/results/flood-<date>-<commit>.
//
//	sudo go run ./bench/flood                   # 24 sandboxes of 256 MiB, 4 at a time
//	sudo go run ./bench/flood -n 12 --heap 128  # smaller
//
// It starts its own sandstormd (built from the tree) on a temporary data dir
// and removes everything it made when it is done.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/client"
	"sandstorm/internal/memguard"
)

type config struct {
	n, parallel, heapMiB, limitMiB, room int
	reserveMiB                           int64
	runsc                                string
	timeout, retry                       time.Duration
	bench.Flags
}

func main() {
	var c config
	fs := flag.NewFlagSet("flood", flag.ContinueOnError)
	fs.IntVar(&c.n, "n", 24, "sandboxes to create")
	fs.IntVar(&c.parallel, "parallel", 4, "creates at a time")
	fs.IntVar(&c.heapMiB, "heap", 256, "heap each sandbox fills right after it starts (MiB)")
	fs.IntVar(&c.limitMiB, "limit", 0, "memory limit of each sandbox (MiB; default heap + 192)")
	fs.IntVar(&c.room, "room", 4, "sandboxes (at their limit) that fit above the reserve, when --reserve is not given")
	fs.Int64Var(&c.reserveMiB, "reserve", 0, "sandstormd --memory-reserve (MiB; default MemAvailable - room × limit)")
	c.Flags.Register(fs)
	fs.StringVar(&c.runsc, "runsc", "", "runsc binary for sandstormd (default: <--repo>/bin/runsc, the pinned one `make runsc` builds)")
	fs.DurationVar(&c.timeout, "timeout", 3*time.Minute, "how long a call to a sandbox may retry 503s")
	fs.DurationVar(&c.retry, "retry", time.Minute, "how long a create refused with 503 is retried, as its Retry-After says (0: never)")
	bench.ParseFlags(fs, func() error {
		if c.n < 1 || c.parallel < 1 || c.heapMiB < 1 {
			return bench.ErrBadArguments
		}
		return nil
	})
	if c.limitMiB == 0 {
		c.limitMiB = c.heapMiB + 192
	}
	bench.Main("flood", func(ctx context.Context) (string, error) { return run(ctx, c) })
}

var oomRE = regexp.MustCompile(`(?i)out of memory|oom-kill|oom_reaper`)

func oomLines() int {
	out, _ := exec.Command("dmesg").Output()
	return len(oomRE.FindAll(out, -1))
}

func run(ctx context.Context, c config) (string, error) {
	runsc, err := bench.FindRunsc(c.Repo, c.runsc)
	if err != nil {
		return "", err
	}
	br, err := bench.Begin(ctx, bench.Plan{Tool: "bench/flood", Title: "Memory flood: sandboxes filling their heaps at once against a memory reserve",
		Out: c.Out, Repo: c.Repo, Prefix: "flood-", Runsc: runsc, Demo: "app64", Sandstormd: c.Sandstormd})
	if err != nil {
		return "", err
	}
	defer br.Close()
	res, dir := br.Results, br.Dir
	sd, cl, err := startHeap(ctx, &c, br)
	if err != nil {
		return "", err
	}
	defer func() {
		sd.Stop()
		// The node never removes its pool's unreachable route (it only
		// refuses); this pool was the benchmark's own.
		exec.Command("ip", "route", "del", "unreachable", "10.189.0.0/16").Run()
	}()
	measure(ctx, c, cl, res)
	out, err := dir.Done(res)
	fmt.Fprintln(os.Stderr, strings.Join(res.Notes, "\n"))
	return out, err
}

// startHeap sets the reserve from what is available once the heap-filling
// demo and sandstormd are built (a Go build takes a few GiB for a while,
// so the reserve leaves room for --room sandboxes at the flood), starts
// sandstormd and registers the heap template.
func startHeap(ctx context.Context, c *config, br *bench.Run) (*bench.Sandstormd, *client.Client, error) {
	res, d, runsc := br.Results, br.Demo, br.Runsc
	avail, err := memguard.AvailableMiB()
	if err != nil {
		return nil, nil, err
	}
	if c.reserveMiB == 0 {
		c.reserveMiB = avail - int64(c.room*c.limitMiB)
	}
	res.Params = map[string]any{"sandboxes": c.n, "parallel": c.parallel, "heap_mib": c.heapMiB, "limit_mib": c.limitMiB,
		"reserve_mib": c.reserveMiB, "mem_available_at_start_mib": avail, "retry_for": c.retry.String()}
	fmt.Fprintf(os.Stderr, "machine: %s\n%d sandboxes of %d MiB (limit %d), %d at a time; MemAvailable %d MiB, reserve %d MiB; a 503 is retried for %v\n",
		res.Machine, c.n, c.heapMiB, c.limitMiB, c.parallel, avail, c.reserveMiB, c.retry)
	args := []string{"--runsc", runsc, "--subnet", "10.189.0.0/16", "--gateway-ports", "31000-31999", "--memory-reserve", strconv.FormatInt(c.reserveMiB, 10),
		"--freeze-after", "0", "--snapshot-after", "0", "--detach-after", "0"}
	res.Params["sandstormd_args"] = args
	sd, err := bench.StartSandstormd(ctx, br.Binary.Path, filepath.Join(br.Work, "data"), filepath.Join(br.Dir.Path, "sandstormd.log"), args...)
	if err != nil {
		return nil, nil, err
	}
	env := append(append([]string{}, d.Env...), fmt.Sprintf("HEAP_MIB=%d", c.heapMiB))
	if _, err := sd.Client.CreateTemplate(ctx, api.TemplateRequest{Name: "heap", RootfsDir: br.Rootfs,
		Process: api.Process{Args: d.Args, Env: env}, Ports: d.Ports, MemoryMiB: c.limitMiB}); err != nil {
		sd.Stop()
		return nil, nil, err
	}
	return sd, sd.Client, nil
}

// measure floods, counts what went to disk, calls every accepted sandbox
// and notes the memory floor and the kernel's OOM kills.
func measure(ctx context.Context, c config, cl *client.Client, res *bench.Results) {
	avail := res.Params["mem_available_at_start_mib"]
	oomBefore := oomLines()
	minAvail := memguard.WatchLow(20 * time.Millisecond)

	fl := flood(ctx, c, cl, res)
	accepted := fl.accepted
	pushed := 0
	for _, sb := range accepted {
		if got, err := cl.Sandbox(ctx, sb.ID); err == nil && (got.Tier == api.TierSnapshot || got.Tier == api.TierDetached) {
			pushed++
		}
	}
	answered := callAll(ctx, res, accepted, c.timeout)
	minAvail.Stop()
	oom := oomLines() - oomBefore
	refused, gaveUp, failed := fl.refused, fl.gaveUp, fl.failed
	res.Params["accepted"], res.Params["refusals"], res.Params["gave_up"], res.Params["failed"] = len(accepted), refused, gaveUp, failed
	res.Params["pushed_to_disk_after_flood"], res.Params["answered_after"] = pushed, answered
	res.Params["min_mem_available_mib"], res.Params["oom_kill_lines"] = minAvail.Min(), oom
	res.Note("%d of %d creates accepted (503s retried for %v), %d refusals with 503 on the way, %d gave up, %d failed; %d of the accepted were on disk right after the flood; %d of %d answered afterwards",
		len(accepted), c.n, c.retry, refused, gaveUp, failed, pushed, answered, len(accepted))
	res.Note("MemAvailable: %d MiB at the start, %d MiB at the lowest (reserve %d MiB: %s); OOM-killer lines in the kernel log during the run: %d",
		avail, minAvail.Min(), c.reserveMiB, map[bool]string{true: "never below it", false: "FELL BELOW IT"}[minAvail.Min() >= c.reserveMiB], oom)
	for _, sb := range accepted {
		cl.DeleteSandbox(context.Background(), sb.ID)
	}
}

// flooded is what the flood's creates came to.
type flooded struct {
	accepted                []api.Sandbox
	refused, failed, gaveUp int
}

// flood creates c.n heap sandboxes, c.parallel at a time, each create's
// 503s retried for c.retry as their Retry-After says.
func flood(ctx context.Context, c config, cl *client.Client, res *bench.Results) flooded {
	createS := res.AddSeries("create_accepted", "POST /v1/sandboxes to 201, for the creates the node accepted", "")
	refusedS := res.AddSeries("create_refused", "POST /v1/sandboxes to 503: each refusal, retried or not", "")
	var f flooded
	progress := func() {
		fmt.Fprintf(os.Stderr, "\rcreates: %d accepted, %d refusals (503), %d failed", len(f.accepted), f.refused, f.failed)
	}
	(&bench.Filler{Client: cl, Parallel: c.parallel, Count: c.n, RetryFor: c.retry,
		Request: func(i int) api.SandboxRequest {
			return api.SandboxRequest{Template: "heap", Name: fmt.Sprintf("flood-%03d", i-1)}
		},
		Refused: func(_ int, took time.Duration) {
			f.refused++
			refusedS.AddDuration(took)
			progress()
		},
		Done: func(i int, a bench.Answer) bool {
			switch {
			case a.GaveUp:
				f.gaveUp++
			case a.Err != nil:
				f.failed++
				createS.Fail("create %d: %v", i-1, a.Err)
			default:
				f.accepted = append(f.accepted, a.Sandbox)
				createS.AddDuration(a.Took)
			}
			progress()
			return false
		}}).Run(ctx)
	fmt.Fprintln(os.Stderr)
	return f
}

// callAll GETs / of every accepted sandbox through its gateway, waking it
// if it was pushed to disk; a 503 (the node making room) is retried as
// its Retry-After says, for up to timeout. It returns how many answered.
func callAll(ctx context.Context, res *bench.Results, accepted []api.Sandbox, timeout time.Duration) int {
	callS := res.AddSeries("call_after_flood", "GET / through the gateway to each accepted sandbox after the flood, waking it if it was pushed to disk (503s retried)", "")
	answered := 0
	gw := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}, Timeout: time.Minute}
	for _, sb := range accepted {
		ep := sb.Endpoints["8000"]
		t0 := time.Now()
		for deadline := t0.Add(timeout); ctx.Err() == nil; {
			resp, err := gw.Get(ep + "/")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					answered++
					callS.AddDuration(time.Since(t0))
					break
				}
			}
			if time.Now().After(deadline) || (err == nil && resp.StatusCode != http.StatusServiceUnavailable) {
				callS.Fail("%s: %v", sb.Name, err)
				break
			}
			time.Sleep(time.Second)
		}
	}
	return answered
}
