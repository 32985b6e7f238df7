package fleetup

// How fleet up --hosts talks to its hosts: the system's ssh and scp (so
// the user's ssh config, agent, known_hosts and jump hosts apply, as with
// ansible or k3sup), never a prompt (BatchMode), and on each host only
// POSIX sh scripts, built here from quoted parts and fed to sh on stdin.
// The scripts are the remote half of every step: inspect, install, start,
// pairing code, stop.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// SSH is how fleet up reaches its hosts; fleet.json keeps it, so fleet
// down reaches them the same way.
type SSH struct {
	// Options are ssh options, each passed as -o (e.g.
	// StrictHostKeyChecking=accept-new, ProxyJump=bastion).
	Options []string `json:"options,omitempty"`
	// Identity is a private key file (-i).
	Identity string `json:"identity,omitempty"`
	// Sudo runs the remote steps with sudo -n on hosts where the login
	// user is not root (passwordless sudo: a prompt would hang).
	Sudo bool `json:"sudo,omitempty"`
}

// baseArgs are the options ssh and scp share. ssh takes the first value
// it is given for an option: BatchMode comes first so nothing can turn
// prompts back on, the user's options next so they win over the defaults
// after them.
func (s SSH) baseArgs() []string {
	a := []string{"-o", "BatchMode=yes"}
	for _, o := range s.Options {
		a = append(a, "-o", o)
	}
	// An unreachable host fails in seconds, not the TCP timeout; a host
	// that dies mid-copy is noticed within a minute.
	a = append(a, "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4")
	if s.Identity != "" {
		a = append(a, "-i", s.Identity)
	}
	return a
}

// sshArgs runs sh on h, as root through sudo -n when sudo, reading its
// script from stdin: the login shell, whatever it is (bash, csh, fish),
// only ever parses "sh -s", never the script's quotes and newlines.
func (s SSH) sshArgs(h Host, sudo bool) []string {
	a := s.baseArgs()
	if h.Port != 0 {
		a = append(a, "-p", strconv.Itoa(h.Port))
	}
	cmd := "sh -s"
	if sudo {
		cmd = "sudo -n sh -s"
	}
	// "--": nothing after it is an option, whatever the host is called.
	return append(a, "--", h.Target(), cmd)
}

// scpArgs copies the local file to remote on h.
func (s SSH) scpArgs(h Host, local, remote string) []string {
	a := append([]string{"-q"}, s.baseArgs()...)
	if h.Port != 0 {
		a = append(a, "-P", strconv.Itoa(h.Port))
	}
	return append(a, "--", local, h.scpTarget(remote))
}

// tryCommand is what a person runs to see what ssh says to h.
func (s SSH) tryCommand(h Host) string {
	a := s.baseArgs()
	if h.Port != 0 {
		a = append(a, "-p", strconv.Itoa(h.Port))
	}
	return "ssh " + strings.Join(append(a, h.Target(), "true"), " ")
}

// run runs script on h and returns what it printed on stdout. Errors
// carry its stderr, never its stdout: the pairing code comes back there.
func (s SSH) run(ctx context.Context, h Host, what, script string, sudo bool) (string, error) {
	cmd := exec.CommandContext(ctx, "ssh", s.sshArgs(h, sudo)...)
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(script), &out, &errb
	err := cmd.Run()
	if err != nil {
		return "", s.failure(h, what, err, errb.String())
	}
	return out.String(), nil
}

// copy copies the local file to remote on h with scp.
func (s SSH) copy(ctx context.Context, h Host, local, remote string) error {
	cmd := exec.CommandContext(ctx, "scp", s.scpArgs(h, local, remote)...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		return s.failure(h, "copy "+local+" to "+remote, err, errb.String())
	}
	return nil
}

// failure says what went wrong on h: ssh's own failure (exit 255: no
// connection, no key accepted, an unknown host key…) with the command to
// try by hand, or the remote step's own words.
func (s SSH) failure(h Host, what string, err error, stderr string) error {
	msg := lastLines(stderr, 12)
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 255 {
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("ssh to %s failed: %s; check that `%s` works without a prompt", h.Spec, msg, s.tryCommand(h))
	}
	if errors.Is(err, exec.ErrNotFound) {
		return fmt.Errorf("%s: %v (install openssh-client)", what, err)
	}
	if msg == "" {
		return fmt.Errorf("%s on %s: %v", what, h.Spec, err)
	}
	return fmt.Errorf("%s on %s: %s", what, h.Spec, msg)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.TrimSpace(strings.Join(lines, "\n"))
}

// keyValues reads the scripts' "key=value" lines.
func keyValues(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok {
			m[k] = v
		}
	}
	return m
}

// preflightScript runs as the login user: who it is, the machine, the
// address sshd answered on (the node listens there: an address of the
// host, and one this machine reached) and whether sudo -n works. Under
// sudo, SSH_CONNECTION would be gone (env_reset).
func preflightScript(sudo bool) string {
	s := `echo "uid=$(id -u)"
echo "arch=$(uname -m)"
echo "conn=$SSH_CONNECTION"
`
	if sudo {
		s += `if sudo -n true 2>/dev/null; then echo sudo=ok; fi
`
	}
	return s
}

// alive is a shell function: is PID $1 the node of this data dir? By its
// command line, not a name, so a PID reused by another process is never
// taken for it (and a zombie, whose cmdline is empty, is not alive).
func aliveFunc(l layout) string {
	return `alive() { [ -n "$1" ] && [ -r "/proc/$1/cmdline" ] && tr '\0' '\n' < "/proc/$1/cmdline" | grep -qxF -- ` + shQuote(l.dataDir()) + `; }
`
}

const sumFunc = `sum() { if [ -f "$1" ] && command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1; fi; }
`

// inspectScript (as root) makes the remote dir and says what is there: a
// node of this name still running, and the sha256 of the binaries in
// bin/ (or, with remoteRunsc, that runsc's version).
func inspectScript(l layout, remoteRunsc string) string {
	s := "umask 077\nmkdir -p " + shQuote(l.Dir) + "\n" + aliveFunc(l) + sumFunc +
		`pid=$(cat ` + shQuote(l.pidFile()) + ` 2>/dev/null)
if alive "$pid"; then echo "running=$pid"; fi
echo "sandstormd=$(sum ` + shQuote(l.bin()) + `)"
echo "` + envdName + `=$(sum ` + shQuote(l.envd()) + `)"
`
	if remoteRunsc == "" {
		s += `echo "runsc=$(sum ` + shQuote(l.runsc()) + `)"
`
	} else {
		s += `if [ -x ` + shQuote(remoteRunsc) + ` ]; then echo "runsc_version=$(` + shQuote(remoteRunsc) + ` --version 2>/dev/null | head -n 1)"; else echo runsc_missing=1; fi
`
	}
	return s
}

// stageScript (as the login user, who scp writes as) makes a directory
// for the copies: in the remote dir for root, so the install is a rename;
// under the user's TMPDIR for sudo, where root moves them from.
func stageScript(l layout, sudo bool) string {
	if sudo {
		return `mktemp -d "${TMPDIR:-/tmp}/sandstorm-fleet.XXXXXX"` + "\n"
	}
	return "mktemp -d " + shQuote(l.Dir+"/.incoming.XXXXXX") + "\n"
}

// staged is a file copied into the stage, to install in bin/ if its
// sha256 is still what this machine's is.
type staged struct{ Name, Sum string }

// installScript (as root) moves the staged files into bin/: each is
// checked, made root's and executable, and renamed over the old one (a
// rename, so a node running the old binary is not disturbed); the stage
// is removed whatever happens.
func installScript(l layout, stage string, files []staged) string {
	s := "set -e\nstage=" + shQuote(stage) + "\ntrap 'rm -rf \"$stage\"' EXIT\n" + sumFunc +
		"mkdir -p -m 755 " + shQuote(l.Dir+"/bin") + "\n"
	for _, f := range files {
		tmp := shQuote(l.Dir + "/bin/." + f.Name + ".new")
		s += "mv -f " + shQuote(stage+"/"+f.Name) + " " + tmp + "\n" +
			// root's, whoever copied it: a file root runs must not be
			// another user's to change (a stage under sudo is the login
			// user's).
			"chown 0:0 " + tmp + "\nchmod 755 " + tmp + "\n" +
			`if command -v sha256sum >/dev/null 2>&1 && [ "$(sum ` + tmp + `)" != ` + shQuote(f.Sum) + ` ]; then rm -f ` + tmp +
			`; echo "the copy of ` + f.Name + ` differs from the local one (sha256); run fleet up again" >&2; exit 5; fi` + "\n" +
			"mv -f " + tmp + " " + shQuote(l.Dir+"/bin/"+f.Name) + "\n"
	}
	return s
}

// startScript (as root) starts the node detached: its own session
// (setsid: the ssh session's end sends it nothing), SIGHUP ignored
// (nohup), every descriptor off the session (so ssh returns), and its PID
// written by the shell that then becomes it (exec), so the PID file holds
// the node's PID whether or not setsid had to fork.
func startScript(l layout, args []string) string {
	return "umask 077\ncd /\n" + aliveFunc(l) +
		`pid=$(cat ` + shQuote(l.pidFile()) + ` 2>/dev/null)
if alive "$pid"; then echo "a node already runs here: PID $pid (` + l.pidFile() + `)" >&2; exit 3; fi
rm -f ` + shQuote(l.pidFile()) + `
setsid nohup sh -c 'echo $$ >"$0" && exec "$@"' ` + shQuote(l.pidFile()) + " " + shJoin(args) + ` </dev/null >>` + shQuote(l.log()) + ` 2>&1 &
i=0
while [ ! -s ` + shQuote(l.pidFile()) + ` ]; do
	i=$((i+1))
	if [ $i -gt 200 ]; then echo "the node did not start within 10 s; the end of ` + l.log() + `:" >&2; tail -n 20 ` + shQuote(l.log()) + ` >&2; exit 4; fi
	sleep 0.05
done
cat ` + shQuote(l.pidFile()) + "\n"
}

// codeScript (as root) waits until the node has written its pairing code
// and prints it (to stdout only, which fleet up never shows); a node that
// exits meanwhile is reported at once with its log's end.
func codeScript(l layout, pid int) string {
	return aliveFunc(l) + "pid=" + strconv.Itoa(pid) + `
i=0
while [ ! -s ` + shQuote(l.codeFile()) + ` ]; do
	if ! alive "$pid"; then echo "the node (PID $pid) exited; the end of ` + l.log() + `:" >&2; tail -n 20 ` + shQuote(l.log()) + ` >&2; exit 4; fi
	i=$((i+1))
	if [ $i -gt 1200 ]; then echo "no pairing code within 60 s; the end of ` + l.log() + `:" >&2; tail -n 20 ` + shQuote(l.log()) + ` >&2; exit 3; fi
	sleep 0.05
done
cat ` + shQuote(l.codeFile()) + "\n"
}

// tailScript (as root) prints the end of the node's log.
func tailScript(l layout) string {
	return "tail -n 20 " + shQuote(l.log()) + "\n"
}

// stopScript (as root) stops the node by its PID, if that PID is still
// this node (aliveFunc), and waits for it to exit. With purge it then
// removes the node's data dir and log — unless mounts are left under it
// (its sandboxes were not deleted), which rm -rf would reach through —
// and, once no other node's PID file is left in the remote dir, the
// binaries fleet up put in bin/ (sandstormd, envd; runsc only if it put
// it there) and the
// dirs if empty.
func stopScript(l layout, pid int, purge, ownRunsc bool) string {
	s := aliveFunc(l) + "pid=" + strconv.Itoa(pid) + `
if alive "$pid"; then
	kill -TERM "$pid"
	i=0
	while alive "$pid"; do
		i=$((i+1))
		if [ $i -gt 600 ]; then echo "PID $pid did not stop within 30 s; it still runs (its log: ` + l.log() + `)" >&2; exit 3; fi
		sleep 0.05
	done
	echo stopped
else
	echo gone
fi
if [ "$(cat ` + shQuote(l.pidFile()) + ` 2>/dev/null)" = "$pid" ]; then rm -f ` + shQuote(l.pidFile()) + `; fi
`
	if !purge {
		return s
	}
	bins := shQuote(l.bin()) + " " + shQuote(l.envd())
	if ownRunsc {
		bins += " " + shQuote(l.runsc())
	}
	return s + `if grep -qF -- ` + shQuote(" "+l.dataDir()+"/") + ` /proc/self/mountinfo; then echo "mounts are left under ` + l.dataDir() + ` (sandboxes the master did not delete?); not removing it" >&2; exit 6; fi
rm -rf -- ` + shQuote(l.dataDir()) + " " + shQuote(l.log()) + `
if ! ls ` + shQuote(l.Dir) + `/*.pid >/dev/null 2>&1; then
	rm -f -- ` + bins + `
	rmdir ` + shQuote(l.Dir+"/bin") + " " + shQuote(l.Dir) + ` 2>/dev/null || true
fi
echo purged
`
}
