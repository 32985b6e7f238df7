package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
)

// sandstormd runs copies as sandboxes of a sandstormd the benchmark
// starts: every copy awake (idle timers off), or tiered (idle timers as
// the seed's runs shortened them). A sandbox is reached through the
// node's gateway, at its endpoint for the program's port.
type sandstormd struct {
	bin, runsc, work, logDir string
	tiered, warm             bool
	timers                   bench.IdleTimers
	subnet, gwPorts          string
	logLevel                 string

	sd       *bench.Sandstormd
	hadTable bool // the host had sandstormd's nftables table before
	data     string
	template string
	made     map[string]bool
}

func (r *sandstormd) Name() string {
	switch {
	case r.tiered:
		return "sandstormd, idle ones tiered"
	case r.warm:
		return "sandstormd, all awake, warm template"
	}
	return "sandstormd, all awake"
}

func (r *sandstormd) Version(ctx context.Context) string {
	// The binary is built from the run's source (its commit is the
	// results' source).
	return "sandstormd of this run's source; " + commandVersion(ctx, r.runsc, "--version")
}

// Prepare starts the daemon (once) and registers prog's rootfs as a
// template: cold (the program started from its rootfs, as every other
// runtime starts it), or warm (a sandbox starts as a restore of the
// program already answering: the seed's "warm template" row).
func (r *sandstormd) Prepare(ctx context.Context, prog program) error {
	if r.sd == nil {
		if err := r.start(ctx); err != nil {
			return err
		}
	}
	r.template = "bl-" + prog.Name
	req := api.TemplateRequest{Name: r.template, RootfsDir: prog.Rootfs,
		Process: api.Process{Args: prog.Args, Env: prog.Env}, Ports: []int{programPort}}
	if r.warm {
		req.Warm = &api.Warm{Probe: api.Probe{Path: "/healthz"}, Reseed: api.Reseed{Signal: "SIGUSR1"}}
	}
	_, err := r.sd.Client.CreateTemplate(ctx, req)
	return err
}

func (r *sandstormd) start(ctx context.Context) error {
	r.made = map[string]bool{}
	r.hadTable = exec.CommandContext(ctx, "nft", "list", "table", "inet", "sandstorm").Run() == nil
	r.data = filepath.Join(r.work, fmt.Sprintf("sandstormd-%v-%v", r.tiered, r.warm))
	if err := os.MkdirAll(r.data, 0o700); err != nil {
		return err
	}
	timers := bench.IdleTimers{}
	if r.tiered {
		timers = r.timers
	}
	// The node's own admission is not the bound here: the benchmark's
	// memory rule is, as for every other runtime (a reserve of 256 MiB,
	// sandstormd's default).
	args := append([]string{"--runsc", r.runsc, "--subnet", r.subnet, "--gateway-ports", r.gwPorts, "--log-level", cmp.Or(r.logLevel, "warn")},
		timers.Args()...)
	logName := "sandstormd-awake.log"
	switch {
	case r.tiered:
		logName = "sandstormd-tiered.log"
	case r.warm:
		logName = "sandstormd-warm.log"
	}
	sd, err := bench.StartSandstormd(ctx, r.bin, r.data, filepath.Join(r.logDir, logName), args...)
	if err != nil {
		return err
	}
	r.sd = sd
	return nil
}

func (r *sandstormd) Start(ctx context.Context, prog program, i int) (instance, error) {
	name := fmt.Sprintf("bl-%s-%d", prog.Name, i)
	sb, err := r.sd.Client.CreateSandbox(ctx, api.SandboxRequest{Name: name, Template: r.template})
	if err != nil {
		return instance{}, err
	}
	r.made[sb.ID] = true
	url := sb.Endpoints[strconv.Itoa(programPort)]
	if url == "" {
		return instance{}, fmt.Errorf("sandbox %s has no endpoint for port %d", sb.ID, programPort)
	}
	return instance{ID: sb.ID, URL: url + "/"}, nil
}

func (r *sandstormd) Stop(ctx context.Context, in instance) error {
	delete(r.made, in.ID)
	return r.sd.Client.DeleteSandbox(ctx, in.ID)
}

// snapshotAndWake checkpoints every copy to disk and wakes it, and waits
// for each to answer: its sentry is then a restored one.
func (r *sandstormd) snapshotAndWake(ctx context.Context, copies []instance) error {
	for _, in := range copies {
		if _, err := r.sd.Client.Transition(ctx, in.ID, "snapshot"); err != nil {
			return fmt.Errorf("snapshot %s: %w", in.ID, err)
		}
	}
	for _, in := range copies {
		if _, err := r.sd.Client.Transition(ctx, in.ID, "wake"); err != nil {
			return fmt.Errorf("wake %s: %w", in.ID, err)
		}
		if err := pollAnswer(hc, 50*time.Millisecond)(ctx, in.URL, time.Now().Add(time.Minute)); err != nil {
			return fmt.Errorf("%s after its wake: %w", in.ID, err)
		}
	}
	return nil
}

// Close deletes every sandbox and the template, stops the daemon and
// removes its data.
func (r *sandstormd) Close(ctx context.Context) error {
	if r.sd == nil {
		return nil
	}
	var errs []error
	for id := range r.made {
		errs = append(errs, r.Stop(ctx, instance{ID: id}))
	}
	if r.template != "" {
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		r.sd.Client.DeleteTemplate(dctx, r.template)
		cancel()
	}
	r.sd.Stop()
	r.sd = nil
	// What a stopped daemon keeps on the host (README): its subnet's
	// route, and its table, unless another daemon's was there first.
	exec.Command("ip", "route", "del", "unreachable", r.subnet).Run()
	if !r.hadTable {
		exec.Command("nft", "delete", "table", "inet", "sandstorm").Run()
	}
	unmountUnder(r.data)
	errs = append(errs, os.RemoveAll(r.data))
	return errors.Join(errs...)
}
