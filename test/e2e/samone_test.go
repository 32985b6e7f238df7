package e2e

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"golang.org/x/net/proxy"

	"sandstorm/api"
	"sandstorm/internal/testenv"
)

var consoleURLRE = regexp.MustCompile(`console=(https://127\.0\.0\.1:[0-9]+)/`)

// TestSamOneConsole: sam-one serve on loopback (control plane, router and
// console in one process); its data dir serves sam-control-plane's
// operator commands (token create, policy set); a sam-node joins it with
// a token and runs with --router at the address sam-one printed; a join
// with a made-up token is refused. A sandstormd takes the mesh's policy
// from that sam-node, and an agent in a real sandbox, through its
// boundary, is refused a model (by sam-node) and a name (by the
// boundary), and tries to forge a report of refusals through it. Then
// the console in headless Chromium: the login, the member connected to
// the router, the principal with its services, the policy's version,
// the control plane's refusal with its reason, and the agent's refusals
// with member, principal, target, reason and count — searchable, and
// without the forged one; the page's session cannot write (a POST
// /v1/tokens from the page is 401) and after logging out it cannot read.
// A screenshot is kept (logged).
func TestSamOneConsole(t *testing.T) {
	chromium := needChromium(t)
	dir := t.TempDir()
	one := startProc(t, "sam-one", exec.Command(samOneBin, "serve", "--data-dir", dir, "--listen", "127.0.0.1:0",
		"--router-listen", "/ip4/127.0.0.1/tcp/0"))
	var apiURL, routerAddr string
	testenv.WaitFor(t, 30*time.Second, "sam-one prints its router's address and its console", func() bool {
		routerAddr = firstLineWith(one.log, "/ip4/127.0.0.1/tcp/")
		b, _ := os.ReadFile(one.log)
		if m := consoleURLRE.FindSubmatch(b); m != nil {
			apiURL = string(m[1])
		}
		return routerAddr != "" && apiURL != ""
	})
	if !strings.Contains(routerAddr, "/p2p/12D3Koo") {
		t.Fatalf("the router's address %q has no peer ID", routerAddr)
	}
	caFile := filepath.Join(dir, "pki", "ca.pem")
	operator := func(args ...string) (string, error) {
		return runIn(t, exec.Command(samControlPlaneBin, append([]string{"--data-dir", dir, "--api", apiURL}, args...)...))
	}
	out, err := operator("token", "create", "--max-uses", "1")
	tok := tokenRE.FindString(out)
	if err != nil || tok == "" {
		t.Fatalf("token create against sam-one: %v: %s", err, out)
	}
	policyFile := writeTemp(t, "policy.yaml", `
roles:
  - {name: coder, services: ["inference://m-one", "mcp://everything/echo"], egress: ["api.github.com"]}
bindings:
  - {principal: agent-one, roles: [coder]}
`)
	if out, err := operator("policy", "set", policyFile); err != nil {
		t.Fatalf("policy set against sam-one: %v: %s", err, out)
	}
	meshDir := filepath.Join(t.TempDir(), "mesh")
	join := func(name, token string) (string, error) {
		return runIn(t, exec.Command(samNodeBin, "join", "--control-plane", apiURL, "--ca", caFile, "--name", name, "--token", token, "--mesh-dir", meshDir))
	}
	if out, err := join("node-bad", "samb_made-up"); err == nil {
		t.Fatalf("a join with a made-up token: %s", out)
	}
	if out, err := join("node-one", tok); err != nil {
		t.Fatalf("join: %v: %s", err, out)
	}
	nodeSock := filepath.Join(t.TempDir(), "n.sock")
	node := startProc(t, "sam-one-node", exec.Command(samNodeBin, "--mesh-dir", meshDir, "--router", routerAddr,
		"--p2p-listen", "/ip4/127.0.0.1/tcp/0", "--listen", "unix://"+nodeSock, "--admin-addr", ""))
	waitLog(t, node.log, "joined the mesh", 60*time.Second)

	// An agent in a real sandbox behind that sam-node, its boundary on
	// the mesh's policy.
	d := startDaemon(t, "--policy", "sam-node", "--sam-node", "unix://"+nodeSock)
	d.registerAgent(t)
	sb := d.create(t, "agent", "agent-one")
	var res agentResult
	testenv.WaitFor(t, 30*time.Second, "the boundary has the mesh's policy (the agent reaches the mesh)", func() bool {
		res = agentRun(t, sb, url.Values{})
		return len(res.Errors) == 0
	})
	agentGET(t, sb, "/run", url.Values{"denied_model": {"gpt-secret"}}, &res)
	if !strings.HasPrefix(res.DeniedModel, "403") {
		t.Fatalf("the ungranted model: %q, want a 403", res.DeniedModel)
	}
	for i := 0; i < 3; i++ {
		if p := probeFrom(t, sb, "kind", "dns", "name", "example.com"); p.OK {
			t.Fatalf("example.com resolved in the sandbox: %+v", p)
		}
	}
	// A report of refusals forged through the boundary (its host-side
	// socket): the boundary does not pass the path on, and sam-node would
	// refuse it from a boundary anyway.
	socks, err := proxy.SOCKS5("unix", sb.Boundary, nil, proxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: socks.(proxy.ContextDialer).DialContext}}
	forged := `{"rows": [{"principal": "forged-principal", "by": "boundary", "what": "dns", "target": "forged.example", "reason": "forged", "count": 99, "first": "2026-01-01T00:00:00Z", "last": "2026-01-01T00:00:00Z"}]}`
	if resp, err := hc.Post("http://mesh.sam.alt"+api.SAMRefusalsPath, "application/json", strings.NewReader(forged)); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a report through a boundary: %s, want 403", resp.Status)
	}

	br := openBrowser(t, chromium, spkiOf(t, caFile, strings.TrimPrefix(apiURL, "https://")), 1300, 900, apiURL+"/", "token")
	defer br.close()
	if n := br.status(`fetch("/v1/console").then(r => r.status)`); n != 401 {
		t.Errorf("GET /v1/console without a session: %d, want 401", n)
	}
	br.run("a wrong token", chromedp.SendKeys(chromedp.ID("token"), "not-the-token"), chromedp.Click(chromedp.CSS("#login-form button")))
	br.until("a wrong token is refused", `document.getElementById("login-error").innerText.includes("not the admin token")`)
	admin, _ := os.ReadFile(filepath.Join(dir, "admin-token"))
	br.run("log in", chromedp.SendKeys(chromedp.ID("token"), strings.TrimSpace(string(admin))), chromedp.Click(chromedp.CSS("#login-form button")))
	br.until("node-one shows connected", `(document.querySelector('[data-member="node-one"] .conn')||{}).textContent === "connected"`)
	br.until("the router shows", `!!document.querySelector('[data-member="router"]')`)
	br.until("agent-one shows with its services", `(() => {
		const r = document.querySelector('[data-principal="agent-one"]');
		return !!r && r.innerText.includes("inference://m-one") && r.innerText.includes("mcp://everything/echo") && r.innerText.includes("api.github.com") && r.innerText.includes("coder");
	})()`)
	br.until("the policy's version shows", `document.getElementById("policy").textContent.includes("policy version 1")`)
	br.until("the refused join shows with its reason", `[...document.querySelectorAll("#refusals tr")].some(r => r.innerText.includes("node-bad") && r.innerText.includes("bootstrap token unknown, spent or expired"))`)
	// The agent's refusals, from node-one: sam-node's and its boundary's.
	agentRow := func(what, target, reason string) string {
		return fmt.Sprintf(`[...document.querySelectorAll("#agent-refusals tr")].find(r => r.querySelector(".member").textContent === "node-one"
			&& r.querySelector(".principal").textContent === "agent-one" && r.querySelector(".what").textContent === %q
			&& r.querySelector(".target").textContent === %q && r.querySelector(".why").textContent === %q)`, what, target, reason)
	}
	br.until("the refused model shows (by sam-node)", agentRow("model", "gpt-secret", "not granted")+`?.querySelector(".by").textContent === "sam-node"`)
	// Three lookups, each an A and an AAAA question (Go's resolver asks both).
	br.until("the refused name shows (by the boundary) with its count", agentRow("dns", "example.com", "destination not granted")+`?.querySelector(".count").textContent === "6"`)
	br.until("the forged report's request shows as refused", agentRow("mesh-request", "POST mesh.sam.alt"+api.SAMRefusalsPath, "path not available to agents")+` !== undefined`)
	if page := br.text(`document.getElementById("agent-refusals").innerText`); strings.Contains(page, "forged") {
		t.Errorf("the forged report reached the console:\n%s", page)
	}
	// Searchable: only the rows that match stay.
	br.run("search", chromedp.SendKeys(chromedp.ID("search"), "gpt-secret"))
	br.until("only the model's refusal shows", `(() => { const rs = [...document.querySelectorAll("#agent-refusals tr")];
		return rs.length === 1 && rs[0].innerText.includes("gpt-secret") && document.querySelectorAll('[data-member="node-one"]').length === 0; })()`)
	br.run("clear the search", chromedp.Evaluate[chromedp.Void](`(() => { const s = document.getElementById("search"); s.value = ""; s.dispatchEvent(new Event("input")); })()`))
	br.until("every row is back", `document.querySelectorAll("#agent-refusals tr").length >= 3 && !!document.querySelector('[data-member="node-one"] .conn')`)
	if exp := br.text(`document.querySelector('[data-member="node-one"] .exp').textContent`); !strings.Contains(exp, "min") {
		t.Errorf("node-one's credential expiry reads %q", exp)
	}
	if strings.Contains(br.text(`document.documentElement.outerHTML`), strings.TrimSpace(string(admin))) {
		t.Error("the page holds the admin token")
	}
	if c := br.text(`document.cookie`); strings.Contains(c, "session") {
		t.Errorf("the session cookie is readable by the page's scripts: %q", c)
	}
	// The session reads; it writes nothing.
	if n := br.status(`fetch("/v1/tokens", {method: "POST", headers: {"Content-Type": "application/json"}, body: '{"max_uses": 1, "ttl_s": 60}'}).then(r => r.status)`); n != 401 {
		t.Errorf("POST /v1/tokens with the session: %d, want 401", n)
	}
	if n := br.status(`fetch("/v1/policy", {method: "PUT", body: "roles: []\nbindings: []\n"}).then(r => r.status)`); n != 401 {
		t.Errorf("PUT /v1/policy with the session: %d, want 401", n)
	}
	shot := br.screenshot()
	t.Logf("screenshot %s", shot)

	// The node stopped: it shows not connected.
	node.stop()
	br.until("node-one shows not connected", `(document.querySelector('[data-member="node-one"] .conn')||{}).textContent === "not connected"`)

	br.run("log out", chromedp.Click(chromedp.ID("logout")))
	br.until("the login shows again", `!document.getElementById("login").hidden`)
	if n := br.status(`fetch("/v1/console").then(r => r.status)`); n != 401 {
		t.Errorf("after logout: %d, want 401", n)
	}
}
