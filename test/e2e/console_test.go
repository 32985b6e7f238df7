package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"sandstorm/api"
	"sandstorm/internal/client"
	"sandstorm/internal/testenv"
)

// TestConsoleInChromium: the console at / in a real browser (Debian's
// chromium, headless, driven by chromedp), against a running daemon, as a
// person uses it: the page asks for the token, logs in (after which
// neither the page nor its scripts hold the token or the session), shows
// the node's headroom and tier counts and every sandbox; a freeze made
// through the API shows in the sandbox's row without a reload, and a wake
// appears among the recent wakes with its latency; the search narrows the
// table; thousands of rows put only a screenful in the page; a node paired
// while the page is open shows, and its sandbox's freeze and wake show
// live, as that node reports them; the chart of transitions is drawn from
// the nodes' own counters, each bar's worth equal to what their
// --metrics-addr scrapes say. A screenshot is kept (the path is logged).
func TestConsoleInChromium(t *testing.T) {
	chromium := needChromium(t)
	// A reserve of 1 GiB, so that the node paired later, with none, has
	// the most headroom and takes the next sandbox.
	maddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	d := startDaemon(t, "--memory-reserve", "1024", "--metrics-addr", maddr)
	d.registerWeb(t, "web")
	var sbs []api.Sandbox
	for i := 0; i < 3; i++ {
		sbs = append(sbs, d.create(t, "web", fmt.Sprintf("console-%d", i)))
	}
	// One with labels (a create's labels, the E2B API's metadata), which
	// its row shows and the search finds.
	labelled, err := d.C.CreateSandbox(ctxT(t), api.SandboxRequest{Template: "web", Name: "console-labelled", Labels: map[string]string{"app": "billing"}})
	if err != nil {
		t.Fatal(err)
	}
	d.track(labelled.ID)
	sbs = append(sbs, labelled)

	br := openBrowser(t, chromium, spkiOf(t, client.CAFile(d.DataDir), strings.TrimPrefix(d.API, "https://")), 1400, 1000, d.API+"/", "token")
	defer br.close()
	if !strings.Contains(br.text(`document.getElementById("login").innerText`), "pki/api-token") {
		t.Errorf("the login does not say where the token is")
	}
	br.run("a wrong token", chromedp.SendKeys(chromedp.ID("token"), "not-the-token"), chromedp.Click(chromedp.CSS("#login-form button")))
	br.until("a wrong token is refused", `document.getElementById("login-error").innerText.includes("not the API token")`)
	br.run("log in", chromedp.SendKeys(chromedp.ID("token"), d.Token), chromedp.Click(chromedp.CSS("#login-form button")))
	br.until("the sandboxes show", `document.querySelectorAll("#rows .row").length === 4`)
	for _, sb := range sbs {
		br.until(sb.Name+" is hot", fmt.Sprintf(`(document.querySelector('[data-id=%q] .tier')||{}).textContent === "hot"`, sb.ID))
	}
	nodes := br.text(`document.getElementById("nodes").innerText`)
	if !strings.Contains(nodes, "local") || !strings.Contains(nodes, "headroom") || !strings.Contains(nodes, "hot 4") {
		t.Errorf("the node card says %q; want its name, headroom and 4 hot", nodes)
	}
	if strings.Contains(br.text(`document.documentElement.outerHTML`), d.Token) {
		t.Error("the page holds the API token")
	}
	if c := br.text(`document.cookie`); strings.Contains(c, "sandstorm_session") {
		t.Errorf("the session cookie is readable by the page's scripts: %q", c)
	}
	br.until("the event stream is live", `document.getElementById("status").textContent === "live"`)

	// A sandbox's egress, followed: a click on its row shows its log, and
	// a flow its boundary refuses after that shows without a reload.
	talker := sbs[0]
	br.run("open its egress", chromedp.Click(chromedp.CSS(fmt.Sprintf("[data-id=%q]", talker.ID))))
	br.until("its egress view shows", fmt.Sprintf(`!document.getElementById("egress").hidden && document.getElementById("egress-name").textContent === %q`, talker.Name))
	env := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN="}
	// CONNECT through its boundary (the proxy on its resolver's address)
	// to a name no policy grants it: refused, 403.
	cli(t, env, "sandbox", "exec", talker.Name, "--", "/usr/bin/python3", "-c", `import socket
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
s = socket.create_connection((ns, 1080), 5)
s.sendall(b"CONNECT denied.test:80 HTTP/1.1\r\nHost: denied.test:80\r\n\r\n")
print(s.recv(200).decode().split("\r\n")[0])`).ok(t, "a CONNECT to a name not granted", " 403 ")
	br.until("the refused flow shows", `/denied denied\.test:80 — /.test(document.getElementById("egress-list").innerText)`)
	// A sandbox that leaves its node ends its log there, and the view
	// says so (a stream merely cut, by a reload, is asked again).
	gone := d.create(t, "web", "console-gone")
	br.until("console-gone is listed", `[...state.boxes.values()].some(b => b.name === "console-gone")`)
	br.run("follow a sandbox's egress", chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`showEgress(%q)`, gone.ID)))
	br.until("its egress view shows", `document.getElementById("egress-name").textContent === "console-gone"`)
	if err := d.C.DeleteSandbox(ctxT(t), gone.ID); err != nil {
		t.Fatal(err)
	}
	br.until("the view says the sandbox left", `document.getElementById("egress-list").innerText.includes("has left its node")`)

	// Live: a freeze made elsewhere shows without a reload; a request to
	// the sandbox wakes it, and the wake is listed with its latency.
	frozen := sbs[1]
	if _, err := d.C.Transition(ctxT(t), frozen.ID, "freeze"); err != nil {
		t.Fatal(err)
	}
	br.until(frozen.Name+" shows frozen", fmt.Sprintf(`document.querySelector('[data-id=%q] .tier').textContent === "frozen"`, frozen.ID))
	getCount(t, endpoint(t, frozen))
	br.until("the wake is listed", fmt.Sprintf(`/woke %s from frozen in [0-9.]+ ms/.test(document.getElementById("recent").innerText)`, frozen.Name))
	br.until(frozen.Name+" shows hot again", fmt.Sprintf(`document.querySelector('[data-id=%q] .tier').textContent === "hot"`, frozen.ID))

	// A fleet: a node paired now (in a network namespace of its own)
	// shows with its headroom; a sandbox placed on it shows, and what
	// happens on it — reported by the node to the master — shows live.
	farMetrics := "10.188.7.2:9600"
	far := fleetMachine(t, 7, "--memory-reserve", "0", "--metrics-addr", farMetrics)
	if r := d.raw(t, "POST", "/v1/nodes", d.Token, "application/json", strings.NewReader(fmt.Sprintf(`{"address": %q, "pairing_code": %q}`, far.listen, far.code()))); r.Status != http.StatusCreated {
		t.Fatalf("pair %s: HTTP %d %s", far.name, r.Status, r.Body)
	}
	br.until("the paired node shows", fmt.Sprintf(`document.getElementById("nodes").innerText.includes(%q)`, far.name))
	remote := d.create(t, "web", "console-far")
	// Registered after the node's own cleanup, so run before it: the
	// master lets go of the node while its namespace is still there (it
	// would otherwise go on dialling an address no longer on this
	// machine).
	t.Cleanup(func() {
		d.C.Do(context.Background(), "DELETE", "/v1/sandboxes/"+remote.ID, nil, nil)
		if r := d.raw(t, "DELETE", "/v1/nodes/"+far.name, d.Token, "", nil); r.Status != http.StatusNoContent {
			t.Errorf("forget %s: HTTP %d %s", far.name, r.Status, r.Body)
		}
	})
	if remote.Node != far.name {
		t.Fatalf("console-far went to %s; %s has the most headroom", remote.Node, far.name)
	}
	br.until("the paired node's sandbox shows", fmt.Sprintf(`(document.querySelector('[data-id=%q] .tier')||{}).textContent === "hot"`, remote.ID))
	if _, err := d.C.Transition(ctxT(t), remote.ID, "freeze"); err != nil {
		t.Fatal(err)
	}
	br.until("console-far shows frozen", fmt.Sprintf(`document.querySelector('[data-id=%q] .tier').textContent === "frozen"`, remote.ID))
	getCount(t, endpoint(t, remote))
	br.until("its wake on its node is listed", `/woke console-far from frozen in [0-9.]+ ms/.test(document.getElementById("recent").innerText)`)

	// The chart has the freeze and the wake: a bar of each colour.
	br.until("the chart shows the freeze and the wake", `(() => {
		const c = document.getElementById("chart"), g = c.getContext("2d");
		const d = g.getImageData(0, 0, c.width, c.height - 12).data; // above the baseline
		const want = {"frozen": [0x1c, 0x7e, 0xd6], "hot": [0xd9, 0x48, 0x0f]}, seen = {};
		for (let i = 0; i < d.length; i += 4)
			for (const [k, [r, gr, b]] of Object.entries(want))
				if (Math.abs(d[i]-r) < 8 && Math.abs(d[i+1]-gr) < 8 && Math.abs(d[i+2]-b) < 8 && d[i+3] > 200) seen[k] = true;
		return seen.frozen && seen.hot;
	})()`)
	// And what it charts is what the counters say: both nodes' successful
	// transitions into each tier since the page opened (when neither had
	// made one), as their own metrics listeners count them.
	counted := func() map[string]int {
		out := map[string]int{}
		for _, tier := range []string{"hot", "frozen", "snapshot", "detached"} {
			for _, addr := range []string{maddr, farMetrics} {
				out[tier] += int(scrapeMetrics(t, addr).must(t, "sandstorm_transitions_total", "to", tier, "outcome", "ok"))
			}
		}
		return out
	}
	var perTier, charted map[string]int
	testenv.WaitFor(t, 20*time.Second, "the chart's totals to be the nodes' counters", func() bool {
		perTier = counted()
		var err error
		charted, err = chromedp.Run(br.ctx, chromedp.Evaluate[map[string]int](`({hot: 0, frozen: 0, snapshot: 0, detached: 0, ...state.charted})`))
		if err != nil {
			t.Fatalf("read the chart's totals: %v", err)
		}
		for k, v := range perTier {
			if charted[k] != v {
				return false
			}
		}
		return true
	})
	if perTier["frozen"] < 2 || perTier["hot"] < 2 {
		t.Errorf("the nodes counted %v; the test made two freezes and two wakes", perTier)
	}
	t.Logf("charted %v, counted %v", charted, perTier)

	// Search narrows the table, by name and by label.
	br.run("search by label", chromedp.SendKeys(chromedp.ID("search"), "app=billing"))
	br.until("the labelled row is left, its label shown", `document.querySelectorAll("#rows .row").length === 1 && document.querySelector("#rows .row .name").textContent === "console-labelled" && document.querySelector("#rows .row").innerText.includes("app=billing")`)
	br.run("clear the search", chromedp.Evaluate[chromedp.Void](`document.getElementById("search").value = ""; render()`))
	br.run("search", chromedp.SendKeys(chromedp.ID("search"), "console-2"))
	br.until("one row is left", `document.querySelectorAll("#rows .row").length === 1 && document.querySelector("#rows .row .name").textContent === "console-2"`)
	shot := br.screenshot()

	// Thousands of rows: 5,000 made-up sandboxes put in the page's model
	// cost a screenful of elements, and a redraw stays quick.
	type rowStats struct {
		Rows int     `json:"rows"`
		Ms   float64 `json:"ms"`
		Text string  `json:"text"`
	}
	stats, err := chromedp.Run(br.ctx, chromedp.Evaluate[rowStats](`(() => {
		document.getElementById("search").value = "";
		for (let i = 0; i < 5000; i++) state.boxes.set("fake" + i, {id: "fake" + i, name: "fake-" + String(i).padStart(4, "0"), tier: "snapshot", template: "web", node: "local"});
		const t0 = performance.now(); render(); const ms = performance.now() - t0;
		const vp = document.getElementById("viewport"); vp.scrollTop = 2500 * 28; vp.dispatchEvent(new Event("scroll"));
		return {rows: document.querySelectorAll("#rows .row").length, ms, text: document.getElementById("rows").innerText};
	})()`))
	if err != nil {
		t.Fatalf("5,000 rows: %v", err)
	}
	if stats.Rows > 60 || stats.Rows < 10 {
		t.Errorf("with 5,003 sandboxes the table has %d rows in the page; want a screenful", stats.Rows)
	}
	if !strings.Contains(stats.Text, "fake-24") {
		t.Errorf("scrolled half-way, the rows shown are not those there: %.200q", stats.Text)
	}
	t.Logf("5,003 sandboxes: %d rows in the page, a full render took %.1f ms; screenshot %s", stats.Rows, stats.Ms, shot)

	// Logging out ends the session: the API refuses the cookie after it.
	br.run("log out", chromedp.Click(chromedp.ID("logout")))
	br.until("the login shows again", `!document.getElementById("login").hidden`)
	if status := br.status(`fetch("/v1/sandboxes").then(r => r.status)`); status != 401 {
		t.Errorf("after logout the API answered the page %d, want 401", status)
	}
}
