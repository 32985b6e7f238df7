package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/coreos/go-systemd/v22/unit"
)

// The "service" check: is sandstormd installed as a systemd unit, and is
// the unit one whose stop and restart leave the sandboxes running (issue 18
// item 2)? runsc's sandbox, gofer and stub processes stay in the unit's
// cgroup on the unified hierarchy (measured: TestServiceKillMode), so any
// KillMode but process has systemd kill every sandbox at each stop
// (systemd.kill(5)).

// UnitName is the unit `make install` installs.
const UnitName = "sandstormd.service"

// UnitDirs are where systemd loads system units from, highest precedence
// first (systemd.unit(5), "Unit File Load Path").
var UnitDirs = []string{"/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system"}

// unitFacts is what the check reads from a unit and its drop-ins.
type unitFacts struct {
	Path     string
	DropIns  []string
	KillMode string // "" is systemd's default, control-group
	Delegate string
	Exec     string // ExecStart's program
	Reload   bool   // ExecReload is set
	// Namespaced lists the settings that give the service a mount or
	// network namespace of its own.
	Namespaced []string
}

// mountNamespacing are [Service] settings that put the service in a mount
// namespace of its own (systemd.exec(5), "Sandboxing": each "implies"
// one), or a network namespace: sandstormd's overlay and netns mounts, and
// its gateway, would not be where the host and runsc look.
var mountNamespacing = []string{
	"PrivateTmp", "PrivateDevices", "PrivateMounts", "PrivateNetwork", "ProtectSystem", "ProtectHome",
	"ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups", "ProtectProc",
	"ProtectClock", "ProtectHostname", "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths", "ExecPaths", "NoExecPaths",
	"TemporaryFileSystem", "BindPaths", "BindReadOnlyPaths", "RootDirectory", "RootImage", "MountFlags", "NetworkNamespacePath",
}

// readUnit reads a unit file and its drop-ins (each a path), in the order
// systemd applies them, into facts.
func readUnit(path string, dropIns []string) (unitFacts, error) {
	f := unitFacts{Path: path, DropIns: dropIns}
	set := map[string]string{}
	for _, p := range append([]string{path}, dropIns...) {
		fh, err := os.Open(p)
		if err != nil {
			return f, err
		}
		opts, err := unit.Deserialize(fh)
		fh.Close()
		if err != nil {
			return f, fmt.Errorf("%s: %w", p, err)
		}
		for _, o := range opts {
			if o.Section == "Service" {
				set[o.Name] = o.Value // the last assignment wins; "" resets
			}
		}
	}
	f.KillMode = strings.TrimSpace(set["KillMode"])
	f.Delegate = strings.TrimSpace(set["Delegate"])
	f.Reload = strings.TrimSpace(set["ExecReload"]) != ""
	if fields := strings.Fields(set["ExecStart"]); len(fields) > 0 {
		// Prefixes (systemd.service(5), "ExecStart="): @, -, :, +, !.
		f.Exec = strings.TrimLeft(fields[0], "@-:+!")
	}
	for _, k := range mountNamespacing {
		v := strings.ToLower(strings.TrimSpace(set[k]))
		if v != "" && v != "no" && v != "false" && v != "0" && v != "off" && !(k == "MountFlags" && v == "shared") {
			f.Namespaced = append(f.Namespaced, k+"="+set[k])
		}
	}
	return f, nil
}

// judge is the check's verdict on facts: pure.
func judge(f unitFacts) Check {
	c := Check{OK: true}
	var bad, set, actions []string
	switch f.KillMode {
	case "process":
	case "", "control-group", "mixed":
		mode := f.KillMode
		if mode == "" {
			mode = "control-group (the default)"
		}
		bad = append(bad, "KillMode="+mode+": a stop or restart kills every sandbox (runsc's processes are in the unit's cgroup)")
		set = append(set, "KillMode=process")
	default:
		bad = append(bad, "KillMode="+f.KillMode+" (use process: none is deprecated, systemd.kill(5))")
		set = append(set, "KillMode=process")
	}
	if d := strings.ToLower(f.Delegate); d != "yes" && d != "true" && d != "1" && d != "on" {
		bad = append(bad, "no Delegate=yes: runsc manages a cgroup per sandbox, which systemd should leave alone")
		set = append(set, "Delegate=yes")
	}
	if len(f.Namespaced) > 0 {
		bad = append(bad, strings.Join(f.Namespaced, ", ")+": a mount or network namespace of its own hides sandstormd's overlays, network namespaces and gateway from the host")
		for _, n := range f.Namespaced {
			k, _, _ := strings.Cut(n, "=")
			set = append(set, k+"=")
		}
	}
	switch {
	case f.Exec == "":
		bad = append(bad, "no ExecStart")
		set = append(set, "ExecStart=/usr/local/bin/sandstormd serve $SANDSTORMD_ARGS")
	default:
		if err := isExecutable(f.Exec); err != nil {
			bad = append(bad, "ExecStart's "+f.Exec+": "+err.Error())
			actions = append(actions, "install sandstormd there (make install PREFIX=…)")
		} else if real, err := filepath.EvalSymlinks(f.Exec); err == nil {
			if _, err := os.Stat(filepath.Join(filepath.Dir(real), "runsc")); err != nil {
				bad = append(bad, "no runsc beside "+real+" (sandstormd runs the one beside it)")
				actions = append(actions, "make install (it puts the pinned runsc there)")
			}
		}
	}
	where := f.Path
	if len(f.DropIns) > 0 {
		where += " (+ " + strings.Join(f.DropIns, ", ") + ")"
	}
	if len(bad) > 0 {
		c.OK = false
		c.Detail = where + ": " + strings.Join(bad, "; ")
		if len(set) > 0 {
			actions = append(actions, "set "+strings.Join(set, ", ")+" in a drop-in (systemctl edit sandstormd), then systemctl daemon-reload")
		}
		c.Fix = strings.Join(actions, "; ")
		return c
	}
	c.Detail = where + ": KillMode=process and Delegate=yes: a stop or restart leaves the sandboxes running for the next start to adopt"
	if f.Reload {
		c.Detail += "; systemctl reload runs the binary at the path (an upgrade) with no connection refused"
	} else {
		c.Detail += "; no ExecReload, so systemctl reload cannot hand the sockets over (add ExecReload=" + f.Exec + " reload)"
	}
	return c
}

// isExecutable reports whether path is an executable file.
func isExecutable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return errors.New("not an executable file")
	}
	return nil
}

// findUnit returns the unit file systemd would load from dirs, and its
// drop-ins (every <dir>/<unit>.d/*.conf, a name in a higher-precedence
// directory hiding the same name in a lower one, applied in name order:
// systemd.unit(5), "drop-in").
func findUnit(dirs []string, name string) (string, []string) {
	path := ""
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			if fi, err := os.Lstat(p); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
				if t, err := os.Readlink(p); err == nil && t == "/dev/null" {
					return "", nil // masked
				}
			}
			path = p
			break
		}
	}
	if path == "" {
		return "", nil
	}
	byName := map[string]string{}
	for i := len(dirs) - 1; i >= 0; i-- { // lower precedence first, overwritten
		confs, _ := filepath.Glob(filepath.Join(dirs[i], name+".d", "*.conf"))
		for _, c := range confs {
			byName[filepath.Base(c)] = c
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	slices.Sort(names)
	var out []string
	for _, n := range names {
		out = append(out, byName[n])
	}
	return path, out
}

// checkService is the "service" check.
func checkService(ctx context.Context, cfg Config) Check {
	dirs := cfg.UnitDirs
	if len(dirs) == 0 {
		dirs = UnitDirs
	}
	path, dropIns := findUnit(dirs, UnitName)
	if path == "" {
		return Check{OK: true, Absent: true,
			Detail: "no " + UnitName + " installed (" + strings.Join(dirs, ", ") + ")",
			Fix:    "make install puts sandstormd, its runsc and the unit under /usr/local (PREFIX=…); then: systemctl daemon-reload && systemctl enable --now sandstormd"}
	}
	f, err := readUnit(path, dropIns)
	if err != nil {
		return Check{Detail: "cannot read the unit: " + err.Error(), Fix: "fix or reinstall it: make install"}
	}
	c := judge(f)
	// systemd's own reading of the file, offline (systemd-analyze(1),
	// "verify"): syntax, and that ExecStart's program is there.
	if out, err := output(ctx, "systemd-analyze", "verify", path); err != nil || out != "" {
		if errors.Is(err, exec.ErrNotFound) {
			return c
		}
		c.OK = false
		c.Detail += "; systemd-analyze verify " + path + ": " + firstLines(out, 3)
		if c.Fix == "" {
			c.Fix = "correct what systemd-analyze verify reports, then systemctl daemon-reload"
		}
		return c
	}
	if booted() {
		if st, err := output(ctx, "systemctl", "show", UnitName, "-p", "KillMode", "-p", "ActiveState", "-p", "MainPID", "-p", "NeedDaemonReload"); err == nil {
			props := map[string]string{}
			for _, l := range strings.Split(st, "\n") {
				k, v, _ := strings.Cut(l, "=")
				props[k] = v
			}
			if props["NeedDaemonReload"] == "yes" {
				c.OK = false
				c.Detail += "; systemd still runs an older version of the unit"
				c.Fix = "systemctl daemon-reload"
			} else if props["KillMode"] != "" && props["KillMode"] != "process" {
				c.OK = false
				c.Detail += "; systemd has KillMode=" + props["KillMode"] + " for it"
				c.Fix = "systemctl daemon-reload (and check systemctl cat sandstormd)"
			}
			c.Detail += fmt.Sprintf("; %s, main PID %s", props["ActiveState"], props["MainPID"])
		}
	} else {
		c.Detail += "; systemd is not PID 1 here, so the unit is not loaded"
	}
	return c
}

// booted reports whether systemd is the init system (sd_booted(3)).
func booted() bool {
	fi, err := os.Lstat("/run/systemd/system")
	return err == nil && fi.IsDir()
}

func firstLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if !slices.Contains(lines, l) {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = append(lines[:n], "…")
	}
	return strings.Join(lines, " / ")
}
