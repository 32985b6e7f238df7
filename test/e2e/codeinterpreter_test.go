package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/demo"
)

var (
	interpOnce   sync.Once
	interpDemo   demo.Demo
	interpRootfs string
	interpErr    error
)

// interpreterTemplate is the name @e2b/code-interpreter creates from when
// given none.
const interpreterTemplate = "code-interpreter-v1"

// registerCodeInterpreter registers the code-interpreter demo as the
// SDK's default template, building its rootfs once per run.
func (d *Daemon) registerCodeInterpreter(t *testing.T) {
	t.Helper()
	interpOnce.Do(func() {
		interpRootfs, interpDemo, interpErr = buildDemo("code-interpreter")
	})
	if interpErr != nil {
		t.Fatalf("build the code-interpreter demo: %v", interpErr)
	}
	if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{
		Name: interpreterTemplate, RootfsDir: interpRootfs,
		Process: api.Process{Args: interpDemo.Args, Env: interpDemo.Env, Envd: interpDemo.Envd}, Ports: interpDemo.Ports, Warm: interpDemo.Warm,
	}); err != nil {
		t.Fatalf("register %s: %v", interpreterTemplate, err)
	}
}

// TestCodeInterpreter drives E2B's code interpreter SDK as published
// (testdata/e2b-code-interpreter, pinned) against a master and node:
// a cell's output streamed, an error, a matplotlib chart (its PNG
// decoded here), a DataFrame, contexts, a timeout that interrupts the
// kernel, and a Python and a JavaScript kernel's variables that survive
// a pause and connect, an idle freeze and an idle snapshot.
func TestCodeInterpreter(t *testing.T) {
	script, err := filepath.Abs("../../testdata/e2b-code-interpreter/flows.mjs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(script), "node_modules", "@e2b", "code-interpreter")); err != nil {
		t.Fatalf("the code interpreter SDK is not installed (%v): run npm ci --prefix testdata/e2b-code-interpreter", err)
	}
	d := startDaemon(t)
	d.registerCodeInterpreter(t)
	env := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN="}
	key := strings.TrimSpace(cli(t, env, "api-key", "create", "interpreter").Stdout)

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script)
	cmd.Dir = filepath.Dir(script)
	cmd.Env = append(os.Environ(), "E2B_API_KEY="+key,
		"E2B_API_URL="+d.API+"/e2b", "E2B_SANDBOX_URL="+d.API, "E2B_DOMAIN=sandbox.localhost",
		"NODE_EXTRA_CA_CERTS="+filepath.Join(d.DataDir, "pki", "ca.pem"), "SANDSTORM_API="+d.API)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var report struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
		PNG   string `json:"png"`
		Steps []struct {
			Name  string  `json:"name"`
			OK    bool    `json:"ok"`
			Ms    float64 `json:"ms"`
			Error string  `json:"error"`
		} `json:"steps"`
	}
	if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &report); jerr != nil {
		t.Fatalf("node %s: %v (%v)\nstdout: %s\nstderr: %s", script, err, jerr, out, stderr.String())
	}
	for _, s := range report.Steps {
		t.Logf("%-60s ok=%v %7.1f ms", s.Name, s.OK, s.Ms)
		if !s.OK {
			t.Errorf("step %q: %s", s.Name, s.Error)
		}
	}
	if !report.OK {
		t.Fatalf("the code interpreter flows failed: %s\nstderr: %s", report.Error, stderr.String())
	}
	b, err := base64.StdEncoding.DecodeString(report.PNG)
	if err != nil {
		t.Fatalf("the chart's png is not base64: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("the chart's png does not decode: %v", err)
	}
	if r := img.Bounds(); r.Dx() < 100 || r.Dy() < 100 {
		t.Errorf("the chart is %v", r)
	}
}

// TestCodeInterpreterSDKSuite runs the code interpreter SDK's own tests
// (third_party/e2b-code-interpreter: E2B's src/ and tests/ at the commit
// in COMMIT, unchanged) with vitest against a master and node on real
// runsc: every test must pass, except those listed in
// testdata/codeinterpreter-exceptions.txt with why. All are run, the
// listed ones too (each fails fast here), so that one that starts to
// pass is noticed.
func TestCodeInterpreterSDKSuite(t *testing.T) {
	dir, err := filepath.Abs("../../third_party/e2b-code-interpreter")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "vitest")); err != nil {
		t.Fatalf("the code interpreter SDK's test dependencies are not installed (%v): run npm ci --prefix third_party/e2b-code-interpreter", err)
	}
	const list = "testdata/codeinterpreter-exceptions.txt"
	skip := readExceptions(t, list)
	d := startDaemon(t, "--gateway-domain", sdkDomain) // vitestEnv's
	d.registerCodeInterpreter(t)
	env := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN="}
	key := strings.TrimSpace(cli(t, env, "api-key", "create", "interpreter-sdk-tests").Stdout)

	report := filepath.Join(t.TempDir(), "report.json")
	args := []string{"vitest", "run", "--reporter=json", "--outputFile=" + report}
	if files := os.Getenv("CODEINTERPRETER_FILES"); files != "" {
		args = append(args, strings.Fields(files)...) // a part, while working on it
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npx", args...)
	cmd.Dir = dir
	cmd.Env = vitestEnv(d, key) // as for the E2B SDK's suite (TestE2BSDKSuite)
	out, runErr := cmd.CombinedOutput()
	judgeVitest(t, dir, report, skip, list, out, runErr)
}
