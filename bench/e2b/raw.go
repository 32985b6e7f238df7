package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/bench/raw"
	"sandstorm/internal/envd"
	"sandstorm/internal/store"
)

// measureRawRestore is the baseline of connect-from-snapshot (the issue's
// goal: at most raw runsc restore + 15 ms): the base template laid out
// as the node lays out a sandbox (node.PrepareBundle, with the same envd
// binary mounted as its init), started with runsc run, then checkpointed
// and restored n times by runsc itself, each restore timed to the first
// answer (204) of envd's /health on the sandbox's own address (polled every
// millisecond). No sandstormd, no gateway, no SDK: what the product adds
// is the difference.
func measureRawRestore(ctx context.Context, res *bench.Results, runsc, platform, envdBin, rootfs string, proc api.Process, avoid netip.Prefix, n int) error {
	return measureRaw(ctx, res, rawCase{name: "base", what: "", runsc: runsc, platform: platform, envdBin: envdBin, rootfs: rootfs, proc: proc,
		limitMiB: raw.NodeDefaultMemoryMiB}, avoid, n)
}

// heapMiB is the heap of the large case (the "1 GiB heap"), and
// heapLimitMiB its sandboxes' memory limit.
const (
	heapMiB      = 1024
	heapLimitMiB = 1536
)

// heapProgram fills heapMiB of memory, page by page, says so on its
// output (the console log), and holds it.
var heapProgram = fmt.Sprintf(`import sys, time
b = bytearray(%d << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
print("heap ready", flush=True)
time.sleep(1e9)
`, heapMiB)

// rawCase is one sandbox raw runsc checkpoints and restores: its series
// are raw-*/<name>/…; ready, if set, waits until what it holds is in.
type rawCase struct {
	name, what                       string
	runsc, platform, envdBin, rootfs string
	proc                             api.Process
	limitMiB                         int64
	ready                            func(ctx context.Context, b *raw.Box) error
}

// measureRawHeap is measureRawRestore of a sandbox holding a heapMiB
// heap: base's rootfs and envd, its process the heap program.
func measureRawHeap(ctx context.Context, res *bench.Results, runsc, platform, envdBin, rootfs string, proc api.Process, avoid netip.Prefix, n int) error {
	proc.Args = []string{"/usr/bin/python3", "-c", heapProgram}
	return measureRaw(ctx, res, rawCase{name: "heap1g", what: fmt.Sprintf(" (a process holding a %d MiB heap)", heapMiB), runsc: runsc, platform: platform,
		envdBin: envdBin, rootfs: rootfs, proc: proc, limitMiB: heapLimitMiB, ready: logSays("heap ready")}, avoid, n)
}

// logSays waits until the box's console log holds line.
func logSays(line string) func(ctx context.Context, b *raw.Box) error {
	return func(ctx context.Context, b *raw.Box) error {
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
			if data, _ := os.ReadFile(b.Log()); strings.Contains(string(data), line) {
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
		return fmt.Errorf("%s never said %q", b.Log(), line)
	}
}

func measureRaw(ctx context.Context, res *bench.Results, c rawCase, avoid netip.Prefix, n int) error {
	runsc, platform, envdBin, rootfs, proc := c.runsc, c.platform, c.envdBin, c.rootfs, c.proc
	cl := res.AddSeries("raw-restore/"+c.name+"/client", "runsc restore started → first answer (204) of envd's /health from the sandbox's own address (no sandstormd)"+c.what+"; compare connect-from-snapshot", "")
	alone := res.AddSeries("raw-restore/"+c.name+"/runsc", "the runsc restore command alone"+c.what, "")
	ck := res.AddSeries("raw-checkpoint/"+c.name+"/runsc", "the runsc checkpoint command alone (hot → snapshot)"+c.what, "")
	e, err := raw.New(ctx, runsc, platform, strconv.FormatInt(time.Now().UnixNano()%1e6, 16), []netip.Prefix{avoid}, 2*time.Minute)
	if err != nil {
		cl.Skipped = err.Error()
		return nil
	}
	defer func() {
		if err := e.Cleanup(context.WithoutCancel(ctx)); err != nil {
			res.Note("raw runsc cleanup: %v", err)
		}
	}()
	// The envd build the node would mount: a directory with only the
	// binary in it, as <data-dir>/envd/<build> is.
	envdDir, err := os.MkdirTemp("", "ssraw-envd-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(envdDir)
	bin, err := os.ReadFile(envdBin)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(envdDir, "sandstorm-envd"), bin, 0o755); err != nil {
		return err
	}
	b, err := e.NewBox(c.name, store.Template{Name: c.name, Rootfs: rootfs, Process: proc}, c.limitMiB, envdDir)
	if err != nil {
		return err
	}
	health := e.URL(envd.Port) + "health"
	t0, _, err := e.Run(ctx, b)
	if err != nil {
		return err
	}
	if _, err := firstHealth(ctx, health, t0); err != nil {
		return fmt.Errorf("raw %s sandbox: %w", c.name, err)
	}
	if c.ready != nil {
		if err := c.ready(ctx, b); err != nil {
			return fmt.Errorf("raw %s sandbox: %w", c.name, err)
		}
	}
	for i := 0; i < n; i++ {
		image, d, err := e.Checkpoint(ctx, b)
		if err != nil {
			return err
		}
		ck.AddDuration(d)
		t0, d, err := e.Restore(ctx, b, image)
		if err != nil {
			return err
		}
		alone.AddDuration(d)
		d, err = firstHealth(ctx, health, t0)
		if err != nil {
			return err
		}
		cl.AddDuration(d)
	}
	fmt.Fprintf(os.Stderr, "raw runsc restore of %s: %d samples\n", c.name, n)
	return nil
}

// firstHealth polls url every millisecond until it answers 2xx (at most
// 30 s) and returns how long after t0 it did. Each try is a new
// connection, as a client's first is after a restore.
func firstHealth(ctx context.Context, url string, t0 time.Time) (time.Duration, error) {
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var last error
	for deadline := t0.Add(30 * time.Second); time.Now().Before(deadline); {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := c.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode/100 == 2 { // envd's /health is 204, as E2B's
				return time.Since(t0), nil
			}
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		last = err
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return 0, fmt.Errorf("no 2xx answer from %s in 30 s (last: %v)", url, last)
}
