package interpreter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/testenv"
)

// The JavaScript and TypeScript kernel (jskernel.py over jsrunner.js),
// run for real: the host's Node.js with Debian's node-typescript.
func TestJSKernel(t *testing.T) {
	s, ts := newTestServer(t)
	if err := exec.Command("node", "-e", `require("/usr/share/nodejs/typescript")`).Run(); err != nil {
		testenv.Skip(t, "Node.js with TypeScript: apt-get install nodejs node-typescript")
	}
	ctx := context.Background()
	js := func(lang string, body map[string]any, hdr ...string) []map[string]any {
		body["language"] = lang
		return run(t, ctx, ts.URL, body, hdr...)
	}
	text := func(lines []map[string]any) string {
		r := ofType(lines, "result")
		if len(r) != 1 {
			t.Errorf("want one result in %v", lines)
			return ""
		}
		s, _ := r[0]["text"].(string)
		return s
	}
	stdout := func(lines []map[string]any) string {
		var b strings.Builder
		for _, l := range ofType(lines, "stdout") {
			b.WriteString(l["text"].(string))
		}
		return b.String()
	}

	// E2B's default contexts: Python and JavaScript, whose kernel waits
	// for its first execution.
	var langs []string
	for _, c := range s.list() {
		langs = append(langs, c.Language)
		if started := c.current() != nil; started != (c.Language == "python") {
			t.Errorf("default %s context: kernel started %v", c.Language, started)
		}
	}
	if strings.Join(langs, ",") != "python,javascript" {
		t.Errorf("default contexts: %v", langs)
	}

	// The SDK's own cases (defaultKernels.test.ts): output, ESM imports,
	// top-level await, a value's text without quotes, types stripped.
	if got := stdout(js("js", map[string]any{"code": `console.log("Hello World!")`})); got != "Hello World!\n" {
		t.Errorf("console.log: %q", got)
	}
	if got := stdout(js("js", map[string]any{"code": "import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)"})); got != "function\n" {
		t.Errorf("an ESM import: %q", got)
	}
	if got := text(js("js", map[string]any{"code": "await Promise.resolve('Hello World!')"})); got != "Hello World!" {
		t.Errorf("top-level await: %q", got)
	}
	if got := stdout(js("ts", map[string]any{"code": `const message: string = "Hello World!"; console.log(message)`})); got != "Hello World!\n" {
		t.Errorf("TypeScript: %q", got)
	}

	// What a cell declares is there for the next, and may be declared
	// again; so are imports and functions; a value is util.inspect's.
	js("js", map[string]any{"code": "const q = 20; let [a, {b}] = [1, {b: 2}]; function twice(x) { return 2 * x }\nclass P { constructor() { this.n = 1 } }"})
	if got := text(js("js", map[string]any{"code": "const q2 = twice(q) + a + b\nq2"})); got != "43" {
		t.Errorf("declarations kept: %q", got)
	}
	js("js", map[string]any{"code": "const q = 1; import * as path from 'path'"})
	if got := text(js("js", map[string]any{"code": "({q, base: path.basename('/x/y'), p: new P()})"})); got != "{ q: 1, base: 'y', p: P { n: 1 } }" {
		t.Errorf("declared again, imported: %q", got)
	}
	// TypeScript's own declarations, and exports (a cell is no module).
	js("ts", map[string]any{"code": "enum Color { Red = 1 }\nexport abstract class Shape { abstract area(): number }\nexport async function later(): Promise<number> { return 5 }"})
	if got := text(js("ts", map[string]any{"code": "class Sq extends Shape { area() { return 4 } }\n[Color.Red, new Sq().area(), await later()] as number[]"})); got != "[ 1, 4, 5 ]" {
		t.Errorf("enum, abstract class, async function: %q", got)
	}
	if lines := js("js", map[string]any{"code": "let nothing"}); len(ofType(lines, "result")) != 0 {
		t.Errorf("a declaration has no value: %v", lines)
	}

	// Errors: thrown, a syntax error, a rejected promise; the kernel goes on.
	errs := ofType(js("js", map[string]any{"code": "throw new TypeError('boom')"}), "error")
	if len(errs) != 1 || errs[0]["name"] != "TypeError" || errs[0]["value"] != "boom" || !strings.Contains(errs[0]["traceback"].(string), "boom") {
		t.Errorf("a throw: %v", errs)
	}
	if errs := ofType(js("js", map[string]any{"code": "let = = 1"}), "error"); len(errs) != 1 || errs[0]["name"] != "SyntaxError" {
		t.Errorf("a syntax error: %v", errs)
	}
	if errs := ofType(js("js", map[string]any{"code": "await Promise.reject(new RangeError('later'))"}), "error"); len(errs) != 1 || errs[0]["name"] != "RangeError" {
		t.Errorf("a rejection: %v", errs)
	}
	if got := text(js("js", map[string]any{"code": "q"})); got != "1" {
		t.Errorf("after errors: %q", got)
	}

	// envs, per sandbox and per call (env_vars/js.test.ts), and cwd.
	env := api.EncodeEnv(map[string]string{"TEST_ENV_VAR": "supertest"})
	odd := "a'b\"c\u2028${x}`"
	if got := stdout(js("js", map[string]any{"code": "console.log(process.env.TEST_ENV_VAR + '|' + process.env.ODD)",
		"env_vars": map[string]string{"TEST_ENV_VAR": "overwrite", "ODD": odd}}, api.EnvdEnvHeader, env)); got != "overwrite|"+odd+"\n" {
		t.Errorf("per-call variables: %q", got)
	}
	if got := text(js("js", map[string]any{"code": "process.env.TEST_ENV_VAR + '|' + (process.env.ODD || 'default')"}, api.EnvdEnvHeader, env)); got != "supertest|default" {
		t.Errorf("after the call: %q", got)
	}
	if got := text(js("ts", map[string]any{"code": "process.cwd()"})); got != s.cfg.Workdir {
		t.Errorf("cwd: %q, want %q", got, s.cfg.Workdir)
	}

	jsModules(t, s.cfg.Workdir, js, text)

	// A client that gives up interrupts the cell, a busy loop too; the
	// kernel's variables are kept.
	for _, code := range []string{"console.log('looping'); while (true) {}", "console.log('looping'); await new Promise(() => {})"} {
		interruptCell(t, ts.URL, "js", code)
		if got := text(js("js", map[string]any{"code": "q"})); got != "1" {
			t.Errorf("after interrupting %q: %q, want the variable kept", code, got)
		}
	}

	// A cell that ends Node.js: an error, and a fresh one for the next.
	if errs := ofType(js("js", map[string]any{"code": "process.exit(3)"}), "error"); len(errs) != 1 {
		t.Errorf("exit: %v", errs)
	}
	if got := text(js("js", map[string]any{"code": "typeof q"})); got != "undefined" {
		t.Errorf("after exit: %q", got)
	}
}

// jsModules: a package published as ESM only (its exports have only an
// "import" condition, which require() cannot load) is imported by a
// declaration and by import(), from the working directory's
// node_modules; import() of a relative path and of a built-in; in
// TypeScript too; a module that is not there is an error, and the
// kernel goes on.
func jsModules(t *testing.T, dir string, js func(string, map[string]any, ...string) []map[string]any, text func([]map[string]any) string) {
	t.Helper()
	pkg := filepath.Join(dir, "node_modules", "esm-only")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		filepath.Join(pkg, "package.json"): `{"name": "esm-only", "type": "module", "exports": {".": {"import": "./index.js"}}}`,
		filepath.Join(pkg, "index.js"):     "export default 'hello'; export const shout = (s) => s.toUpperCase() + '!';",
		filepath.Join(dir, "local.mjs"):    "export const where = 'cwd';",
	} {
		if err := os.WriteFile(name, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ lang, code, want string }{
		{"js", "import greeting, { shout } from 'esm-only'\nshout(greeting)", "HELLO!"},
		{"js", "import * as esm from 'esm-only'\nesm.default + ' ' + typeof esm.shout", "hello function"},
		{"js", "const m = await import('esm-only'); m.shout('dynamic')", "DYNAMIC!"},
		{"js", "(await import('./local.mjs')).where + ' ' + (await import('node:path')).basename('/a/b')", "cwd b"},
		{"ts", "const n: string = (await import('esm-only')).default; n.length", "5"},
		{"js", "greeting", "hello"},
	} {
		if got := text(js(c.lang, map[string]any{"code": c.code})); got != c.want {
			t.Errorf("%s %q: %q, want %q", c.lang, c.code, got, c.want)
		}
	}
	errs := ofType(js("js", map[string]any{"code": "await import('not-installed')"}), "error")
	if len(errs) != 1 || !strings.Contains(errs[0]["value"].(string), "not-installed") {
		t.Errorf("import() of a missing package: %v", errs)
	}
	if got := text(js("js", map[string]any{"code": "shout('still')"})); got != "STILL!" {
		t.Errorf("after the error: %q", got)
	}
}

// The Java kernel (javakernel.py over JavaRunner.java): JShell in the
// host's JDK, run for real. The SDK's own Java cases (env_vars/java.test.ts,
// cwd.test.ts) read envs as system properties, as E2B's kernel keeps them.
func TestJavaKernel(t *testing.T) {
	s, ts := newTestServer(t)
	if err := exec.Command("java", "--add-modules", "jdk.jshell", "-version").Run(); err != nil {
		testenv.Skip(t, "a JDK with JShell: apt-get install openjdk-17-jdk-headless")
	}
	ctx := context.Background()
	java := func(body map[string]any, hdr ...string) []map[string]any {
		body["language"] = "java"
		return run(t, ctx, ts.URL, body, hdr...)
	}
	env := api.EncodeEnv(map[string]string{"TEST_ENV_VAR": "supertest"})
	if got := firstText(t, java(map[string]any{"code": `System.getProperty("TEST_ENV_VAR")`}, api.EnvdEnvHeader, env)); got != "supertest" {
		t.Errorf("the sandbox's variable: %q", got)
	}
	odd := "a\"b\\user\u2028<&>"
	lines := java(map[string]any{"code": `System.out.println(System.getProperty("TEST_ENV_VAR") + "|" + System.getProperty("ODD"))`,
		"env_vars": map[string]string{"TEST_ENV_VAR": "overwrite", "ODD": odd}}, api.EnvdEnvHeader, env)
	if so := ofType(lines, "stdout"); len(so) != 1 || so[0]["text"] != "overwrite|"+odd+"\n" {
		t.Errorf("per-call variables: %v", lines)
	}
	if got := firstText(t, java(map[string]any{"code": `System.getProperty("TEST_ENV_VAR") + "|" + System.getProperty("ODD", "default")`},
		api.EnvdEnvHeader, env)); got != "supertest|default" {
		t.Errorf("after the call: %q", got)
	}
	if got := firstText(t, java(map[string]any{"code": `System.getProperty("user.dir")`})); got != s.cfg.Workdir {
		t.Errorf("user.dir: %q, want %q", got, s.cfg.Workdir)
	}
	// Declarations last; several snippets in a cell; the last one's value.
	java(map[string]any{"code": "int x = 41;\nint twice(int v) { return 2 * v; }"})
	if got := firstText(t, java(map[string]any{"code": "int y = x + 1;\ntwice(y)"})); got != "84" {
		t.Errorf("twice(y): %q", got)
	}
	if lines := java(map[string]any{"code": "int z = 1;"}); len(ofType(lines, "result")) != 0 {
		t.Errorf("a declaration has no value: %v", lines)
	}
	errs := ofType(java(map[string]any{"code": `throw new IllegalStateException("boom")`}), "error")
	if len(errs) != 1 || errs[0]["name"] != "IllegalStateException" || errs[0]["value"] != "boom" {
		t.Errorf("a throw: %v", errs)
	}
	if errs := ofType(java(map[string]any{"code": "int q = \"text\";"}), "error"); len(errs) != 1 || errs[0]["name"] != "CompilationException" {
		t.Errorf("a compile error: %v", errs)
	}
	if got := firstText(t, java(map[string]any{"code": "x"})); got != "41" {
		t.Errorf("after errors: %q", got)
	}
	interruptCell(t, ts.URL, "java", `System.out.println("looping"); while (true) {}`)
	if got := firstText(t, java(map[string]any{"code": "x"})); got != "41" {
		t.Errorf("after an interrupt: %q, want the variable kept", got)
	}
}

// interruptCell runs code in lang ("" the default), which prints
// "looping" and then never ends, and gives up on it once it has printed: the server interrupts the
// kernel, and the call returns once the cell has ended.
func interruptCell(t *testing.T, url, lang, code string) {
	t.Helper()
	short, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	go func() {
		b, _ := json.Marshal(map[string]any{"code": code, "language": lang})
		req, _ := http.NewRequestWithContext(short, "POST", url+"/execute", bytes.NewReader(b))
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			// Its "looping" line: the cell began (a keepalive may come
			// first when the kernel is slow to take the cell up).
			br := bufio.NewReader(res.Body)
			for {
				line, err := br.ReadString('\n')
				if err != nil || strings.Contains(line, "looping") {
					break
				}
			}
			close(started)
			<-short.Done()
			res.Body.Close()
		}
	}()
	testenv.Within(t, started, time.Minute, "the cell to start")
	cancel()
}
