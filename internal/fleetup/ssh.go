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
	"path"
	"strconv"
	"strings"

	"sandstorm/internal/sam/membership"
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
func aliveFunc(l layout) string { return aliveFor(l.dataDir()) }

// aliveFor is alive for the process with marker as one argument of its
// command line: a node's data dir, a sam-node's mesh dir.
func aliveFor(marker string) string {
	return `alive() { [ -n "$1" ] && [ -r "/proc/$1/cmdline" ] && tr '\0' '\n' < "/proc/$1/cmdline" | grep -qxF -- ` + shQuote(marker) + `; }
`
}

const sumFunc = `sum() { if [ -f "$1" ] && command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1; fi; }
`

// inspectScript (as root) makes the remote dir and says what is there: a
// node of this name still running, and the sha256 of the binaries in
// bin/ (or, with remoteRunsc, that runsc's version); of the node's
// sam-node: one still running, a member in its mesh dir, the sha256 of
// the control plane's CA it was enrolled with and that control plane's
// URL (meshJoinNeeded), and the sha256 of its config.
func inspectScript(l layout, remoteRunsc string) string {
	s := "umask 077\nmkdir -p " + shQuote(l.Dir) + "\n" + aliveFunc(l) + sumFunc +
		`pid=$(cat ` + shQuote(l.pidFile()) + ` 2>/dev/null)
if alive "$pid"; then echo "running=$pid"; fi
echo "sandstormd=$(sum ` + shQuote(l.bin()) + `)"
echo "` + envdName + `=$(sum ` + shQuote(l.envd()) + `)"
echo "sam-node=$(sum ` + shQuote(l.samNode()) + `)"
echo "` + meshConfigName + `=$(sum ` + shQuote(l.meshConfig()) + `)"
` + aliveFor(l.meshDir()) + `pid=$(cat ` + shQuote(l.meshPIDFile()) + ` 2>/dev/null)
if alive "$pid"; then echo "mesh_running=$pid"; fi
if [ -f ` + shQuote(l.meshDir()+"/"+membership.CredentialFile) + ` ]; then echo mesh_member=1; fi
echo "mesh_ca=$(sum ` + shQuote(l.meshDir()+"/"+membership.CAFile) + `)"
echo "mesh_url=$(sed -n 's/.*"control_plane_url":"\([^"]*\)".*/\1/p' ` + shQuote(l.meshDir()+"/"+membership.MemberFile) + ` 2>/dev/null)"
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

// installScript (as root) moves the staged files into place (l.dest:
// binaries into bin/, executable; the sam-node config beside the node's
// files, 0600): each is checked, made root's, and renamed over the old
// one (a rename, so a node running the old binary is not disturbed); the
// stage is removed whatever happens.
func installScript(l layout, stage string, files []staged) string {
	s := "set -e\nstage=" + shQuote(stage) + "\ntrap 'rm -rf \"$stage\"' EXIT\n" + sumFunc +
		"mkdir -p -m 755 " + shQuote(l.Dir+"/bin") + "\n"
	for _, f := range files {
		dest, mode := l.dest(f.Name)
		tmp := shQuote(path.Dir(dest) + "/." + f.Name + ".new")
		s += "mv -f " + shQuote(stage+"/"+f.Name) + " " + tmp + "\n" +
			// root's, whoever copied it: a file root runs must not be
			// another user's to change (a stage under sudo is the login
			// user's).
			"chown 0:0 " + tmp + "\nchmod " + mode + " " + tmp + "\n" +
			`if command -v sha256sum >/dev/null 2>&1 && [ "$(sum ` + tmp + `)" != ` + shQuote(f.Sum) + ` ]; then rm -f ` + tmp +
			`; echo "the copy of ` + f.Name + ` differs from the local one (sha256); run fleet up again" >&2; exit 5; fi` + "\n" +
			"mv -f " + tmp + " " + shQuote(dest) + "\n"
	}
	return s
}

// startScript (as root) starts the node detached: its own session
// (setsid: the ssh session's end sends it nothing), SIGHUP ignored
// (nohup), every descriptor off the session (so ssh returns), and its PID
// written by the shell that then becomes it (exec), so the PID file holds
// the node's PID whether or not setsid had to fork.
func startScript(l layout, args []string) string {
	return "umask 077\ncd /\n" + notRunning("a node", l.pidFile(), l.dataDir()) + launch("the node", l.pidFile(), l.log(), args) +
		"cat " + shQuote(l.pidFile()) + "\n"
}

// notRunning fails the script (exit 3) if the process of pidFile is
// still the one whose command line names marker (aliveFor).
func notRunning(what, pidFile, marker string) string {
	return aliveFor(marker) + `pid=$(cat ` + shQuote(pidFile) + ` 2>/dev/null)
if alive "$pid"; then echo "` + what + ` already runs here: PID $pid (` + pidFile + `)" >&2; exit 3; fi
`
}

// launch starts args detached (startScript says how) and waits until its
// PID file is written.
func launch(what, pidFile, logFile string, args []string) string {
	return `rm -f ` + shQuote(pidFile) + `
setsid nohup sh -c 'echo $$ >"$0" && exec "$@"' ` + shQuote(pidFile) + " " + shJoin(args) + ` </dev/null >>` + shQuote(logFile) + ` 2>&1 &
i=0
while [ ! -s ` + shQuote(pidFile) + ` ]; do
	i=$((i+1))
	if [ $i -gt 200 ]; then echo "` + what + ` did not start within 10 s; the end of ` + logFile + `:" >&2; tail -n 20 ` + shQuote(logFile) + ` >&2; exit 4; fi
	sleep 0.05
done
`
}

// meshJoin is what a host's sam-node enrols with, fed to it on stdin in
// the script (never on a command line, where any user of the host could
// read the token in ps).
type meshJoin struct {
	URL, Name, Token string
	CA               []byte // the control plane's CA (PEM)
	// Hint is said when the join fails: what the host must reach.
	Hint string
}

// Heredoc delimiters of samNodeScript: the token and the CA are checked
// not to hold them.
const tokenEOF, caEOF = "SANDSTORM_FLEET_TOKEN", "SANDSTORM_FLEET_CA"

// samNodeScript (as root) enrols the node's sam-node into the mesh if
// join is not nil — the control plane's CA written into its mesh dir,
// the token on sam-node join's stdin (--token-file -) from a here-document
// of this script, which ssh brought on its stdin — and starts it detached
// as startScript starts the node. It prints "log_offset=" (the size of
// the sam-node's log before it started: meshWaitScript reads from there)
// and "pid=".
func samNodeScript(l layout, join *meshJoin, args []string) (string, error) {
	s := "umask 077\ncd /\n" + notRunning("a sam-node", l.meshPIDFile(), l.meshDir())
	if join != nil {
		// A token is base64url; anything else could end the
		// here-document or be read as more than a token.
		for _, r := range join.Token {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
				return "", fmt.Errorf("the bootstrap token has a %q in it: not a token the control plane makes", r)
			}
		}
		if join.Token == "" {
			return "", errors.New("an empty bootstrap token")
		}
		for _, line := range strings.Split(string(join.CA), "\n") {
			if strings.TrimSpace(line) == caEOF {
				return "", errors.New("the control plane's CA holds the here-document's delimiter")
			}
		}
		ca := l.meshDir() + "/" + membership.CAFile
		s += "mkdir -p -m 700 " + shQuote(l.meshDir()) + "\ncat >" + shQuote(ca) + " <<'" + caEOF + "'\n" +
			strings.TrimRight(string(join.CA), "\n") + "\n" + caEOF + "\n" +
			"if ! " + shJoin([]string{l.samNode(), "join", "--control-plane", join.URL, "--ca", ca, "--name", join.Name, "--mesh-dir", l.meshDir(), "--token-file", "-"}) +
			" <<'" + tokenEOF + "' >&2\n" + join.Token + "\n" + tokenEOF + "\nthen echo " + shQuote(join.Hint) + " >&2; exit 7; fi\n"
	}
	s += `off=$(wc -c < ` + shQuote(l.meshLog()) + ` 2>/dev/null || echo 0)
echo "log_offset=$off"
` + launch("the sam-node", l.meshPIDFile(), l.meshLog(), args) + `echo "pid=$(cat ` + shQuote(l.meshPIDFile()) + `)"
`
	return s, nil
}

// meshWaitScript (as root) waits until the sam-node (PID pid) has joined
// the mesh — its log says so after offset, where this start of it began
// — and says at once, with its log's end, if it exits meanwhile.
func meshWaitScript(l layout, pid int, offset int64) string {
	return aliveFor(l.meshDir()) + "pid=" + strconv.Itoa(pid) +
		waitWhile(`! tail -c +`+strconv.FormatInt(offset+1, 10)+` `+shQuote(l.meshLog())+` 2>/dev/null | grep -qF 'joined the mesh'`,
			"the sam-node", "the sam-node did not join the mesh within 60 s (can it reach the router?)", l.meshLog())
}

// waitWhile (after "pid=", with alive defined) polls every 50 ms while
// the shell condition cond holds: it fails (exit 4) with log's end as
// soon as who, the process of $pid, exits, and (exit 3) with late and
// log's end after 60 s.
func waitWhile(cond, who, late, log string) string {
	return `
i=0
while ` + cond + `; do
	if ! alive "$pid"; then echo "` + who + ` (PID $pid) exited; the end of ` + log + `:" >&2; tail -n 20 ` + shQuote(log) + ` >&2; exit 4; fi
	i=$((i+1))
	if [ $i -gt 1200 ]; then echo "` + late + `; the end of ` + log + `:" >&2; tail -n 20 ` + shQuote(log) + ` >&2; exit 3; fi
	sleep 0.05
done
`
}

// stopMeshScript (as root) stops the node's sam-node by its PID, as
// stopScript stops the node, and with purge removes its mesh dir (its
// identity and credential), log and config. Run before stopScript: its
// PID file gone, the node's purge may remove bin/.
func stopMeshScript(l layout, pid int, purge bool) string {
	s := aliveFor(l.meshDir()) + "pid=" + strconv.Itoa(pid) +
		killWait("the sam-node (PID $pid)", l.meshLog(), l.meshPIDFile(), "mesh_stopped", "mesh_gone")
	if purge {
		s += "rm -rf -- " + shJoin([]string{l.meshDir(), l.meshLog(), l.meshConfig()}) + "\necho mesh_purged\n"
	}
	return s
}

// codeScript (as root) waits until the node has written its pairing code
// and prints it (to stdout only, which fleet up never shows); a node that
// exits meanwhile is reported at once with its log's end.
func codeScript(l layout, pid int) string {
	return aliveFunc(l) + "pid=" + strconv.Itoa(pid) +
		waitWhile(`[ ! -s `+shQuote(l.codeFile())+` ]`, "the node", "no pairing code within 60 s", l.log()) +
		"cat " + shQuote(l.codeFile()) + "\n"
}

// killWait (after "pid=", with alive defined) sends who, the process of
// $pid, SIGTERM if it is alive and waits up to 30 s for it to exit,
// printing stopped (or gone, if it was not alive); then removes pidFile
// if it still names $pid.
func killWait(who, log, pidFile, stopped, gone string) string {
	return `
if alive "$pid"; then
	kill -TERM "$pid"
	i=0
	while alive "$pid"; do
		i=$((i+1))
		if [ $i -gt 600 ]; then echo "` + who + ` did not stop within 30 s; it still runs (its log: ` + log + `)" >&2; exit 3; fi
		sleep 0.05
	done
	echo ` + stopped + `
else
	echo ` + gone + `
fi
if [ "$(cat ` + shQuote(pidFile) + ` 2>/dev/null)" = "$pid" ]; then rm -f ` + shQuote(pidFile) + `; fi
`
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
	s := aliveFunc(l) + "pid=" + strconv.Itoa(pid) + killWait("PID $pid", l.log(), l.pidFile(), "stopped", "gone")
	if !purge {
		return s
	}
	bins := shQuote(l.bin()) + " " + shQuote(l.envd()) + " " + shQuote(l.samNode())
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
