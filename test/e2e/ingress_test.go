package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/miekg/dns"

	"sandstorm/api"
	"sandstorm/internal/client"
	"sandstorm/internal/node/secretbind"
	"sandstorm/internal/node/tiering"
	"sandstorm/internal/pki"
	"sandstorm/internal/secrets"
	"sandstorm/internal/testenv"
	pb "sandstorm/third_party/envd/process"
	"sandstorm/third_party/envd/process/processconnect"
)

// ingressEnvd is a client of a sandbox's envd through a node's ingress,
// addressed as E2B_SANDBOX_URL addresses it (E2b-Sandbox-Id and -Port).
func ingressEnvd(ingress, id, token string) processconnect.ProcessClient {
	hc := &http.Client{Transport: headers{next: http.DefaultTransport, set: map[string]string{
		"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": strconv.Itoa(api.EnvdPort), "X-Access-Token": token}}}
	return processconnect.NewProcessClient(hc, "http://"+ingress)
}

// dnsA asks the DNS server at server over network (udp, tcp) for
// name's address: the answer's first A record, "" if none.
func dnsA(t *testing.T, network, server, name string) string {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	r, _, err := (&dns.Client{Net: network, Timeout: 5 * time.Second}).Exchange(q, server)
	if err != nil {
		t.Errorf("DNS %s at %s: %v", name, server, err)
		return ""
	}
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			return a.A.String()
		}
	}
	return ""
}

// floodDNS sends n's DNS (on port 5353) 80 questions at once over UDP
// (within a socket's default receive buffer), as a forger would to turn
// its answers on a victim, for a name it does not know (so other names
// keep their allowance): past the default --ingress-dns-rate (20 a
// second for one client network and kind, a burst of 40) some are sent
// empty and truncated and the rest dropped, as n's metrics count them.
func floodDNS(t *testing.T, n *machine) {
	t.Helper()
	outcomes := func() (sent, slipped, dropped float64) {
		s := scrapeMetrics(t, n.addr+":9600")
		sent, _ = s.get("sandstorm_ingress_dns_answers_total", "outcome", "sent")
		slipped, _ = s.get("sandstorm_ingress_dns_answers_total", "outcome", "slipped")
		dropped, _ = s.get("sandstorm_ingress_dns_answers_total", "outcome", "dropped")
		return
	}
	sent0, slipped0, dropped0 := outcomes()
	if sent0 == 0 {
		t.Errorf("%s's metrics count no DNS answer sent, after several", n.name)
	}
	c, err := net.Dial("udp", n.addr+":5353")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const flood = 80
	for i := range flood {
		q := new(dns.Msg)
		q.SetQuestion("flood.sandbox.localhost.", dns.TypeA)
		q.Id = uint16(i)
		b, _ := q.Pack()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	var sent, slipped, dropped float64
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("%s's DNS decided %d questions", n.name, flood), func() bool {
		sent, slipped, dropped = outcomes()
		return sent+slipped+dropped-sent0-slipped0-dropped0 >= flood
	})
	t.Logf("%d questions at once to %s's DNS over UDP: %v answered, %v slipped, %v dropped", flood, n.name, sent-sent0, slipped-slipped0, dropped-dropped0)
	// 40 at once, and 20 more a second: 70 leaves the flood 1.5 s.
	if sent-sent0 > 70 || slipped == slipped0 || dropped == dropped0 {
		t.Errorf("%d questions at once: %v answered (burst 40), %v slipped, %v dropped: not rate-limited", flood, sent-sent0, slipped-slipped0, dropped-dropped0)
	}
}

// ingressEnvdTLS is one through an ingress serving HTTPS, by the
// sandbox's own name (https://49983-<id>.sandbox.localhost), the name
// resolved to the ingress's address, its certificate checked against
// roots.
func ingressEnvdTLS(ingress, id, token string, roots *x509.CertPool) processconnect.ProcessClient {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, ingress)
		}}
	hc := &http.Client{Transport: headers{next: tr, set: map[string]string{"X-Access-Token": token}}}
	_, port, _ := net.SplitHostPort(ingress)
	return processconnect.NewProcessClient(hc, fmt.Sprintf("https://%d-%s.sandbox.localhost:%s", api.EnvdPort, id, port))
}

// ingressCert writes a certificate for *.sandbox.localhost (and hosts)
// from a CA of the test's own, and its key, for --ingress-cert and
// --ingress-key.
func ingressCert(t *testing.T, hosts ...string) (certFile, keyFile string, ca *pki.CA) {
	t.Helper()
	ca, err := pki.EnsureCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.Issue("ingress", append([]string{"*.sandbox.localhost"}, hosts...), time.Hour, true, false)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "ingress.pem"), filepath.Join(dir, "ingress-key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o644)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600)
	return certFile, keyFile, ca
}

type headers struct {
	next http.RoundTripper
	set  map[string]string
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.set {
		r.Header.Set(k, v)
	}
	return h.next.RoundTrip(r)
}

// shell runs script in the sandbox through c, and returns its stdout.
func shell(ctx context.Context, c processconnect.ProcessClient, script string) (string, error) {
	st, err := c.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}}))
	if err != nil {
		return "", err
	}
	defer st.Close()
	var out strings.Builder
	for st.Receive() {
		if d := st.Msg().GetEvent().GetData(); d != nil {
			out.Write(d.GetStdout())
		}
		if e := st.Msg().GetEvent().GetEnd(); e != nil {
			return out.String(), nil
		}
	}
	return out.String(), fmt.Errorf("the stream ended without the command's end: %w", st.Err())
}

// counting starts a command printing 1..n, one line every quarter of a
// second, through c, and sends each line it prints to lines; done gets
// the stream's end: nil after the command's own end, else why it ended.
func counting(ctx context.Context, c processconnect.ProcessClient, n int, lines chan<- int, done chan<- error) {
	st, err := c.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh",
		Args: []string{"-c", fmt.Sprintf("i=1; while [ $i -le %d ]; do echo $i; i=$((i+1)); sleep 0.25; done", n)}}}))
	if err != nil {
		done <- err
		return
	}
	defer st.Close()
	for st.Receive() {
		if d := st.Msg().GetEvent().GetData(); d != nil {
			for _, l := range strings.Fields(string(d.GetStdout())) {
				k, _ := strconv.Atoi(l)
				lines <- k
			}
		}
		if st.Msg().GetEvent().GetEnd() != nil {
			done <- nil
			return
		}
	}
	done <- fmt.Errorf("the stream ended without the command's end: %w", st.Err())
}

// TestIngress (issue 33, "an ingress that is not the master"): a master
// and three nodes, each in a network namespace of its own, each with an
// ingress (serve --ingress-listen; A's over HTTPS, by the sandbox's own
// name). A sandbox on node C, with a secret bound, is served through node
// A's ingress — envd checked by its own access token there, a wrong one
// refused — and a command's output streamed from C through A goes on,
// whole and in order, while the master is killed with -9 mid-stream; a
// new call through A works with the master down. Back up, the master
// moves the sandbox to B mid-stream: that stream ends (it does not hang),
// and the next call through A reaches the sandbox on B, its files and
// its secret's bindings with it (sealed under B's key); every ingress
// serves it, E2B's SDK unchanged does its commands, files and a stream
// with A's ingress as its sandbox URL; a sandbox paused with autoResume
// is resumed by its traffic through A's ingress (ingressAutoResume); and
// once it is deleted no ingress serves it.
func TestIngress(t *testing.T) {
	// The nodes reach each other through this namespace, as machines on
	// one network do.
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile("/proc/sys/net/ipv4/ip_forward", fwd, 0o644) })
	m := startDaemon(t, masterOnly)
	var nodes []*machine
	// A and C serve HTTPS (a certificate for the sandboxes' names), B
	// plain HTTP (a TLS proxy in front): A passes C's sandboxes'
	// connections to C's ingress unread, and forwards B's request by
	// request (its ingress does not speak TLS).
	certFile, keyFile, ingressCA := ingressCert(t, "10.188.7.2")
	roots := ingressCA.Pool()
	for k := 7; k <= 9; k++ {
		args := []string{"--ingress-listen", fmt.Sprintf("10.188.%d.2:8443", k)}
		if k != 8 {
			args = append(args, "--ingress-cert", certFile, "--ingress-key", keyFile)
		}
		if k != 8 {
			args = append(args, "--metrics-addr", fmt.Sprintf("10.188.%d.2:9600", k))
		}
		// A answers the fleet's DNS; C says where clients reach it.
		switch k {
		case 7:
			args = append(args, "--ingress-dns", "10.188.7.2:5353", "--ingress-dns-record", "api=10.188.7.1",
				"--ingress-dns-ns", "ns1", "--ingress-dns-record", "ns1=10.188.7.2")
		case 9:
			args = append(args, "--ingress-public", "10.188.9.2")
		}
		nodes = append(nodes, fleetMachine(t, k, args...))
	}
	a, b, c := nodes[0], nodes[1], nodes[2]
	for _, n := range nodes {
		r := m.raw(t, "POST", "/v1/nodes", m.Token, "application/json", strings.NewReader(fmt.Sprintf(`{"address": %q, "pairing_code": %q}`, n.listen, n.code())))
		if r.Status != http.StatusCreated {
			t.Fatalf("pair %s: HTTP %d %s", n.name, r.Status, r.Body)
		}
	}
	m.registerBase(t)
	ctx := ctxT(t)
	// With a secret bound: its bindings move with it, sealed anew under
	// each node's own key.
	// A team's, as E2B's SDK asks with its key.
	env := []string{"SANDSTORM_API=" + m.API, "SANDSTORM_DATA_DIR=" + m.DataDir, "SANDSTORM_TOKEN="}
	key := strings.TrimSpace(cli(t, env, "api-key", "create", "ingress-team").Stdout)
	team := *m.C
	team.Token = key
	if _, err := team.PutSecret(ctx, api.SecretRequest{Name: "api-key", Value: "v-ingress-7f3a", Hosts: []string{"api.example.test"}}); err != nil {
		t.Fatal(err)
	}
	made, err := team.CreateSandbox(ctx, api.SandboxRequest{Template: "base", Secrets: map[string]string{"API_KEY": "api-key"}})
	if err != nil {
		t.Fatal(err)
	}
	sb := struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}{SandboxID: made.ID}
	if err := m.C.Do(ctx, http.MethodPost, "/e2b/sandboxes/"+made.ID+"/connect", map[string]any{"timeout": 3600}, &sb); err != nil {
		t.Fatal(err)
	}
	if got := m.get(t, sb.SandboxID); got.Node != c.name {
		r := m.raw(t, "POST", "/v1/sandboxes/"+sb.SandboxID+"/move", m.Token, "application/json", strings.NewReader(fmt.Sprintf(`{"to": %q}`, c.name)))
		if r.Status != http.StatusOK {
			t.Fatalf("move to %s: HTTP %d %s", c.name, r.Status, r.Body)
		}
	}
	// A decides at a connection's first request whether to pass it on,
	// and keeps to it: a connection opened while A's table still named
	// A (the sandbox was made there, and the master's push of the move
	// is on its way) is served request by request to the end. So each
	// try is a new connection, kept once A passed it to C.
	passed := func() float64 {
		v, _ := scrapeMetrics(t, a.addr+":9600").get("sandstorm_ingress_requests_total", "outcome", "passed")
		return v
	}
	var viaA processconnect.ProcessClient
	tries := 0
	testenv.WaitFor(t, 30*time.Second, "the sandbox on "+c.name+" answers through "+a.name+"'s ingress, which passes the connection to "+c.name, func() bool {
		tries++
		before, try := passed(), ingressEnvdTLS(a.addr+":8443", sb.SandboxID, sb.EnvdAccessToken, roots)
		out, err := shell(ctx, try, "echo here > /tmp/mark; cat /tmp/mark")
		if err != nil || out != "here\n" || passed() == before {
			return false
		}
		viaA = try
		return true
	})
	t.Logf("%s passed a connection to %s at try %d", a.name, c.name, tries)
	if _, err := shell(ctx, ingressEnvdTLS(a.addr+":8443", sb.SandboxID, strings.Repeat("0", len(sb.EnvdAccessToken)), roots), "true"); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("a wrong access token at the ingress: %v, want unauthenticated", err)
	}
	// The fleet's DNS on A steers a client to C straight: A's answer
	// for the sandbox's name is C's address, where the client's
	// connection is served without A (nothing more passed).
	envdName := fmt.Sprintf("%d-%s.sandbox.localhost", api.EnvdPort, sb.SandboxID)
	if ip := dnsA(t, "udp", a.addr+":5353", envdName); ip != c.addr {
		t.Errorf("%s's DNS for %s: %q, want %s's address %s", a.name, envdName, ip, c.name, c.addr)
	} else {
		before := passed()
		if out, err := shell(ctx, ingressEnvdTLS(ip+":8443", sb.SandboxID, sb.EnvdAccessToken, roots), "cat /tmp/mark"); err != nil || out != "here\n" {
			t.Errorf("at the address %s's DNS gave: %q %v", a.name, out, err)
		}
		if passed() != before {
			t.Errorf("a client that resolved through %s's DNS still went through %s", a.name, a.name)
		}
	}
	if ip := dnsA(t, "udp", a.addr+":5353", "api.sandbox.localhost"); ip != "10.188.7.1" {
		t.Errorf("%s's DNS for api: %q, want its --ingress-dns-record", a.name, ip)
	}
	// The zone's name server, with its address beside it.
	q := new(dns.Msg)
	q.SetQuestion("sandbox.localhost.", dns.TypeNS)
	r, _, err := (&dns.Client{Net: "tcp", Timeout: 5 * time.Second}).Exchange(q, a.addr+":5353")
	if err != nil || len(r.Answer) != 1 || len(r.Extra) != 1 ||
		r.Answer[0].String() != "sandbox.localhost.\t60\tIN\tNS\tns1.sandbox.localhost." || r.Extra[0].String() != "ns1.sandbox.localhost.\t60\tIN\tA\t10.188.7.2" {
		t.Errorf("%s's DNS for the zone's NS: %v %v, want ns1.sandbox.localhost at 10.188.7.2", a.name, r, err)
	}
	floodDNS(t, a)
	// Which node served it is in C's log, not A's: A passed it on.
	if got := m.get(t, sb.SandboxID); got.Node != c.name {
		t.Fatalf("the sandbox is on %s, want %s", got.Node, c.name)
	}

	// The master killed mid-stream: the stream goes on.
	const n = 24
	lines, done := make(chan int, n), make(chan error, 1)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	go counting(sctx, viaA, n, lines, done)
	next := 1
	for ; next <= 3; next++ {
		if got := <-lines; got != next {
			t.Fatalf("line %d: got %d", next, got)
		}
	}
	m.Kill(t)
	if out, err := shell(ctx, viaA, "cat /tmp/mark"); err != nil || out != "here\n" {
		t.Errorf("a new call through %s with the master down: %q %v", a.name, out, err)
	}
	for ; next <= n; next++ {
		select {
		case got := <-lines:
			if got != next {
				t.Fatalf("with the master down, line %d: got %d", next, got)
			}
		case err := <-done:
			t.Fatalf("with the master down the stream ended at line %d: %v", next, err)
		}
	}
	if err := <-done; err != nil {
		t.Errorf("the stream through %s with the master down: %v", a.name, err)
	}

	// A move mid-stream ends that stream, and the next call follows it.
	m.Start(t)
	waitNode(t, m, c.name, 30*time.Second, c.name+" ready again", nodeReconciled)
	lines, done = make(chan int, n), make(chan error, 1)
	go counting(sctx, viaA, n, lines, done)
	if got := <-lines; got != 1 {
		t.Fatalf("the second stream's first line: %d", got)
	}
	moved := make(chan api.Sandbox, 1)
	go func() {
		r := m.raw(t, "POST", "/v1/sandboxes/"+sb.SandboxID+"/move", m.Token, "application/json", strings.NewReader(fmt.Sprintf(`{"to": %q}`, b.name)))
		var got api.Sandbox
		if r.Status != http.StatusOK || json.Unmarshal([]byte(r.Body), &got) != nil {
			t.Errorf("move to %s: HTTP %d %s", b.name, r.Status, r.Body)
		}
		moved <- got
	}()
	ended := false
	for !ended {
		select {
		case <-lines:
		case err := <-done:
			ended = true
			// Ended as the Connect protocol ends a stream that failed
			// (envdlink's cutWriter), not torn mid-message.
			switch {
			case err == nil:
				t.Errorf("the stream through a move ended with its command's end: the sandbox did not move mid-stream")
			case connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), tiering.CutSnapshotted):
				t.Errorf("the stream through the move ended with %v, want unavailable: %s", err, tiering.CutSnapshotted)
			}
			t.Logf("the stream through the move ended: %v", err)
		case <-sctx.Done():
			t.Fatal("the stream through a move did not end")
		}
	}
	if got := <-moved; got.Node != b.name {
		t.Fatalf("after the move the sandbox is on %q, want %s", got.Node, b.name)
	}
	// B serves plain HTTP, unlike A: A's DNS answers with A itself, which
	// forwards to B, once the master's push of the move reaches it.
	// Asked over TCP: polled over UDP, past --ingress-dns-rate, answers
	// would be dropped.
	testenv.WaitFor(t, 30*time.Second, a.name+"'s DNS follows the move to "+b.name, func() bool {
		return dnsA(t, "tcp", a.addr+":5353", envdName) == a.addr
	})
	if out, err := shell(ctx, viaA, "cat /tmp/mark"); err != nil || out != "here\n" {
		t.Errorf("through %s after the move to %s: %q %v", a.name, b.name, out, err)
	}
	// Its secret came with it: sealed under B's key (not C's), naming
	// the secret's host, and nothing of the value in clear there.
	sealedAt := func(n *machine) string { return filepath.Join(n.dataDir, "sandboxes", sb.SandboxID, secretbind.File) }
	boxOf := func(n *machine) *secrets.Box {
		box, err := secrets.OpenBox(filepath.Join(n.dataDir, secrets.KeyFile))
		if err != nil {
			t.Fatal(err)
		}
		return box
	}
	if set, err := secretbind.Load(filepath.Dir(sealedAt(b)), sb.SandboxID, boxOf(b), nil); err != nil || len(set.For("api.example.test")) != 1 {
		t.Errorf("the moved sandbox's secrets on %s: %v", b.name, err)
	}
	if _, err := secretbind.Load(filepath.Dir(sealedAt(b)), sb.SandboxID, boxOf(c), nil); !errors.Is(err, secrets.ErrSealed) {
		t.Errorf("%s's key opened the secrets sealed on %s: %v", c.name, b.name, err)
	}
	if raw, _ := os.ReadFile(sealedAt(b)); len(raw) == 0 || bytes.Contains(raw, []byte("v-ingress-7f3a")) {
		t.Errorf("the sealed file on %s: %d bytes, or the value in clear", b.name, len(raw))
	}
	if out, err := shell(ctx, viaA, "echo $API_KEY"); err != nil || !strings.HasPrefix(out, "sandstorm-secret-") {
		t.Errorf("the marker in the moved sandbox's env: %q %v", out, err)
	}
	// B's own ingress serves it too; C's has its route to B.
	for x, pc := range map[*machine]processconnect.ProcessClient{
		b: ingressEnvd(b.addr+":8443", sb.SandboxID, sb.EnvdAccessToken),
		c: ingressEnvdTLS(c.addr+":8443", sb.SandboxID, sb.EnvdAccessToken, roots),
	} {
		if out, err := shell(ctx, pc, "cat /tmp/mark"); err != nil || out != "here\n" {
			t.Errorf("through %s's ingress after the move: %q %v", x.name, out, err)
		}
	}
	// E2B's SDK, unchanged, with A's ingress as its sandbox URL.
	script, err := filepath.Abs("../../testdata/e2b/ingress.mjs")
	if err != nil {
		t.Fatal(err)
	}
	masterCA, err := os.ReadFile(filepath.Join(m.DataDir, "pki", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cas := writeTemp(t, "cas.pem", string(masterCA)+string(ingressCA.PEM))
	runFlows(t, m, script, "e2b", key, key, "SANDBOX_ID="+sb.SandboxID, "E2B_SANDBOX_URL=https://"+a.addr+":8443", "NODE_EXTRA_CA_CERTS="+cas)

	// The metrics say what each did. A passed the connections by the
	// sandbox's name to C while it was there, and forwarded the SDK's
	// (by headers) to B, request by request; C served them, refused the
	// wrong token A passed it, and sent to B, after the move, the call
	// made at its own ingress (B's does not speak TLS): forwarded, or
	// retried if its table still named itself (a stale route followed).
	outcome := func(o string) string { return `sandstorm_ingress_requests_total\{outcome="(` + o + `)"\}` }
	for x, wants := range map[*machine][]string{
		a: {outcome("passed"), outcome("forwarded"), "sandstorm_ingress_routes 1"},
		c: {outcome("local"), outcome("refused"), outcome("forwarded|retried")},
	} {
		resp, err := http.Get("http://" + x.addr + ":9600/metrics")
		if err != nil {
			t.Fatal(err)
		}
		metricsText, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range wants {
			if !regexp.MustCompile(want).Match(metricsText) {
				t.Errorf("%s's metrics have no %s; they say:\n%s", x.name, want, regexp.MustCompile(`(?m)^sandstorm_ingress_requests_total.*$`).FindAll(metricsText, -1))
			}
		}
	}

	ingressAutoResume(t, ctx, &team, viaIngress(a.addr+":8443", roots), a.name)

	// A restarted while nothing changes (after its metrics are read: they start again): its ingress's table is empty
	// until the master, hearing it report again, pushes it whole (a
	// newcomer's trial, 12-07, saw 502s from a restarted node for as
	// long as no sandbox changed).
	a.stop(syscall.SIGKILL)
	a.start()
	waitNode(t, m, a.name, 30*time.Second, a.name+" back and reconciled", nodeReconciled)
	var out string
	testenv.WaitFor(t, 30*time.Second, "the restarted "+a.name+"'s ingress serves the sandbox on "+b.name, func() bool {
		out, err = shell(ctx, viaA, "cat /tmp/mark")
		return err == nil && out == "here\n"
	})
	// Deleted, it has no route: every ingress answers E2B's "not found".
	if err := m.C.DeleteSandbox(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the deleted sandbox's route gone from "+a.name, func() bool {
		_, err := shell(ctx, viaA, "true")
		return connect.CodeOf(err) == connect.CodeUnavailable // E2B's 502
	})
}

// viaIngress is a client of one sandbox's envd through the ingress at
// addr (HTTPS, trusting roots).
func viaIngress(addr string, roots *x509.CertPool) func(id, token string) processconnect.ProcessClient {
	return func(id, token string) processconnect.ProcessClient { return ingressEnvdTLS(addr, id, token, roots) }
}

// ingressAutoResume: a sandbox paused with E2B's autoResume is resumed by
// its traffic through a node's ingress, which asks the master on its
// report stream and serves the call once the master's push says it runs
// (it was a 503 pointing at the master's API). Called until the master
// says it runs: a first call may still find the route from before the
// pause, which the holder serves without the master (and so without a
// resume); only the ask resumes it.
func ingressAutoResume(t *testing.T, ctx context.Context, team *client.Client, via func(id, token string) processconnect.ProcessClient, name string) {
	var ar struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := team.Do(ctx, http.MethodPost, "/e2b/sandboxes", map[string]any{"templateID": "base", "timeout": 3600, "autoResume": map[string]any{"enabled": true}}, &ar); err != nil {
		t.Fatal(err)
	}
	defer team.DeleteSandbox(context.Background(), ar.SandboxID)
	if err := team.Do(ctx, http.MethodPost, "/e2b/sandboxes/"+ar.SandboxID+"/pause", nil, nil); err != nil {
		t.Fatal(err)
	}
	c := via(ar.SandboxID, ar.EnvdAccessToken)
	var last string
	testenv.WaitFor(t, 30*time.Second, "traffic through "+name+"'s ingress resumes a sandbox paused with autoResume", func() bool {
		out, err := shell(ctx, c, "echo up")
		var got struct {
			State string `json:"state"`
		}
		if err := team.Do(ctx, http.MethodGet, "/e2b/sandboxes/"+ar.SandboxID, nil, &got); err != nil {
			t.Fatal(err)
		}
		last = fmt.Sprintf("call: %q %v; the master says %s", out, err, got.State)
		return err == nil && out == "up\n" && got.State == "running"
	})
	t.Logf("resumed through %s's ingress: %s", name, last)
}
