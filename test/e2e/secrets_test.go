package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/sam/inject"
)

// secretProbe runs in a sandbox: it calls each name it is given over
// HTTPS with Authorization: Bearer $TOKEN and prints what answered. It
// verifies mirror.test with the system's trust store alone (where the
// node put the sandbox's CA); other.test, whose flow the boundary does not
// touch, with the outside servers' CA as well (argv[1]), as a sandbox
// calling a server of a public CA would.
const secretProbe = `import os, ssl, sys, urllib.request
tok = os.environ.get("TOKEN", "")
print("TOKEN is a marker" if tok.startswith("sandstorm-secret-") else "TOKEN is not a marker (%d bytes)" % len(tok))
for name in sys.argv[2:]:
    ctx = ssl.create_default_context()
    if name != "mirror.test":
        ctx.load_verify_locations(cadata=sys.argv[1])
    try:
        req = urllib.request.Request("https://%s/" % name, headers={"Authorization": "Bearer " + tok})
        print(name, "says", urllib.request.urlopen(req, timeout=10, context=ctx).read().decode())
    except Exception as e:
        print(name, "failed:", e)
`

// authSeen is an HTTPS server's record of the Authorization it was sent,
// by name. It answers only whether it matched: the secret is never sent
// back into the sandbox.
type authSeen struct {
	secret, formSecret string
	mu                 sync.Mutex
	seen               map[string][]string
}

func (a *authSeen) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/form":
		a.form(w, r)
		return
	case "/echo":
		// An answer that quotes the key it was sent, as many do.
		w.Write([]byte("you sent " + r.Header.Get("Authorization")))
		return
	case "/rule":
		a.mu.Lock()
		a.seen["rule "+r.Host] = append(a.seen["rule "+r.Host], r.Header.Get("X-Rule"))
		a.mu.Unlock()
		w.Write([]byte("rule recorded")) // never the value: it must not reach the sandbox
		return
	}
	got := r.Header.Get("Authorization")
	a.mu.Lock()
	a.seen[r.Host] = append(a.seen[r.Host], got)
	a.mu.Unlock()
	if got == "Bearer "+a.secret {
		w.Write([]byte("authorized"))
	} else {
		w.Write([]byte("unauthorized"))
	}
}

// form records a form's client_secret, the protocol it came by and its t
// (a marker of a secret not stored for bodies), as "<proto>
// <client_secret> <t>", and says whether client_secret matched.
func (a *authSeen) form(w http.ResponseWriter, r *http.Request) {
	got := r.PostFormValue("client_secret")
	a.mu.Lock()
	a.seen["form"] = append(a.seen["form"], r.Proto+" "+got+" "+r.PostFormValue("t"))
	a.mu.Unlock()
	if got == a.formSecret {
		w.Write([]byte("form authorized"))
	} else {
		w.Write([]byte("form unauthorized"))
	}
}

func (a *authSeen) last(host string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s := a.seen[host]; len(s) > 0 {
		return s[len(s)-1]
	}
	return ""
}

// testServerCert is a CA of the test's own and a certificate from it
// for each name asked: the "real" servers' certificates, which the node
// verifies with --secrets-ca.
func testServerCert(t *testing.T, names ...string) (caPEM []byte, cfg *tls.Config) {
	t.Helper()
	caPEM, keyPEM, err := inject.NewCA("e2e outside", names)
	if err != nil {
		t.Fatal(err)
	}
	iss, err := inject.NewIssuer(caPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return caPEM, &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return iss.Leaf(h.ServerName) }}
}

// TestSandboxSecrets (issue 33, item 4): a secret stored with the CLI and
// bound to a sandbox reaches the HTTPS server of its host, in place of
// the marker the sandbox holds, through the sandbox's own unmodified
// client verifying with its system trust store; another name the policy
// allows gets the marker. The egress log says which flow had it. Across
// a snapshot and wake it still goes, and from a clone; and no byte of it is in the data
// dir (the sandbox's memory image, its volume and console log, the
// store, the sealed bindings) or the daemon's log. A team's key can
// neither see nor use the operator's secret.
func TestSandboxSecrets(t *testing.T) {
	out := newOutsideNet(t)
	resolver := startTestDNS(t)
	resolver.set("mirror.test", out.server)
	resolver.set("other.test", out.server)
	dir := t.TempDir()
	policyPath := filepath.Join(dir, "policy.yaml")
	os.WriteFile(policyPath, []byte("roles:\n  - name: agent\n    egress: [\"mirror.test\", \"other.test\"]\nbindings:\n  - {principal: vault, roles: [agent]}\n"), 0o600)
	caPEM, serverTLS := testServerCert(t, "mirror.test", "other.test")
	caFile := filepath.Join(dir, "outside-ca.pem")
	os.WriteFile(caFile, caPEM, 0o600)
	var raw [24]byte
	rand.Read(raw[:])
	secret := "sk-e2e-" + hex.EncodeToString(raw[:])
	rand.Read(raw[:])
	formSecret := "cs-e2e-" + hex.EncodeToString(raw[:])
	seen := &authSeen{secret: secret, formSecret: formSecret, seen: map[string][]string{}}
	serverTLS.NextProtos = []string{"h2", "http/1.1"} // curl's HTTP/2 below
	ln := listenIn(t, out.ns, netip.AddrPortFrom(out.server, 443).String())
	srv := &http.Server{Handler: seen}
	go srv.Serve(tls.NewListener(ln, serverTLS))
	t.Cleanup(func() { srv.Close() })

	d := startDaemon(t, "--policy", policyPath, "--resolver", resolver.addr, "--secrets-ca", caFile)
	d.registerBase(t)
	env := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN="}
	valueFile := filepath.Join(dir, "value")
	os.WriteFile(valueFile, []byte(secret+"\n"), 0o600)
	cli(t, env, "secret", "create", "api", "--host", "mirror.test", "--from-file", valueFile).ok(t, "secret create", "stored secret api for mirror.test")
	if ls := cli(t, env, "secret", "ls"); !strings.Contains(ls.Stdout, "mirror.test") || strings.Contains(ls.Stdout+ls.Stderr, secret) {
		t.Errorf("secret ls: %q", ls.Stdout)
	}
	os.WriteFile(valueFile, []byte(formSecret), 0o600)
	cli(t, env, "secret", "create", "form", "--host", "mirror.test", "--body", "--from-file", valueFile).ok(t, "secret create --body", "stored secret form")
	cli(t, env, "sandbox", "create", "base", "--name", "vault", "--secret", "TOKEN=api", "--secret", "FORM=form").ok(t, "a sandbox with secrets")
	sb, err := d.C.Sandbox(ctxT(t), "vault")
	if err != nil {
		t.Fatal(err)
	}
	d.track(sb.ID)
	probe := func(why string, name ...string) {
		t.Helper()
		r := cli(t, env, "sandbox", "exec", append(name, "vault")[0], "--", "/usr/bin/python3", "-c", secretProbe, string(caPEM), "mirror.test", "other.test")
		r.ok(t, "the secret probe")
		if !strings.Contains(r.Stdout, "TOKEN is a marker") || !strings.Contains(r.Stdout, "mirror.test says authorized") || !strings.Contains(r.Stdout, "other.test says unauthorized") {
			t.Errorf("%s: in the sandbox:\n%s", why, r.Stdout)
		}
		if got := seen.last("mirror.test"); got != "Bearer "+secret {
			t.Errorf("%s: mirror.test was sent %q; want the secret", why, got)
		}
		if got := seen.last("other.test"); !strings.HasPrefix(got, "Bearer sandstorm-secret-") {
			t.Errorf("%s: other.test was sent %q; want the marker", why, got)
		}
	}
	probe("hot")
	checkSecretLog(t, d, sb.ID)
	curlForm(t, env, seen, formSecret)

	d.transition(t, sb.ID, "snapshot", api.TierSnapshot)
	searchForSecret(t, d, secret)
	searchForSecret(t, d, formSecret)
	probe("woken from its snapshot") // its boundary opened the sealed bindings again

	// A clone has its parent's markers in its memory and its parent's
	// CA in its volume: it gets the bindings too, sealed for itself.
	res, err := d.C.Clone(ctxT(t), "vault", api.CloneRequest{Count: 1, Principal: "vault"})
	if err != nil || len(res.Children) != 1 {
		t.Fatalf("clone: %+v %v", res, err)
	}
	d.track(res.Children[0].ID)
	probe("a clone", res.Children[0].Name)

	ruleValue := e2bRules(t, d, env, seen)
	searchForSecret(t, d, ruleValue)

	// A team's key sees none of the operator's secrets, and cannot bind one.
	key := strings.TrimSpace(cli(t, env, "api-key", "create", "blue").Stdout)
	team := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN=" + key}
	if ls := cli(t, team, "secret", "ls", "--json"); ls.Code != 0 || strings.TrimSpace(ls.Stdout) != "[]" {
		t.Errorf("a team lists the operator's secrets: %q %q", ls.Stdout, ls.Stderr)
	}
	cli(t, team, "sandbox", "create", "base", "--name", "thief", "--secret", "T=api").fails(t, "a team binding the operator's secret", `secret "api": not found`)
}

// curlForm: the sandbox's curl posts a form over HTTP/2 with the body
// secret's marker as client_secret and the other's in its header; the
// server is sent the body secret in the body, over HTTP/2, the other in
// the header (it is not a body secret: in the body it would stay the
// marker). An answer that quotes the secret reaches curl with the marker
// in its place.
func curlForm(t *testing.T, env []string, seen *authSeen, formSecret string) {
	t.Helper()
	r := cli(t, env, "sandbox", "exec", "vault", "--", "/bin/sh", "-c",
		`curl -sS --http2 -w ' %{http_version}' -H "Authorization: Bearer $TOKEN" --data "client_secret=$FORM&t=$TOKEN" https://mirror.test/form`)
	r.ok(t, "curl --http2 with a body secret")
	if r.Stdout != "form authorized 2" {
		t.Errorf("curl in the sandbox: %q %q", r.Stdout, r.Stderr)
	}
	if got := seen.last("form"); !strings.HasPrefix(got, "HTTP/2.0 "+formSecret+" sandstorm-secret-") {
		t.Errorf("mirror.test's form was sent %q; want the body secret over HTTP/2, and the other's marker", got)
	}
	// The server quotes the secret back: the sandbox reads the marker.
	r = cli(t, env, "sandbox", "exec", "vault", "--", "/bin/sh", "-c", `curl -sS --compressed -H "Authorization: Bearer $TOKEN" https://mirror.test/echo`)
	if !strings.HasPrefix(r.Stdout, "you sent Bearer sandstorm-secret-") || strings.Contains(r.Stdout, seen.secret) {
		t.Errorf("an answer quoting the secret, in the sandbox: %q %q", r.Stdout, r.Stderr)
	}
}

// e2bRules: a sandbox made through /e2b with network.rules for
// mirror.test (E2B's header transforms) has its boundary set the header on
// its requests there, and not to other.test; the value is not in the
// sandbox's environment. It returns the value, to search for, with the
// sandbox snapshotted (its memory image on disk).
func e2bRules(t *testing.T, d *Daemon, env []string, seen *authSeen) string {
	t.Helper()
	if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: "vaulted", RootfsDir: baseRootfs, Principal: "vault",
		Process: api.Process{Args: baseDemo.Args, Env: baseDemo.Env, Envd: baseDemo.Envd}}); err != nil {
		t.Fatal(err)
	}
	var raw [16]byte
	rand.Read(raw[:])
	value := "rule-e2e-" + hex.EncodeToString(raw[:])
	rules := map[string]any{"mirror.test": []any{map[string]any{"transform": map[string]any{"headers": map[string]string{"x-rule": value}}}}}
	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := d.C.Do(ctxT(t), http.MethodPost, "/e2b/sandboxes", map[string]any{"templateID": "vaulted", "timeout": 600, "network": map[string]any{"rules": rules}}, &sb); err != nil {
		t.Fatalf("an E2B create with network.rules: %v", err)
	}
	d.track(sb.SandboxID)
	// other.test's certificate is the test's own CA's, which the sandbox
	// does not trust (-k): what is checked is the header it was sent.
	r := cli(t, env, "sandbox", "exec", sb.SandboxID, "--", "/bin/sh", "-c",
		`curl -sS https://mirror.test/rule && echo && curl -sSk https://other.test/rule && echo && env | grep -c rule-e2e-`)
	if r.Stdout != "rule recorded\nrule recorded\n0\n" {
		t.Errorf("in the sandbox with network.rules: %q %q", r.Stdout, r.Stderr)
	}
	if got := seen.last("rule mirror.test"); got != value {
		t.Errorf("mirror.test was sent X-Rule %q; want the rule's value", got)
	}
	if got := seen.last("rule other.test"); got != "" {
		t.Errorf("other.test was sent X-Rule %q; want none", got)
	}
	// Its memory image is searched too (searchForSecret).
	d.transition(t, sb.SandboxID, "snapshot", api.TierSnapshot)
	return value
}

// checkSecretLog: the egress log says the flow to mirror.test:443 had
// secret api put in, and the one to other.test none. A spliced flow is
// logged when both sides are done, so the log is read until it has both
// (or 30 s pass).
func checkSecretLog(t *testing.T, d *Daemon, id string) {
	t.Helper()
	var p api.EgressPage
	var mirror, other bool
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var b strings.Builder
		if err := d.C.EgressLog(ctxT(t), id, 0, 0, false, &b); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(b.String()), &p); err != nil {
			t.Fatal(err)
		}
		for _, f := range p.Items {
			switch {
			case f.Name == "mirror.test" && f.Port == 443:
				mirror = slices.Equal(f.Secrets, []string{"api"}) && f.BytesOut > 0 && f.BytesIn > 0
			case f.Name == "other.test" && f.Port == 443:
				other = len(f.Secrets) == 0 && f.Outcome == "allowed"
			}
		}
		if mirror && other {
			return
		}
	}
	t.Errorf("egress log (mirror.test with secret api: %v; other.test without: %v): %+v", mirror, other, p.Items)
}

// searchForSecret reads every file of the data dir — the sandbox's memory
// image, volume, console log and sealed bindings, the store — and the
// daemon's log, for the secret.
func searchForSecret(t *testing.T, d *Daemon, secret string) {
	t.Helper()
	files, images := 0, 0
	filepath.WalkDir(d.DataDir, func(path string, de fs.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		files++
		if strings.Contains(path, string(filepath.Separator)+"snapshot"+string(filepath.Separator)) {
			images++
		}
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("the secret is in %s", path)
		}
		return nil
	})
	if images == 0 {
		t.Errorf("no memory image was searched (%d files): the sandbox's snapshot is not where the search looked", files)
	}
	if b, _ := os.ReadFile(d.LogPath); bytes.Contains(b, []byte(secret)) {
		t.Error("the secret is in the daemon's log")
	}
}
