package e2b

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
)

// E2B's template builds (js-sdk src/template: a base image or template
// and steps, as TemplateBuildStartV2) become a Dockerfile and its
// context here, built by the template service /v1 shares: each COPY
// reads the tarball its team uploaded for the step's files hash,
// extracted under a directory of that name; every other step is a
// Dockerfile instruction. What E2B's builder does beyond the steps is
// done the same way: an image gets the account "user" (uid 1000, home
// /home/user) its sandboxes run commands as, and the template is warm,
// envd its init, as the SDK's base template is.

// buildStart is E2B's TemplateBuildStartV2.
type buildStart struct {
	FromImage         string          `json:"fromImage,omitempty"`
	FromTemplate      string          `json:"fromTemplate,omitempty"`
	FromImageRegistry json.RawMessage `json:"fromImageRegistry,omitempty"`
	Force             bool            `json:"force,omitempty"`
	Steps             []step          `json:"steps"`
	StartCmd          string          `json:"startCmd,omitempty"`
	ReadyCmd          string          `json:"readyCmd,omitempty"`
}

// step is E2B's TemplateStep.
type step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force,omitempty"`
}

// defaultUser and defaultHome are the account E2B's images run as.
const (
	defaultUser = "user"
	defaultHome = "/home/user"
)

// provision gives an image the account "user", as E2B's builder does,
// unless it has one: with the distribution's tool where there is one,
// else by writing the account's lines. Run as root.
const provision = `id -u user >/dev/null 2>&1 && exit 0
if command -v useradd >/dev/null 2>&1; then useradd -m -u 1000 -s /bin/bash user || useradd -m -s /bin/sh user
elif command -v adduser >/dev/null 2>&1; then adduser -D -u 1000 user
else echo 'user:x:1000:1000::/home/user:/bin/sh' >>/etc/passwd && echo 'user:x:1000:' >>/etc/group && mkdir -p /home/user && chown 1000:1000 /home/user
fi`

// plan is a build translated: the Dockerfile, which of E2B's steps each
// of its lines is ("base": the FROM and what is done to the image;
// "finalize": the start and ready commands; else the step's number,
// counted from 1 as the SDK counts its stack traces), the files hashes
// its COPY steps read, and the account and directory it ends with.
type plan struct {
	dockerfile strings.Builder
	line       int
	lines      map[int]string
	steps      map[int]step
	hashes     []string
	user, dir  string
	force      bool
}

func (p *plan) emit(stepName string, s step, format string, args ...any) {
	p.line++
	fmt.Fprintf(&p.dockerfile, format+"\n", args...)
	p.lines[p.line] = stepName
	p.steps[p.line] = s
}

var (
	validUser = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$`)
	validEnv  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	validHash = regexp.MustCompile(`^[0-9a-f]{64}$`)
	validMode = regexp.MustCompile(`^0?[0-7]{3,4}$`)
)

// jsonArgs is args as a Dockerfile's JSON array (exec form), which takes
// any string, newlines included.
func jsonArgs(args ...string) string {
	b, _ := json.Marshal(args)
	return string(b)
}

// dockerWord is s as one word of a Dockerfile instruction that expands
// variables (ENV, WORKDIR): double-quoted, with \, " and $ escaped, so it
// stands for itself.
func dockerWord(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`)
	return `"` + r.Replace(s) + `"`
}

func badStep(n int, format string, args ...any) error {
	return errdefs.New(errdefs.ErrBadInput, "step %d: "+format, append([]any{n}, args...)...)
}

// from is where a build starts: an image (qualified and mirrored by the
// caller) or a registered template, with the account and directory its
// sandboxes run commands as.
type from struct {
	image, template string
	user, dir       string
}

// translate makes the plan of req over base.
func translate(req buildStart, base from) (*plan, error) {
	p := &plan{lines: map[int]string{}, steps: map[int]step{}, user: base.user, dir: base.dir, force: req.Force}
	if base.image != "" {
		p.emit("base", step{}, "FROM %s", base.image)
		p.emit("base", step{}, "USER 0:0")
		p.emit("base", step{}, "RUN %s", jsonArgs("/bin/sh", "-c", provision))
		p.user, p.dir = defaultUser, defaultHome
		p.emit("base", step{}, "USER %s", p.user)
		p.emit("base", step{}, "WORKDIR %s", p.dir)
	} else {
		// A template's own account and directory (its envd's, for an
		// E2B-style one) are where its steps start.
		p.emit("base", step{}, "FROM %s", base.template)
		if p.user != "" {
			p.emit("base", step{}, "USER %s", p.user)
		}
		if p.dir != "" {
			p.emit("base", step{}, "WORKDIR %s", dockerWord(p.dir))
		}
	}
	seen := map[string]bool{}
	for i, s := range req.Steps {
		n := i + 1
		if s.Force {
			p.force = true
		}
		if err := p.step(n, s); err != nil {
			return nil, err
		}
		if s.Type == "COPY" && !seen[s.FilesHash] {
			seen[s.FilesHash] = true
			p.hashes = append(p.hashes, s.FilesHash)
		}
	}
	return p, nil
}

// step adds E2B's step n.
func (p *plan) step(n int, s step) error {
	name := strconv.Itoa(n)
	arg := func(i int) string {
		if i < len(s.Args) {
			return s.Args[i]
		}
		return ""
	}
	switch s.Type {
	case "RUN":
		if len(s.Args) < 1 || len(s.Args) > 2 || strings.TrimSpace(s.Args[0]) == "" {
			return badStep(n, "RUN takes a command and, optionally, a user")
		}
		user := arg(1)
		if user != "" && user != p.user {
			if !validUser.MatchString(user) {
				return badStep(n, "user %q: not a user name or UID[:GID]", user)
			}
			p.emit(name, s, "USER %s", user)
			p.emit(name, s, "RUN %s", jsonArgs("/bin/sh", "-c", s.Args[0]))
			p.emit(name, s, "USER %s", p.user)
			return nil
		}
		p.emit(name, s, "RUN %s", jsonArgs("/bin/sh", "-c", s.Args[0]))
	case "COPY":
		return p.copyStep(n, s)
	case "ENV":
		if len(s.Args) == 0 || len(s.Args)%2 != 0 {
			return badStep(n, "ENV takes pairs of a name and a value")
		}
		var kv []string
		for i := 0; i < len(s.Args); i += 2 {
			if !validEnv.MatchString(s.Args[i]) {
				return badStep(n, "ENV name %q: letters, digits and _, not starting with a digit", s.Args[i])
			}
			if strings.ContainsAny(s.Args[i+1], "\n\r\x00") {
				return badStep(n, "ENV %s: a value on one line", s.Args[i])
			}
			kv = append(kv, s.Args[i]+"="+dockerWord(s.Args[i+1]))
		}
		p.emit(name, s, "ENV %s", strings.Join(kv, " "))
	case "WORKDIR":
		if len(s.Args) != 1 || s.Args[0] == "" || strings.ContainsAny(s.Args[0], "\n\r\x00") {
			return badStep(n, "WORKDIR takes one path")
		}
		p.emit(name, s, "WORKDIR %s", dockerWord(s.Args[0]))
		if strings.HasPrefix(s.Args[0], "/") {
			p.dir = s.Args[0]
		} else {
			p.dir = strings.TrimSuffix(p.dir, "/") + "/" + s.Args[0]
		}
	case "USER":
		if len(s.Args) != 1 || !validUser.MatchString(s.Args[0]) {
			return badStep(n, "USER %q: not a user name or UID[:GID]", arg(0))
		}
		p.emit(name, s, "USER %s", s.Args[0])
		p.user = s.Args[0]
	default:
		return badStep(n, "type %q: want RUN, COPY, ENV, WORKDIR or USER", s.Type)
	}
	return nil
}

// copyStep adds COPY step n: [src, dest, user, mode], src read from the
// tarball uploaded for its files hash.
func (p *plan) copyStep(n int, s step) error {
	if len(s.Args) < 2 || len(s.Args) > 4 || s.Args[0] == "" || s.Args[1] == "" {
		return badStep(n, "COPY takes a source, a destination, and optionally a user and a mode")
	}
	if !validHash.MatchString(s.FilesHash) {
		return badStep(n, "COPY's filesHash %q: want 64 hex digits", s.FilesHash)
	}
	src := strings.TrimPrefix(s.Args[0], "./")
	if strings.HasPrefix(src, "/") || strings.Contains("/"+src+"/", "/../") {
		return badStep(n, "COPY source %q: a path inside the context", s.Args[0])
	}
	var flags []string
	user := p.user
	if len(s.Args) > 2 && s.Args[2] != "" {
		user = s.Args[2]
	}
	if user != "" {
		if !validUser.MatchString(user) {
			return badStep(n, "COPY user %q: not a user name or UID[:GID]", user)
		}
		flags = append(flags, "--chown="+user)
	}
	if len(s.Args) > 3 && s.Args[3] != "" {
		if !validMode.MatchString(s.Args[3]) {
			return badStep(n, "COPY mode %q: want octal, e.g. 0755", s.Args[3])
		}
		flags = append(flags, "--chmod="+s.Args[3])
	}
	dest := s.Args[1]
	if strings.ContainsAny(src, "*?[") && !strings.HasSuffix(dest, "/") {
		// A pattern's matches go into the destination, a directory, as
		// E2B's copy puts them (Docker wants the / said).
		dest += "/"
	}
	flags = append(flags, jsonArgs(s.FilesHash+"/"+src, dest))
	p.emit(strconv.Itoa(n), s, "COPY %s", strings.Join(flags, " "))
	return nil
}

// warmOf is the warm image of a template whose ready command is ready:
// E2B's waitForPort and waitForURL (of this sandbox) are the node's own
// port and HTTP probes; any other command (waitForFile, waitForProcess,
// waitForTimeout, a command of the user's) is run inside by the node
// until it exits 0, as E2B's builder runs it; none: once envd answers.
func warmOf(ready string) api.Warm {
	w := api.Warm{Probe: api.Probe{Port: api.EnvdPort, Path: "/health"}, Reseed: api.Reseed{Command: []string{"/bin/true"}}}
	if m := readyPort.FindStringSubmatch(ready); m != nil {
		if port, err := strconv.Atoi(m[1]); err == nil && port > 0 && port < 65536 {
			w.Probe = api.Probe{Port: port}
		}
	} else if m := readyURL.FindStringSubmatch(ready); m != nil {
		if port, err := strconv.Atoi(m[1]); err == nil && port > 0 && port < 65536 && m[3] == "200" {
			path := m[2]
			if path == "" {
				path = "/"
			}
			w.Probe = api.Probe{Port: port, Path: path}
		}
	} else if strings.TrimSpace(ready) != "" {
		w.Probe = api.Probe{Command: []string{"/bin/sh", "-c", ready}}
	}
	return w
}

// The SDK's waitForPort and waitForURL (js-sdk src/template/readycmd.ts).
var (
	readyPort = regexp.MustCompile(`^\[ -n "\$\(ss -Htuln sport = :(\d+)\)" \]$`)
	readyURL  = regexp.MustCompile(`^curl -s -o /dev/null -w "%\{http_code\}" '?https?://(?:localhost|127\.0\.0\.1|0\.0\.0\.0):(\d+)(/[^' ]*)?'? \| grep -q "(\d+)"$`)
)

// processOf is the template's process: its start command, then (so
// that the sandbox lives on when it ends, as E2B's do) a sleep.
func processOf(start string) []string {
	if strings.TrimSpace(start) == "" {
		return []string{"/bin/sh", "-c", "exec sleep infinity"}
	}
	return []string{"/bin/sh", "-c", start + "\nexec sleep infinity"}
}
