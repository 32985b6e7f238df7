package interpreter

import (
	"encoding/json"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"

	"sandstorm/internal/errdefs"
)

// A language is how the server starts a kernel for one of E2B's
// languages, and speaks to it on the caller's behalf. Every kernel is a
// real Jupyter kernel driven over the messaging protocol: ipykernel for
// Python, IRkernel for R (Debian's r-cran-irkernel), and for bash the
// kernel in bashkernel.py (ipykernel's Kernel class over one bash
// process), since Debian packages no bash kernel and E2B's, bash_kernel,
// is on PyPI only; for JavaScript and TypeScript the kernel in
// jskernel.py (the same frame over one Node.js process, jsrunner.js),
// since E2B's, a fork of ijavascript, installs from GitHub.
type language struct {
	// argv is the kernel's command for the connection file conn.
	argv func(s *Server, conn string) []string
	// program is what must be installed for the kernel to start (looked
	// up on PATH when not absolute).
	program func(s *Server) string
	// install says what to install when program is missing.
	install string
	// env is code setting set and removing unset in the kernel's
	// environment (E2B's envs, per sandbox and per call).
	env func(set map[string]string, unset []string) string
	// reseed, when set, is code that draws new seeds for the kernel's
	// random generators (after a restore from a warm image).
	reseed string
}

// languages are the kernels served, by E2B's name (normalizeLanguage).
var languages = map[string]language{
	"python": {
		argv: func(s *Server, conn string) []string {
			// -Xfrozen_modules=off: Python 3.11's frozen standard modules
			// make ipykernel's debugger warn on every start.
			return []string{s.cfg.Python, "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", conn,
				// Tracebacks without ANSI colours: they are read as text.
				"--InteractiveShell.colors=NoColor",
				"--IPKernelApp.exec_files", s.startup}
		},
		program: func(s *Server) string { return s.cfg.Python },
		install: "python3-ipykernel",
		env:     pythonEnv,
		reseed:  reseedCode,
	},
	"r": {
		// IRkernel's own kernel spec (its kernel.json): R running
		// IRkernel::main() with the connection file after --args.
		argv: func(s *Server, conn string) []string {
			return []string{s.cfg.R, "--slave", "-e", "IRkernel::main()", "--args", conn}
		},
		program: func(s *Server) string { return s.cfg.R },
		install: "r-base-core and r-cran-irkernel",
		env:     rEnv,
		reseed:  "set.seed(NULL)\n",
	},
	"bash": {
		argv: func(s *Server, conn string) []string {
			return []string{s.cfg.Python, "-Xfrozen_modules=off", s.bashKernel, "-f", conn}
		},
		program: func(s *Server) string { return s.cfg.Bash },
		install: "bash and python3-ipykernel",
		env:     bashEnv,
	},
	"javascript": jsLanguage("javascript"),
	"typescript": jsLanguage("typescript"),
	"java": {
		argv: func(s *Server, conn string) []string {
			return []string{s.cfg.Python, "-Xfrozen_modules=off", s.javaKernel, "java", s.cfg.Java, "-f", conn}
		},
		program: func(s *Server) string { return s.cfg.Java },
		install: "openjdk-17-jdk-headless and python3-ipykernel",
		env:     javaEnv,
	},
}

// jsLanguage is the kernel of jskernel.py for JavaScript or TypeScript.
func jsLanguage(name string) language {
	return language{
		argv: func(s *Server, conn string) []string {
			return []string{s.cfg.Python, "-Xfrozen_modules=off", s.jsKernel, name, s.cfg.Node, "-f", conn}
		},
		program: func(s *Server) string { return s.cfg.Node },
		install: "nodejs, node-typescript and python3-ipykernel",
		env:     jsEnv,
	}
}

// lookupLanguage is the language named l (E2B's spelling), or why it is
// not served here.
func (s *Server) lookupLanguage(name string) (language, error) {
	l, ok := languages[name]
	if !ok {
		return language{}, errdefs.New(errdefs.ErrNotSupported,
			"no %s kernel in this sandbox: the code interpreter serves %s", name, strings.Join(slices.Sorted(maps.Keys(languages)), ", "))
	}
	if _, err := exec.LookPath(l.program(s)); err != nil {
		return language{}, errdefs.New(errdefs.ErrNotSupported,
			"no %s kernel in this sandbox: %s is not installed (a template with %s has one)", name, l.program(s), l.install)
	}
	return l, nil
}

// envCode is code setting set and removing unset, one line each, made by
// setLine and unsetLine in a kernel's language; "" when there is neither.
func envCode(set map[string]string, unset []string, setLine func(k, v string) string, unsetLine func(k string) string) string {
	if len(set) == 0 && len(unset) == 0 {
		return ""
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(set)) {
		b.WriteString(setLine(k, set[k]) + "\n")
	}
	for _, k := range unset {
		b.WriteString(unsetLine(k) + "\n")
	}
	return b.String()
}

// pythonEnv sets os.environ. Values are quoted as JSON strings, which
// Python reads as the same strings.
func pythonEnv(set map[string]string, unset []string) string {
	code := envCode(set, unset,
		func(k, v string) string {
			return fmt.Sprintf("__sandstorm_os.environ[%s] = %s", jsonString(k), jsonString(v))
		},
		func(k string) string { return fmt.Sprintf("__sandstorm_os.environ.pop(%s, None)", jsonString(k)) })
	if code == "" {
		return ""
	}
	return "import os as __sandstorm_os\n" + code + "del __sandstorm_os\n"
}

// rEnv sets R's environment (Sys.setenv, Sys.unsetenv). R reads a JSON
// string as the same string but for "\/", which Go's encoder does not
// write; a quoted argument name is R's way to name any variable.
func rEnv(set map[string]string, unset []string) string {
	return envCode(set, unset,
		func(k, v string) string {
			return fmt.Sprintf("invisible(Sys.setenv(%s = %s))", jsonString(k), jsonString(v))
		},
		func(k string) string { return fmt.Sprintf("invisible(Sys.unsetenv(%s))", jsonString(k)) })
}

// bashEnv exports and unsets in the kernel's bash. Each assignment is one
// single-quoted word, so neither a name nor a value is read as code: a
// name bash does not take is an error of export's, nothing more.
func bashEnv(set map[string]string, unset []string) string {
	return envCode(set, unset,
		func(k, v string) string { return "export " + shellQuote(k+"="+v) },
		func(k string) string { return "unset -v " + shellQuote(k) })
}

// jsEnv sets process.env. A JSON string is a JavaScript string literal
// of the same string (since ES2019 even with U+2028 in it).
func jsEnv(set map[string]string, unset []string) string {
	return envCode(set, unset,
		func(k, v string) string { return fmt.Sprintf("process.env[%s] = %s;", jsonString(k), jsonString(v)) },
		func(k string) string { return fmt.Sprintf("delete process.env[%s];", jsonString(k)) })
}

// javaEnv sets Java's system properties, where E2B's Java kernel keeps
// envs (a JVM's environment cannot change). A JSON string from Go's
// encoder is a Java string literal of the same string: it writes no
// \u000a or \u000d, which Java would read as line ends before lexing.
func javaEnv(set map[string]string, unset []string) string {
	return envCode(set, unset,
		func(k, v string) string {
			return fmt.Sprintf("System.setProperty(%s, %s);", jsonString(k), jsonString(v))
		},
		func(k string) string { return fmt.Sprintf("System.clearProperty(%s);", jsonString(k)) })
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// shellQuote is s as one single-quoted shell word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
