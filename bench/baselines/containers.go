package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sandstorm/internal/bench"
)

// engine is Docker or Podman, run by the benchmark with state of its own
// (a data root under the work directory, a socket of its own), so that it
// neither sees nor changes the host's: no image, container or runtime
// registration outlives the run (Close removes the directory), and a
// daemon the host runs is left alone.
type engine struct {
	kind    string // "docker" or "podman"
	runtime string // docker: "runc" or "runsc"; podman: "crun" or "runsc"
	runsc   string // the pinned runsc (its absolute path)
	dir     string // the engine's state
	cli     string // the client binary
	base    []string
	daemon  *exec.Cmd // dockerd, for docker
	image   string
	running map[string]bool
	seq     int // names every container anew: a name is never reused
	// hadRunscRoot: podman's runsc root (/var/run/runsc) was there
	// before the run, so it is not the run's to remove.
	hadRunscRoot bool
}

// podmanRunscRoot is where Podman has runsc keep its state.
const podmanRunscRoot = "/var/run/runsc"

func newEngine(kind, rt, runsc, work string) *engine {
	return &engine{kind: kind, runtime: rt, runsc: runsc,
		dir: filepath.Join(work, kind+"-"+rt), running: map[string]bool{}}
}

func (e *engine) Name() string {
	names := map[string]string{"docker/runc": "Docker (runc)", "docker/runsc": "Docker + gVisor (runsc)",
		"podman/crun": "Podman (crun)", "podman/runc": "Podman (runc)", "podman/runsc": "Podman + gVisor (runsc)"}
	return names[e.kind+"/"+e.runtime]
}

func (e *engine) Version(ctx context.Context) string {
	v := commandVersion(ctx, e.cli, append(e.base, "--version")...)
	switch e.runtime {
	case "runsc":
		v += "; " + commandVersion(ctx, e.runsc, "--version")
	default:
		if p, err := exec.LookPath(e.runtime); err == nil {
			v += "; " + commandVersion(ctx, p, "--version")
		}
	}
	return v
}

// Prepare starts the engine (dockerd; podman has no daemon) and imports
// the program's rootfs as an image (`docker import`, `podman import`: no
// registry).
func (e *engine) Prepare(ctx context.Context, prog program) error {
	if e.cli == "" {
		if err := e.startEngine(ctx); err != nil {
			return err
		}
	}
	e.image = "sandstorm-bench-" + prog.Name
	tar := exec.CommandContext(ctx, "tar", "-C", prog.Rootfs, "-c", ".")
	imp := e.command(ctx, "import", "-", e.image)
	pipe, err := tar.StdoutPipe()
	if err != nil {
		return err
	}
	imp.Stdin = pipe
	var stderr bytes.Buffer
	imp.Stderr = &stderr
	if err := tar.Start(); err != nil {
		return err
	}
	if err := imp.Run(); err != nil {
		tar.Wait()
		return fmt.Errorf("%s import: %v: %s", e.kind, err, strings.TrimSpace(stderr.String()))
	}
	return tar.Wait()
}

func (e *engine) startEngine(ctx context.Context) error {
	if err := os.MkdirAll(e.dir, 0o700); err != nil {
		return err
	}
	switch e.kind {
	case "podman":
		_, err := os.Stat(podmanRunscRoot)
		e.hadRunscRoot = err == nil
		p, err := exec.LookPath("podman")
		if err != nil {
			return errors.New("podman is not installed: make bench-baselines-deps")
		}
		e.cli = p
		e.base = []string{"--root", filepath.Join(e.dir, "root"), "--runroot", filepath.Join(e.dir, "run"),
			"--tmpdir", filepath.Join(e.dir, "tmp"), "--cgroup-manager", "cgroupfs", "--events-backend", "file"}
		return nil
	case "docker":
		return e.startDockerd(ctx)
	}
	return fmt.Errorf("unknown engine %s", e.kind)
}

// startDockerd runs a dockerd of the benchmark's own: its data root, exec
// root and socket under e.dir, no iptables or bridge (copies use the
// host's network, as every runtime here does), and runsc registered as a
// runtime in its own configuration file, which goes with the directory.
func (e *engine) startDockerd(ctx context.Context) error {
	dockerd, err := exec.LookPath("dockerd")
	if err != nil {
		return errors.New("dockerd is not installed: make bench-baselines-deps (apt-get install docker.io)")
	}
	// Debian's client, beside its dockerd, when a newer one is first on PATH.
	e.cli = "/usr/bin/docker"
	if _, err := os.Stat(e.cli); err != nil {
		if e.cli, err = exec.LookPath("docker"); err != nil {
			return errors.New("the docker client is not installed: make bench-baselines-deps")
		}
	}
	conf := map[string]any{"runtimes": map[string]any{"runsc": map[string]any{
		"path": e.runsc, "runtimeArgs": []string{"--platform=systrap", "--network=host"}}}}
	b, _ := json.Marshal(conf)
	confPath := filepath.Join(e.dir, "daemon.json")
	if err := os.WriteFile(confPath, b, 0o600); err != nil {
		return err
	}
	sock := "unix://" + filepath.Join(e.dir, "docker.sock")
	cmd := exec.Command(dockerd, "--data-root", filepath.Join(e.dir, "data"), "--exec-root", filepath.Join(e.dir, "exec"),
		"--pidfile", filepath.Join(e.dir, "docker.pid"), "-H", sock, "--config-file", confPath,
		"--iptables=false", "--ip6tables=false", "--bridge=none")
	logf, err := os.Create(filepath.Join(e.dir, "dockerd.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = mergeSys(nil)
	if err := cmd.Start(); err != nil {
		return err
	}
	e.daemon = cmd
	e.base = []string{"-H", sock}
	for deadline := time.Now().Add(time.Minute); ; {
		if e.command(ctx, "info").Run() == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dockerd did not answer within a minute: see %s", logf.Name())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *engine) command(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, e.cli, append(append([]string{}, e.base...), args...)...)
}

func (e *engine) Start(ctx context.Context, prog program, i int) (instance, error) {
	e.seq++
	name := fmt.Sprintf("bl-%s-%d-%d", prog.Name, i, e.seq)
	args := []string{"run", "-d", "--name", name, "--network", "host", "-e", "PORT=" + strconv.Itoa(copyPort(i))}
	for _, kv := range prog.Env {
		args = append(args, "-e", kv)
	}
	switch {
	case e.kind == "docker":
		args = append(args, "--runtime", e.runtime)
	case e.runtime == "runsc":
		// Podman gives runsc its own --root (/var/run/runsc): another one
		// here would hide the containers from its rm. runsc leaves its
		// null-netns there; Close removes it if the run made it.
		args = append(args, "--runtime", e.runsc, "--runtime-flag", "platform=systrap", "--runtime-flag", "network=host")
	default:
		args = append(args, "--runtime", e.runtime)
	}
	if e.kind == "podman" {
		// Podman sets RLIMIT_NOFILE and RLIMIT_NPROC to a million by
		// default, and even this process's own limits are refused by the
		// OCI runtime here (setrlimit: EPERM; this machine gives root no
		// CAP_SYS_RESOURCE): 4,096 of each, far more than a copy uses.
		args = append(args, "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096")
	}
	args = append(append(args, e.image), prog.Args...)
	out, err := e.command(ctx, args...).CombinedOutput()
	if err != nil {
		e.command(ctx, "rm", "-f", name).Run() // what a failed run created
		return instance{}, fmt.Errorf("%s run: %v: %s", e.kind, err, strings.TrimSpace(string(out)))
	}
	e.running[name] = true
	return instance{ID: name, URL: localURL(i)}, nil
}

func (e *engine) Stop(ctx context.Context, in instance) error {
	delete(e.running, in.ID)
	if out, err := e.command(ctx, "rm", "-f", in.ID).CombinedOutput(); err != nil {
		return fmt.Errorf("%s rm: %v: %s", e.kind, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Close removes every copy and the image, stops dockerd, and removes the
// engine's directory: nothing of the run is left.
func (e *engine) Close(ctx context.Context) error {
	var errs []error
	if e.cli != "" {
		for name := range e.running {
			errs = append(errs, e.Stop(ctx, instance{ID: name}))
		}
		if e.image != "" {
			e.command(ctx, "rmi", "-f", e.image).Run()
		}
	}
	if e.daemon != nil {
		e.daemon.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { e.daemon.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			syscall.Kill(-e.daemon.Process.Pid, syscall.SIGKILL)
			<-done
		}
		e.daemon = nil
	}
	if e.kind == "podman" && e.cli != "" {
		// Podman's storage may hold overlay mounts under its root.
		e.command(ctx, "system", "reset", "--force").Run()
		if e.runtime == "runsc" && !e.hadRunscRoot {
			// Mounts are listed under the real path (/var/run is a link).
			root, err := filepath.EvalSymlinks(podmanRunscRoot)
			if err == nil {
				unmountUnder(root)
				os.RemoveAll(root)
			}
		}
	}
	// Whatever an engine failed to remove (a container its rm could not
	// stop) is still a process whose command line names e.dir: its
	// conmon or shim, its runsc sandbox and gofer.
	if n := killNaming(e.dir); n > 0 {
		errs = append(errs, fmt.Errorf("%s: killed %d processes the engine left running", e.Name(), n))
	}
	unmountUnder(e.dir)
	errs = append(errs, os.RemoveAll(e.dir))
	return errors.Join(errs...)
}

// unmountUnder lazily unmounts whatever an engine left mounted under dir,
// deepest first, so that removing dir cannot reach into a mount.
func unmountUnder(dir string) {
	for _, m := range bench.MountsUnder(dir) {
		syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

// killNaming kills every process whose command line contains s (a
// directory only this run uses) and says how many there were.
func killNaming(s string) int {
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(s)) {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				n++
			}
		}
	}
	return n
}
