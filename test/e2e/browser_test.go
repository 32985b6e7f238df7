package e2e

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// needChromium is the path of Debian's chromium; the test fails without it.
func needChromium(t *testing.T) string {
	t.Helper()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("no chromium: apt-get install -y chromium (deps/debian-packages.txt has it)")
	}
	return chromium
}

// browser is a headless chromium driven by chromedp, for the consoles'
// tests, with a page that fails the test when it cannot do what it is
// told, saying what the page showed and what chromium printed.
type browser struct {
	t *testing.T
	// ctx is the browser's own: it lives at most browserLife, and each
	// step runs under a deadline of its own below it (cancelling a
	// step's context ends the step, not the browser: chromedp's
	// documented pattern, the browser belongs to the first Run's context).
	ctx   context.Context
	log   string // chromium's stdout and stderr
	close func()
}

const (
	browserLife = 5 * time.Minute
	stepLimit   = time.Minute
)

// openBrowser starts chromium with a window of width × height and opens
// url, until the element with the ID visible shows. The consoles'
// certificates are from CAs of their own, which the browser does not
// have: it accepts exactly the key spki (from spkiOf, which checks it
// against the CA first), nothing else.
//
// A browser that has not shown the page within a minute is closed and
// another started, once, with what the first showed and printed in the
// test's log: CI once saw a first navigation to a console on loopback
// never load while the console answered (TestSamOneConsole, 12-07), and
// a browser's hiccup is not what these tests judge. The console failing
// twice fails the test. close ends the browser.
func openBrowser(t *testing.T, chromium, spki string, width, height int, url, visible string) *browser {
	t.Helper()
	for attempt := 1; ; attempt++ {
		br := startBrowser(t, chromium, spki, width, height)
		err := br.do(stepLimit, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.ID(visible)))
		if err == nil {
			return br
		}
		seen := br.diagnose()
		br.close()
		if attempt == 2 {
			t.Fatalf("open %s: %v (twice, each in a browser of its own)\n%s", url, err, seen)
		}
		t.Logf("open %s: %v; starting another browser. The first:\n%s", url, err, seen)
	}
}

// startBrowser starts chromium, failing the test if it does not.
func startBrowser(t *testing.T, chromium, spki string, width, height int) *browser {
	t.Helper()
	dir := t.TempDir()
	logPath := filepath.Join(dir, "chromium.log")
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.Flag("ignore-certificate-errors-spki-list", spki),
		chromedp.NoSandbox, // the tests run as root
		// A profile the test owns, removed with it (chromedp's own default
		// is left in the temp directory when the browser is killed).
		chromedp.UserDataDir(filepath.Join(dir, "profile")),
		chromedp.WindowSize(width, height),
		// Nothing may leave the machine: every request that is not to
		// loopback goes to a proxy that is not there, and no name but
		// loopback's resolves.
		chromedp.ProxyServer("http://127.0.0.1:9"),
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-features", "OptimizationHints,MediaRouter,Translate"),
		chromedp.CombinedOutput(out),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelBrowser := chromedp.NewContext(actx)
	ctx, cancelLife := context.WithTimeout(ctx, browserLife)
	br := &browser{t: t, ctx: ctx, log: logPath, close: func() {
		cancelLife()
		cancelBrowser()
		cancelAlloc()
		out.Close()
	}}
	// The first Run starts the browser, under the browser's own context.
	if err := chromedp.Do(ctx); err != nil {
		br.close()
		t.Fatalf("start chromium: %v\nchromium printed:\n%s", err, lastLines(logPath, 30))
	}
	return br
}

// do runs steps on the page within limit.
func (br *browser) do(limit time.Duration, steps ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(br.ctx, limit)
	defer cancel()
	return chromedp.Do(ctx, steps...)
}

// diagnose is what the page shows (its address, title and text) and the
// end of what chromium printed, for a failure's message.
func (br *browser) diagnose() string {
	ctx, cancel := context.WithTimeout(br.ctx, 5*time.Second)
	defer cancel()
	page, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + "\n" + document.title + "\n" + (document.body ? document.body.innerText : "(no body)")`))
	if err != nil {
		// A page still loading does not evaluate; the browser still
		// says where its tabs are.
		page = "(the page did not answer: " + err.Error() + ")"
		tctx, cancel := context.WithTimeout(br.ctx, 5*time.Second)
		defer cancel()
		if tabs, err := chromedp.Targets(tctx); err == nil {
			for _, tab := range tabs {
				page += fmt.Sprintf("\n%s %s %q attached=%v", tab.Type, tab.URL, tab.Title, tab.Attached)
			}
		}
	}
	return "page:\n" + page + "\nchromium printed:\n" + lastLines(br.log, 30)
}

// run does steps on the page, within a minute.
func (br *browser) run(what string, steps ...chromedp.Action[chromedp.Void]) {
	br.t.Helper()
	if err := br.do(stepLimit, steps...); err != nil {
		br.t.Fatalf("%s: %v\n%s", what, err, br.diagnose())
	}
}

// until polls a JavaScript condition on the page (chromedp.Poll, every
// 50 ms) until it holds, failing after 20 s.
func (br *browser) until(what, js string) {
	br.t.Helper()
	poll := chromedp.Poll[chromedp.Void](js, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second))
	if err := br.do(stepLimit, poll); err != nil {
		br.t.Fatalf("waiting until %s: %v\n%s", what, err, br.diagnose())
	}
}

// text is the string a JavaScript expression on the page evaluates to.
func (br *browser) text(js string) string {
	br.t.Helper()
	ctx, cancel := context.WithTimeout(br.ctx, stepLimit)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
	if err != nil {
		br.t.Fatalf("read %s: %v\n%s", js, err, br.diagnose())
	}
	return s
}

// status is the number a JavaScript promise on the page resolves to: the
// status of a fetch made with the page's session.
func (br *browser) status(js string) int {
	br.t.Helper()
	ctx, cancel := context.WithTimeout(br.ctx, stepLimit)
	defer cancel()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](js, chromedp.EvalAwaitPromise))
	if err != nil {
		br.t.Fatalf("%s: %v\n%s", js, err, br.diagnose())
	}
	return n
}

// screenshot takes what the page looks like, into $SANDSTORM_ARTIFACTS
// when set (kept, to look at), else into the test's own temporary
// directory (removed with it), and returns the file's path.
func (br *browser) screenshot() string {
	t := br.t
	t.Helper()
	dir := os.Getenv("SANDSTORM_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(br.ctx, stepLimit)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	// One file per test (TestConsoleInChromium's is the README's
	// docs/console.png; TestSamOneConsole's is sam-one's console).
	name := "console.png"
	if t.Name() != "TestConsoleInChromium" {
		name = strings.ToLower(strings.TrimPrefix(t.Name(), "Test")) + ".png"
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// spkiOf is the base64 SHA-256 of the public key addr serves, after
// checking that its certificate chains to the CA in caFile.
func spkiOf(t *testing.T, caFile, addr string) string {
	t.Helper()
	b, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b)
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool})
	if err != nil {
		t.Fatalf("%s's certificate does not check against its CA: %v", addr, err)
	}
	defer c.Close()
	sum := sha256.Sum256(c.ConnectionState().PeerCertificates[0].RawSubjectPublicKeyInfo)
	return base64.StdEncoding.EncodeToString(sum[:])
}

// lastLines is the last n lines of the file at path.
func lastLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return tail(string(b), n)
}
