package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"sandstorm/api"
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
// ingress (serve --ingress-listen). A sandbox on node C is served
// through node A's ingress — envd checked by its own access token there,
// a wrong one refused — and a command's output streamed from C through
// A goes on, whole and in order, while the master is killed with -9
// mid-stream; a new call through A works with the master down. Back up,
// the master moves the sandbox to B mid-stream: that stream ends (it
// does not hang), and the next call through A reaches the sandbox on B,
// its files with it.
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
	for k := 7; k <= 9; k++ {
		nodes = append(nodes, fleetMachine(t, k, "--ingress-listen", fmt.Sprintf("10.188.%d.2:8443", k)))
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
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := m.C.Do(ctx, http.MethodPost, "/e2b/sandboxes", map[string]any{"templateID": "base", "timeout": 3600}, &sb); err != nil {
		t.Fatal(err)
	}
	if got := m.get(t, sb.SandboxID); got.Node != c.name {
		r := m.raw(t, "POST", "/v1/sandboxes/"+sb.SandboxID+"/move", m.Token, "application/json", strings.NewReader(fmt.Sprintf(`{"to": %q}`, c.name)))
		if r.Status != http.StatusOK {
			t.Fatalf("move to %s: HTTP %d %s", c.name, r.Status, r.Body)
		}
	}
	viaA := ingressEnvd(a.addr+":8443", sb.SandboxID, sb.EnvdAccessToken)
	testenv.WaitFor(t, 30*time.Second, "the sandbox on "+c.name+" answers through "+a.name+"'s ingress", func() bool {
		out, err := shell(ctx, viaA, "echo here > /tmp/mark; cat /tmp/mark")
		return err == nil && out == "here\n"
	})
	if _, err := shell(ctx, ingressEnvd(a.addr+":8443", sb.SandboxID, strings.Repeat("0", len(sb.EnvdAccessToken))), "true"); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("a wrong access token at the ingress: %v, want unauthenticated", err)
	}
	// Which node served it is in C's log, not A's: A forwarded.
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
			if err == nil {
				t.Errorf("the stream through a move ended with its command's end: the sandbox did not move mid-stream")
			}
			t.Logf("the stream through the move ended: %v", err)
		case <-sctx.Done():
			t.Fatal("the stream through a move did not end")
		}
	}
	if got := <-moved; got.Node != b.name {
		t.Fatalf("after the move the sandbox is on %q, want %s", got.Node, b.name)
	}
	if out, err := shell(ctx, viaA, "cat /tmp/mark"); err != nil || out != "here\n" {
		t.Errorf("through %s after the move to %s: %q %v", a.name, b.name, out, err)
	}
	// B's own ingress serves it too; C's has its route to B.
	for _, x := range []*machine{b, c} {
		if out, err := shell(ctx, ingressEnvd(x.addr+":8443", sb.SandboxID, sb.EnvdAccessToken), "cat /tmp/mark"); err != nil || out != "here\n" {
			t.Errorf("through %s's ingress after the move: %q %v", x.name, out, err)
		}
	}
	// Deleted, it has no route: every ingress answers E2B's "not found".
	if err := m.C.DeleteSandbox(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the deleted sandbox's route gone from "+a.name, func() bool {
		_, err := shell(ctx, viaA, "true")
		return connect.CodeOf(err) == connect.CodeUnavailable // E2B's 502
	})
}
