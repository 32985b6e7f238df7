package interpreter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/testenv"
)

// These tests drive a real ipykernel on the host (Debian's
// python3-ipykernel, with python3-numpy, python3-pandas and
// python3-matplotlib for the display formats).

// hostPython is Debian's Python, which its python3-* packages are for
// (not one a PATH may put first).
const hostPython = "/usr/bin/python3"

func newTestServer(t *testing.T) (*Server, *httptest.Server) {
	t.Helper()
	if err := exec.Command(hostPython, "-c", "import ipykernel, pandas, matplotlib").Run(); err != nil {
		testenv.Skip(t, "python3 with ipykernel, pandas and matplotlib: apt-get install python3-ipykernel python3-pandas python3-matplotlib")
	}
	s, err := New(Config{Python: hostPython, Workdir: t.TempDir(), StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, ts
}

// run posts an /execute and returns its lines, keepalives left out.
func run(t *testing.T, ctx context.Context, url string, body map[string]any, hdr ...string) []map[string]any {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/execute", bytes.NewReader(b))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("/execute: %s", res.Status)
	}
	var out []map[string]any
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if m["type"] != "keepalive" {
			out = append(out, m)
		}
	}
	return out
}

func ofType(lines []map[string]any, typ string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		if l["type"] == typ {
			out = append(out, l)
		}
	}
	return out
}

func mainText(t *testing.T, lines []map[string]any) string {
	t.Helper()
	for _, r := range ofType(lines, "result") {
		if r["is_main_result"] == true {
			s, _ := r["text"].(string)
			return s
		}
	}
	t.Fatalf("no main result in %v", lines)
	return ""
}

func TestExecuteOutputs(t *testing.T) {
	_, ts := newTestServer(t)
	ctx := context.Background()

	lines := run(t, ctx, ts.URL, map[string]any{"code": "import sys\nprint('out')\nprint('err', file=sys.stderr)\nx = 41\nx + 1"})
	if got := mainText(t, lines); got != "42" {
		t.Errorf("text %q, want 42", got)
	}
	if so := ofType(lines, "stdout"); len(so) != 1 || so[0]["text"] != "out\n" {
		t.Errorf("stdout %v", so)
	}
	if se := ofType(lines, "stderr"); len(se) != 1 || se[0]["text"] != "err\n" {
		t.Errorf("stderr %v", se)
	}
	if n := ofType(lines, "number_of_executions"); len(n) != 1 || n[0]["execution_count"] != float64(1) {
		t.Errorf("number_of_executions %v", n)
	}

	if got := mainText(t, run(t, ctx, ts.URL, map[string]any{"code": "x"})); got != "41" {
		t.Errorf("x in the next call: %q, want 41 (variables kept)", got)
	}
	if got := mainText(t, run(t, ctx, ts.URL, map[string]any{"code": "'hello'"})); got != "hello" {
		t.Errorf("a string's text %q, want hello without quotes", got)
	}

	errs := ofType(run(t, ctx, ts.URL, map[string]any{"code": "1/0"}), "error")
	if len(errs) != 1 || errs[0]["name"] != "ZeroDivisionError" || errs[0]["value"] != "division by zero" ||
		!strings.Contains(errs[0]["traceback"].(string), "1/0") {
		t.Errorf("errors %v, want one ZeroDivisionError with its traceback", errs)
	}

	// Code that ends the kernel's process: the call says so, and the
	// next one runs in a new kernel (its variables gone), as Jupyter
	// restarts a dead kernel.
	if errs := ofType(run(t, ctx, ts.URL, map[string]any{"code": "import os; os._exit(3)"}), "error"); len(errs) != 1 {
		t.Errorf("a kernel that exits: %v, want an error", errs)
	}
	if got := mainText(t, run(t, ctx, ts.URL, map[string]any{"code": "'x' in globals()"})); got != "False" {
		t.Errorf("after the kernel exited: %q, want a new kernel", got)
	}
}

func TestExecuteFormats(t *testing.T) {
	_, ts := newTestServer(t)
	ctx := context.Background()

	lines := run(t, ctx, ts.URL, map[string]any{"code": "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})"})
	r := ofType(lines, "result")
	if len(r) != 1 || r[0]["html"] == nil {
		t.Fatalf("DataFrame: %v, want one result with html", lines)
	}
	if d, _ := json.Marshal(r[0]["data"]); string(d) != `{"a":[1,2],"b":["x","y"]}` {
		t.Errorf("DataFrame data %s", d)
	}

	lines = run(t, ctx, ts.URL, map[string]any{"code": "{'k': [1, 2]}"})
	if j, _ := json.Marshal(ofType(lines, "result")[0]["json"]); string(j) != `{"k":[1,2]}` {
		t.Errorf("dict json %s", j)
	}

	lines = run(t, ctx, ts.URL, map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()"})
	r = ofType(lines, "result")
	if len(r) != 1 || r[0]["is_main_result"] != false {
		t.Fatalf("chart: %v, want one displayed result", lines)
	}
	b, err := base64.StdEncoding.DecodeString(r[0]["png"].(string))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("chart png: %v", err)
	}
	if img.Bounds().Dx() < 100 {
		t.Errorf("chart of %v", img.Bounds())
	}
}

func TestContextsEnvAndInterrupt(t *testing.T) {
	s, ts := newTestServer(t)
	ctx := context.Background()
	run(t, ctx, ts.URL, map[string]any{"code": "v = 'default'"})
	c, err := s.createContext("python", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var listed []codeContext
	res, err := http.Get(ts.URL + "/contexts")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(res.Body).Decode(&listed)
	res.Body.Close()
	if len(listed) != 3 || listed[2].ID != c.ID || listed[0].Language != "python" || listed[1].Language != "javascript" {
		t.Errorf("contexts %+v, want the defaults (Python, JavaScript) then %s, the newest last", listed, c.ID)
	}
	lines := run(t, ctx, ts.URL, map[string]any{"code": "import os\nprint(os.getcwd())\n'v' in globals()", "context_id": c.ID})
	if got := mainText(t, lines); got != "False" {
		t.Errorf("a new context sees the default's variable: %q", got)
	}
	if so := ofType(lines, "stdout"); len(so) != 1 || so[0]["text"] != c.Cwd+"\n" {
		t.Errorf("cwd %v, want %s", so, c.Cwd)
	}

	env := api.EncodeEnv(map[string]string{"GLOBAL": "g", "FOO": "global"})
	code := map[string]any{"code": "import os\n(os.getenv('FOO'), os.getenv('GLOBAL'))", "env_vars": map[string]string{"FOO": "call"}}
	if got := mainText(t, run(t, ctx, ts.URL, code, api.EnvdEnvHeader, env)); got != "('call', 'g')" {
		t.Errorf("with a per-call FOO: %s", got)
	}
	code = map[string]any{"code": "import os\n(os.getenv('FOO'), os.getenv('GLOBAL'))"}
	if got := mainText(t, run(t, ctx, ts.URL, code, api.EnvdEnvHeader, env)); got != "('global', 'g')" {
		t.Errorf("after it: %s, want the sandbox's FOO back", got)
	}

	// A client that gives up: the kernel is interrupted, and the next
	// call runs at once, not after the sleep.
	interruptCell(t, ts.URL, "", "import time\nprint('looping', flush=True)\ntime.sleep(3600)")
	if got := mainText(t, run(t, ctx, ts.URL, map[string]any{"code": "1 + 1"})); got != "2" {
		t.Errorf("after an interrupted call: %q", got)
	}

	if err := s.restart(c.ID); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, ts.URL, map[string]any{"code": "w = 1", "context_id": c.ID})
	if err := s.restart(c.ID); err != nil {
		t.Fatal(err)
	}
	if got := mainText(t, run(t, ctx, ts.URL, map[string]any{"code": "'w' in globals()", "context_id": c.ID})); got != "False" {
		t.Errorf("a variable survived a restart: %q", got)
	}
}

// A reseed gives the kernels' generators new seeds: a sandbox restored
// from a warm image does not draw what every other one draws.
func TestReseed(t *testing.T) {
	s, ts := newTestServer(t)
	ctx := context.Background()
	const first = "import random\nrandom.seed(1)\nrandom.random()"
	want := mainText(t, run(t, ctx, ts.URL, map[string]any{"code": first}))
	run(t, ctx, ts.URL, map[string]any{"code": "random.seed(1)"})
	if err := s.Reseed(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mainText(t, run(t, ctx, ts.URL, map[string]any{"code": "random.random()"})); got == want {
		t.Errorf("after a reseed the generator draws %s, as seeded before it", got)
	}
	res, err := http.Post(ts.URL+"/reseed", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent {
		t.Errorf("POST /reseed from loopback: %s", res.Status)
	}
}

// A server listens before its kernel runs: /health says 503 until the
// default kernel answers, and an execution sent meanwhile waits for it.
func TestServesBeforeReady(t *testing.T) {
	newTestServer(t) // the skip, when the host has no ipykernel
	s, err := Prepare(Config{Python: hostPython, Workdir: t.TempDir(), StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	health := func() int {
		res, err := http.Get(ts.URL + "/health")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if st := health(); st != http.StatusServiceUnavailable {
		t.Errorf("/health before the kernel: %d, want 503", st)
	}
	text := make(chan string, 1)
	go func() {
		b, _ := json.Marshal(map[string]any{"code": "1 + 2"})
		res, err := http.Post(ts.URL+"/execute", "application/json", bytes.NewReader(b))
		if err != nil {
			text <- err.Error()
			return
		}
		defer res.Body.Close()
		var last map[string]any
		dec := json.NewDecoder(res.Body)
		for dec.Decode(&last) == nil && last["type"] != "result" {
		}
		s, _ := last["text"].(string)
		text <- s
	}()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if got := testenv.Within(t, text, time.Minute, "the execution sent before the kernel ran"); got != "3" {
		t.Errorf("it answered %q, want 3", got)
	}
	if st := health(); st != http.StatusOK {
		t.Errorf("/health after: %d, want 200", st)
	}
}
