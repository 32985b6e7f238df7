package sambench

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sandstorm/internal/bench/sambench/sambenchtest"
	"sandstorm/internal/sam/boundary"
	"sandstorm/internal/sam/policy"
)

// A real boundary's DNS on loopback answers the load generator's queries
// for a name its principal is not granted with NXDOMAIN, and the
// generator's count agrees with the boundary's own counter; nothing
// answering counts as lost, not refused.
func TestDNSRefuseAgainstABoundary(t *testing.T) {
	pol, err := policy.Parse([]byte(sambenchtest.TestPolicy))
	if err != nil {
		t.Fatal(err)
	}
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	lo := netip.MustParseAddr("127.0.0.1")
	b, err := boundary.New(boundary.Config{
		Principal: "agent-a", Policy: func() *policy.Policy { return pol },
		ListenAddr: lo, Peer: lo, ProxyPort: ports[0], DNSPort: ports[1], TransparentPort: ports[2],
		Metrics: boundary.NewMetrics(reg), Log: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	server := fmt.Sprintf("127.0.0.1:%d", ports[1])
	ok, lost, took := dnsRefuse(context.Background(), server, 2, 8, 300*time.Millisecond)
	if ok == 0 || took < 300*time.Millisecond {
		t.Fatalf("refused %d, lost %d, in %v", ok, lost, took)
	}
	// Every answer the client counted was one the boundary gave as
	// NXDOMAIN; queries still in flight at the end were answered but not
	// counted, so the boundary's count may be higher by at most them.
	got := counterValue(t, reg, "sam_box_dns_queries_total", "nxdomain")
	if int64(got) < ok || int64(got) > ok+lost+2*8 {
		t.Errorf("the client counted %d NXDOMAIN (%d lost), the boundary %v", ok, lost, got)
	}

	// Nothing answering: every query is lost, none refused.
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ok, lost, _ = dnsRefuse(context.Background(), pc.LocalAddr().String(), 1, 4, 300*time.Millisecond)
	if ok != 0 || lost == 0 {
		t.Errorf("a silent server: refused %d, lost %d", ok, lost)
	}
}

// counterValue is the value of metric name's series with a label of value.
func counterValue(t *testing.T, reg *prometheus.Registry, name, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{…=%q} in the registry", name, value)
	return 0
}
