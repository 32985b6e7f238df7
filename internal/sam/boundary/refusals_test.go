package boundary

import (
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"sandstorm/api"
	"sandstorm/internal/sam/refusals"
	"sandstorm/internal/testenv"
)

// TestRefusalsItemised: every kind of refusal a boundary makes reaches
// its table (Config.Refusals) with the principal, what was asked and
// why, counted; a flood of one refusal is one row; the report passes
// the check sam-node makes.
func TestRefusalsItemised(t *testing.T) {
	tb := refusals.NewTable(64)
	e := newEnv(t, "agent-a", netip.MustParseAddr("127.77.0.31"), func(c *Config) { c.Refusals = tb })
	e.rec.hosts["loop.wild.test"] = "127.0.0.1"

	for i := 0; i < 50; i++ {
		if rep := e.rawSOCKS(t, "secret.test", 443); rep != socksNotAllowed {
			t.Fatalf("secret.test: reply %#x", rep)
		}
	}
	if rep := e.rawSOCKS(t, "loop.wild.test", 80); rep != socksNotAllowed {
		t.Fatalf("loop.wild.test: reply %#x", rep)
	}
	if r := dnsQuery(t, "udp", "127.77.0.31:53", "secret.test.", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Fatalf("DNS for secret.test: %v", r)
	}
	resp, err := e.httpClient(t).Get("http://mesh.sam.alt/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("mesh.sam.alt/metrics: %d", resp.StatusCode)
	}
	other := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}, Timeout: 5 * time.Second}
	if c, err := other.Dial("tcp", "127.77.0.31:1080"); err == nil {
		c.Close()
	}
	testenv.WaitFor(t, 10*time.Second, "the foreign connection counted", func() bool { return e.b.Stats().Foreign == 1 })

	rep := tb.Take()
	if err := refusals.Check(rep); err != nil {
		t.Fatalf("the boundary's report fails sam-node's check: %v", err)
	}
	type want struct{ what, target, reason string }
	found := map[want]uint64{}
	for _, r := range rep.Rows {
		if r.Principal != "agent-a" || r.By != api.RefusedByBoundary {
			t.Errorf("row %+v", r)
		}
		found[want{r.What, r.Target, r.Reason}] = r.Count
	}
	for w, n := range map[want]uint64{
		{api.RefusedName, "secret.test", "destination not granted"}:                                          50,
		{api.RefusedAddress, "loop.wild.test", "address 127.0.0.1 is loopback: never dialled for a sandbox"}: 1,
		{api.RefusedDNS, "secret.test", "destination not granted"}:                                           1,
		{api.RefusedMeshRequest, "GET mesh.sam.alt/metrics", "path not available to agents"}:                 1,
		{api.RefusedForeign, "127.0.0.9", "not this boundary's sandbox (127.0.0.1)"}:                         1,
	} {
		if found[w] != n {
			t.Errorf("%+v counted %d, want %d; rows: %+v", w, found[w], n, rep.Rows)
		}
	}
	if len(rep.Rows) != 5 {
		t.Errorf("%d rows, want 5: %+v", len(rep.Rows), rep.Rows)
	}
}
