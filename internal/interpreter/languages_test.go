package interpreter

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/testenv"
)

// firstText is the text of an execution's first result: IRkernel shows
// a value as display data, not as an execute_result (the SDK's R tests
// read results[0].text).
func firstText(t *testing.T, lines []map[string]any) string {
	t.Helper()
	r := ofType(lines, "result")
	if len(r) == 0 {
		t.Fatalf("no result in %v", lines)
	}
	s, _ := r[0]["text"].(string)
	return s
}

// The R kernel is Debian's IRkernel (r-cran-irkernel), run for real.
func TestRKernel(t *testing.T) {
	_, ts := newTestServer(t)
	if err := exec.Command("R", "--slave", "-e", "library(IRkernel)").Run(); err != nil {
		testenv.Skip(t, "R with IRkernel: apt-get install r-base-core r-cran-irkernel")
	}
	ctx := context.Background()
	r := func(body map[string]any, hdr ...string) []map[string]any {
		body["language"] = "r"
		return run(t, ctx, ts.URL, body, hdr...)
	}
	env := api.EncodeEnv(map[string]string{"TEST_ENV_VAR": "supertest"})
	if got := firstText(t, r(map[string]any{"code": `Sys.getenv("TEST_ENV_VAR")`}, api.EnvdEnvHeader, env)); got != `[1] "supertest"` {
		t.Errorf("the sandbox's variable: %q", got)
	}
	// A value R would read as code if it were not quoted: it stays text.
	odd := `a"b\c')$(x)/` + "\n"
	lines := r(map[string]any{"code": `cat(Sys.getenv("TEST_ENV_VAR"), Sys.getenv("ODD"), sep = "|")`,
		"env_vars": map[string]string{"TEST_ENV_VAR": "overwrite", "ODD": odd}}, api.EnvdEnvHeader, env)
	if so := ofType(lines, "stdout"); len(so) != 1 || so[0]["text"] != "overwrite|"+odd {
		t.Errorf("per-call variables: %v", lines)
	}
	if got := firstText(t, r(map[string]any{"code": `c(Sys.getenv("TEST_ENV_VAR"), Sys.getenv("ODD", unset = "gone"))`},
		api.EnvdEnvHeader, env)); !strings.HasPrefix(got, `[1] "supertest" "gone"`) {
		t.Errorf("after the call: %q, want the sandbox's value back and ODD unset", got)
	}
	if got := firstText(t, r(map[string]any{"code": "x <- 41; x + 1"})); got != "[1] 42" {
		t.Errorf("x + 1: %q", got)
	}
	if got := firstText(t, r(map[string]any{"code": "x"})); got != "[1] 41" {
		t.Errorf("x in the next call: %q (variables kept)", got)
	}
	errs := ofType(r(map[string]any{"code": `stop("boom")`}), "error")
	if len(errs) != 1 || !strings.Contains(errs[0]["value"].(string), "boom") {
		t.Errorf("an R error: %v", errs)
	}
	if got := firstText(t, r(map[string]any{"code": "getwd()"})); !strings.HasPrefix(got, `[1] "/`) {
		t.Errorf("getwd(): %q", got)
	}
}

func TestBashKernel(t *testing.T) {
	s, ts := newTestServer(t)
	ctx := context.Background()
	sh := func(body map[string]any, hdr ...string) []map[string]any {
		body["language"] = "bash"
		return run(t, ctx, ts.URL, body, hdr...)
	}
	stdout := func(lines []map[string]any) string {
		var b strings.Builder
		for _, l := range ofType(lines, "stdout") {
			b.WriteString(l["text"].(string))
		}
		return b.String()
	}
	env := api.EncodeEnv(map[string]string{"TEST_ENV_VAR": "supertest"})
	if got := ofType(sh(map[string]any{"code": "echo $TEST_ENV_VAR"}, api.EnvdEnvHeader, env), "stdout"); len(got) != 1 || got[0]["text"] != "supertest\n" {
		t.Errorf("the sandbox's variable: %v", got)
	}
	odd := `a'b"c $(touch /tmp/pwned) ` + "`x`"
	got := stdout(sh(map[string]any{"code": `printf '%s|%s\n' "$TEST_ENV_VAR" "$ODD"`,
		"env_vars": map[string]string{"TEST_ENV_VAR": "overwrite", "ODD": odd}}, api.EnvdEnvHeader, env))
	if got != "overwrite|"+odd+"\n" {
		t.Errorf("per-call variables: %q", got)
	}
	if got := stdout(sh(map[string]any{"code": `echo "$TEST_ENV_VAR ${ODD:-unset}"`}, api.EnvdEnvHeader, env)); got != "supertest unset\n" {
		t.Errorf("after the call: %q, want the sandbox's value back and ODD unset", got)
	}

	// State lasts from cell to cell; output on both streams; a failing
	// cell is an error with its status, as bash_kernel reports it.
	dir := t.TempDir()
	sh(map[string]any{"code": "cd " + dir + "\nv=kept"})
	lines := sh(map[string]any{"code": "pwd; echo $v; echo oops >&2; printf 'no newline'"})
	if got := stdout(lines); got != dir+"\nkept\nno newline" {
		t.Errorf("stdout %q", got)
	}
	if se := ofType(lines, "stderr"); len(se) != 1 || se[0]["text"] != "oops\n" {
		t.Errorf("stderr %v", se)
	}
	if errs := ofType(sh(map[string]any{"code": "false"}), "error"); len(errs) != 1 || errs[0]["value"] != "1" {
		t.Errorf("a failing cell: %v", errs)
	}
	// stdin is not the kernel's: a cell that reads it gets end of file.
	if got := stdout(sh(map[string]any{"code": "read x; echo \"read:$?\""})); got != "read:1\n" {
		t.Errorf("read from stdin: %q", got)
	}

	// A client that gives up interrupts the cell: the rest of it does not
	// run, and bash goes on with its variables, after a command or a loop
	// of bash's builtins alike.
	for _, cell := range []string{
		"echo looping; sleep 3600; v=ran-on",
		"echo looping; while :; do :; done; v=ran-on",
		"f() { sleep 3600; }; echo looping; f; sleep 3600; v=ran-on",
	} {
		interruptCell(t, ts.URL, "bash", cell)
		if got := stdout(sh(map[string]any{"code": "echo $v"})); got != "kept\n" {
			t.Errorf("after interrupting %q: %q, want bash's variable kept and the rest of the cell not run", cell, got)
		}
	}

	// A cell that ends bash: an error, and a new bash for the next.
	if errs := ofType(sh(map[string]any{"code": "exit 3"}), "error"); len(errs) != 1 {
		t.Errorf("exit: %v", errs)
	}
	if got := stdout(sh(map[string]any{"code": "echo ${v:-fresh}"})); got != "fresh\n" {
		t.Errorf("after exit: %q", got)
	}
	if _, err := s.createContext("cobol", ""); err == nil || !strings.Contains(err.Error(), "python") {
		t.Errorf("an unknown language: %v, want the ones served", err)
	}
}
