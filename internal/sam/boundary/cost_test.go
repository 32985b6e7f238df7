package boundary

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sandstorm/internal/sam/policy"
	"sandstorm/internal/testenv"
)

type footprint struct {
	rss, heap, stack uint64
	goroutines, fds  int
}

func measure() footprint {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	f := footprint{heap: ms.HeapInuse, stack: ms.StackInuse, goroutines: runtime.NumGoroutine()}
	if data, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				f.rss = kb << 10
			}
		}
	}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		f.fds = len(ents)
	}
	return f
}

// TestBoundaryCost measures what each additional boundary costs in one
// process: resident memory, Go heap and stacks, goroutines and file
// descriptors, at 1, 8 and 64 boundaries, each with a Unix socket and all
// four listeners on an address of its own, idle and after one mesh request
// each, and holds each additional boundary to the README's bound.
func TestBoundaryCost(t *testing.T) {
	mesh := newFakeMesh(t)
	pol := mustPolicy(t, testPolicy)
	metrics := NewMetrics(prometheus.NewRegistry())
	// As a Set and sandstormd hold them: one pool of node connections for
	// all, so what idle connections cost is the process's, not per agent.
	pool := NewMeshPool(mesh.dial, 0)
	t.Cleanup(pool.Close)
	dir := t.TempDir()
	var bs []*Boundary
	t.Cleanup(func() {
		for _, b := range bs {
			b.Close()
		}
	})
	base := measure()
	t.Logf("baseline: RSS %.1f MiB, heap %.1f MiB, stacks %d KiB, %d goroutines, %d fds",
		mib(base.rss), mib(base.heap), base.stack>>10, base.goroutines, base.fds)
	var first footprint
	for _, n := range []int{1, 8, 64} {
		for len(bs) < n {
			i := len(bs)
			b, err := New(Config{
				Principal:  "agent-a",
				Policy:     func() *policy.Policy { return pol },
				MeshPool:   pool,
				SocketPath: filepath.Join(dir, fmt.Sprintf("b%d.sock", i)),
				ListenAddr: netip.AddrFrom4([4]byte{127, 78, byte(i >> 8), byte(i + 1)}),
				Peer:       netip.MustParseAddr("127.0.0.1"),
				Metrics:    metrics,
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Start(); err != nil {
				t.Fatal(err)
			}
			bs = append(bs, b)
		}
		idle := measure()
		// One request through each boundary, then idle again.
		for i := range bs {
			meshRequest(t, filepath.Join(dir, fmt.Sprintf("b%d.sock", i)))
		}
		for _, b := range bs {
			testenv.WaitFor(t, 10*time.Second, "no active flow", func() bool { return b.Stats().Active == 0 })
		}
		time.Sleep(50 * time.Millisecond)
		used := measure()
		if n == 1 {
			// After its first flow: the pool's connection to the node is
			// the process's, counted here once, not against every boundary.
			first = used
		}
		t.Logf("%2d boundaries idle:          RSS %6.1f MiB, heap %5.2f MiB, stacks %4d KiB, %4d goroutines, %4d fds",
			n, mib(idle.rss), mib(idle.heap), idle.stack>>10, idle.goroutines, idle.fds)
		t.Logf("%2d boundaries after a flow:  RSS %6.1f MiB, heap %5.2f MiB, stacks %4d KiB, %4d goroutines, %4d fds",
			n, mib(used.rss), mib(used.heap), used.stack>>10, used.goroutines, used.fds)
		if n > 1 {
			k := float64(n - 1)
			heapStacks := (float64(idle.heap+idle.stack) - float64(first.heap+first.stack)) / k / 1024
			goroutines, fds := float64(idle.goroutines-first.goroutines)/k, float64(idle.fds-first.fds)/k
			t.Logf("   per additional boundary (idle, from 1 to %d): RSS %.1f KiB, heap+stacks %.1f KiB, %.1f goroutines, %.1f fds",
				n, (float64(idle.rss)-float64(first.rss))/k/1024, heapStacks, goroutines, fds)
			// The README's bound (issue 15: this test asserted nothing).
			// Goroutines and descriptors are counted, so exact: a socket and
			// four listeners, each with its accept loop; the Go heap and
			// stacks are the GC's, so the bound is twice the 66 KiB
			// measured at most. RSS is not asserted: the kernel's, noisy.
			if n == 64 && (goroutines > 5 || fds > 5 || heapStacks > 132) {
				t.Errorf("a boundary costs %.1f goroutines, %.1f fds and %.1f KiB of heap and stacks; the README says at most 5, 5 and 132 KiB", goroutines, fds, heapStacks)
			}
		}
	}
	var total time.Duration
	var count uint64
	for _, b := range bs {
		st := b.Stats()
		total += st.AdmissionTime
		count += st.Admissions
	}
	if count > 0 {
		t.Logf("mean admission (classify + policy + open the mesh): %v over %d flows", total/time.Duration(count), count)
	}
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// meshRequest makes one GET /v1/models through the SOCKS5 socket, by hand
// (no client library state kept between boundaries).
func meshRequest(t testing.TB, sock string) {
	t.Helper()
	c := dialSock(t, sock)
	defer c.Close()
	if rep := socksExchange(t, c, socksConnect("mesh.sam.alt", 80)); rep != 0 {
		t.Fatalf("reply %#x", rep)
	}
	var skip [6]byte
	io.ReadFull(c, skip[:])
	io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: mesh.sam.alt\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
}

// BenchmarkAdmission measures a flow's admission on the boundary's own
// clock: classify, decide, open the mesh — warm (the boundary holds an open
// connection to the node, as after its first mesh flow: nothing to dial)
// and cold (a dial each time); and a denial, which opens nothing.
func BenchmarkAdmission(b *testing.B) {
	mesh := newFakeMesh(b)
	pol := mustPolicy(b, testPolicy)
	bd, err := New(Config{Principal: "agent-a", Policy: func() *policy.Policy { return pol }, Mesh: mesh.dial, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	held, err := bd.pool.open(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name, host string
		warm       bool
	}{{"mesh.sam.alt/warm", "mesh.sam.alt", true}, {"mesh.sam.alt/cold", "mesh.sam.alt", false}, {"denied.example", "denied.example", false}} {
		if !c.warm && held != nil {
			held.Close()
			held = nil
		}
		b.Run(c.name, func(b *testing.B) {
			f := &flow{c: &fuzzConn{}}
			before := bd.Stats()
			for b.Loop() {
				a := bd.admit(f, c.host, 80)
				if a.far != nil {
					a.far.Close()
				}
				f.far = f.far[:0]
			}
			st := bd.Stats()
			if n := st.Admissions - before.Admissions; n > 0 {
				b.ReportMetric(float64((st.AdmissionTime-before.AdmissionTime).Nanoseconds())/float64(n), "admission-ns")
			}
		})
	}
}

// BenchmarkMeshRequest measures one agent request to mesh.sam.alt on a
// reused flow (keep-alive through the boundary's SOCKS5 socket), end to end
// against an in-process node: the boundary's per-request cost.
func BenchmarkMeshRequest(b *testing.B) {
	e := newEnv(b, "agent-a", netip.Addr{}, nil)
	c := e.httpClient(b)
	getModels(b, c)
}

// BenchmarkMeshNewFlow is BenchmarkMeshRequest with a new flow per request
// (a SOCKS5 handshake, an admission and a connection to the node each), as
// sam-bench --new-flow drives it.
func BenchmarkMeshNewFlow(b *testing.B) {
	e := newEnv(b, "agent-a", netip.Addr{}, nil)
	d := e.socksDialer(b, "unix", nil)
	c := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}, Timeout: 30 * time.Second}
	getModels(b, c)
}

// getModels is b's loop: GET http://mesh.sam.alt/v1/models through c, to
// the end of the body.
func getModels(b *testing.B, c *http.Client) {
	for b.Loop() {
		resp, err := c.Get("http://mesh.sam.alt/v1/models")
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// BenchmarkSOCKSRefusal is a refused flow end to end, as sam-bench
// boundary's refusal phase drives it: connect to the boundary's socket,
// greeting and a CONNECT to a name not granted in one write, both replies
// read, close. With -cpuprofile, the boundary's share is the serveProxy
// subtree (the rest is this client).
func BenchmarkSOCKSRefusal(b *testing.B) {
	e := newEnv(b, "agent-a", netip.Addr{}, nil)
	msg := socksConnect("denied.example", 80)
	addr := &net.UnixAddr{Name: e.sock, Net: "unix"}
	var rep [12]byte
	for b.Loop() {
		c, err := net.DialUnix("unix", nil, addr)
		if err != nil {
			b.Fatal(err)
		}
		c.Write(msg)
		if _, err := io.ReadFull(c, rep[:]); err != nil || rep[3] != 0x02 {
			b.Fatalf("% x %v", rep, err)
		}
		c.Close()
	}
}
