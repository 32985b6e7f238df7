package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"connectrpc.com/connect"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/client"
	"sandstorm/internal/demo"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/sandbox/gvisor"
	pb "sandstorm/third_party/envd/process"
)

// What envd costs a sandbox (the bound: an idle hot sandbox with
// envd reachable at most 3 MiB more than one without, its snapshot image
// at most 2 MiB more). The same web demo three ways: without envd ever
// used; envd started on first use (runsc exec) and called once; envd as
// the sandbox's init. Each sandbox's memory cgroup is read once it has
// settled (two reads 500 ms apart within 0.25 MiB), then it is
// snapshotted and its image's size on disk read.
func measureMemory(ctx context.Context, res *bench.Results, cl *client.Client, dataDir, work string, n int) error {
	rootfs := filepath.Join(work, "web")
	d, err := demo.Build("web", rootfs)
	if err != nil {
		return err
	}
	be := &gvisor.Backend{Root: filepath.Join(dataDir, "runsc")}
	kinds := []struct {
		name, template, desc string
		envd                 *api.Envd
		call                 bool
	}{
		{"web", "web", "the web demo, envd never used", nil, false},
		{"web+envd-exec", "web", "the web demo after one envd call (envd started by runsc exec)", nil, true},
		{"web+envd-init", "web-init", "the web demo with envd as its init, after one envd call", &api.Envd{}, true},
	}
	for _, t := range []string{"web", "web-init"} {
		req := api.TemplateRequest{Name: t, RootfsDir: rootfs, Process: api.Process{Args: d.Args, Env: d.Env}, Ports: d.Ports}
		if t == "web-init" {
			req.Process.Envd = &api.Envd{}
		}
		if _, err := cl.CreateTemplate(ctx, req); err != nil {
			return err
		}
	}
	for _, k := range kinds {
		mem := res.AddSeries("memory/"+k.name, k.desc+": its memory cgroup once settled (MiB, not ms)", "")
		img := res.AddSeries("snapshot-image/"+k.name, k.desc+": its snapshot image on disk (MiB, not ms)", "")
		for i := 0; i < n; i++ {
			sb, err := cl.CreateSandbox(ctx, api.SandboxRequest{Template: k.template})
			if err != nil {
				return err
			}
			if err := firstAnswer(ctx, sb); err != nil {
				return err
			}
			if k.call {
				if _, err := cl.Envd(sb.ID, "").Process.List(ctx, connect.NewRequest(&pb.ListRequest{})); err != nil {
					return fmt.Errorf("envd of %s: %w", sb.ID, err)
				}
			}
			mib, err := settled(ctx, be, sb.ID)
			if err != nil {
				mem.Fail("%v", err)
			} else {
				mem.Add(mib)
			}
			if _, err := cl.Transition(ctx, sb.ID, "snapshot"); err != nil {
				img.Fail("snapshot: %v", err)
			} else {
				img.Add(dirMiB(filepath.Join(dataDir, "sandboxes", sb.ID, "snapshot")))
			}
			cl.DeleteSandbox(ctx, sb.ID)
		}
		fmt.Fprintf(os.Stderr, "memory of %s: %d samples\n", k.name, n)
	}
	return nil
}

func firstAnswer(ctx context.Context, sb api.Sandbox) error {
	url := sb.Endpoints["8000"]
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		if resp, err := http.Get(url); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("sandbox %s: no answer at %s in 30 s", sb.ID, url)
}

// settled is the sandbox's memory once two reads 500 ms apart agree
// within 0.25 MiB (at most 15 s).
func settled(ctx context.Context, be *gvisor.Backend, id string) (float64, error) {
	prev := -1.0
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		st, err := be.Memory(ctx, sandbox.Spec{ID: id})
		if err != nil {
			return 0, err
		}
		mib := float64(st.UsageBytes) / (1 << 20)
		if prev >= 0 && math.Abs(mib-prev) < 0.25 {
			return mib, nil
		}
		prev = mib
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return prev, fmt.Errorf("sandbox %s: memory did not settle in 15 s (last %.1f MiB)", id, prev)
}

func dirMiB(dir string) float64 {
	var total int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				total += info.Size()
			}
		}
		return nil
	})
	return float64(total) / (1 << 20)
}
