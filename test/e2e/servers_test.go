package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/testenv"
)

// server is a template whose GET / answers "count=N pid=P", N counting up
// with every call on a new connection: that it goes on counting across a
// freeze or a snapshot proves the memory was kept.
type server struct {
	name, rootfs string
	args, env    []string
}

// servers are the kinds of server that must survive every tier (issue 8):
// Go (the mesh tests' agent), Node.js and nginx, whose listeners are
// watched by epoll (runsc 2022-12 could not checkpoint them at all), and
// Python's poll()-based http.server.
func servers() []server {
	return []server{
		{"go", agentRootfs, []string{"/agent"}, nil},
		{"node", nodeRootfs, nodeDemo.Args, nodeDemo.Env},
		{"nginx", nginxRootfs, nginxDemo.Args, nginxDemo.Env},
		{"python", webRootfs, webDemo.Args, webDemo.Env},
	}
}

// start registers s as a template of its name on d and starts a sandbox
// of it called name.
func (s server) start(t *testing.T, d *Daemon, name string) api.Sandbox {
	t.Helper()
	if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: s.name, RootfsDir: s.rootfs,
		Process: api.Process{Args: s.args, Env: s.env}, Ports: []int{8000}}); err != nil {
		t.Fatal(err)
	}
	return d.create(t, s.name, name)
}

// TestServersThroughEveryTier: each server goes through 20 freezes and 20
// snapshots with its memory kept; after each restore it takes 200 new
// connections, four at a time, and answers every one with the next count.
func TestServersThroughEveryTier(t *testing.T) {
	d := startDaemon(t)
	for _, s := range servers() {
		t.Run(s.name, func(t *testing.T) {
			sb := s.start(t, d, s.name+"-tiers")
			ep := endpoint(t, sb)
			n := getCount(t, ep)
			for i := 1; i <= 20; i++ {
				d.transition(t, sb.ID, "freeze", api.TierFrozen)
				n++
				expectCount(t, ep, n, fmt.Sprintf("%s, freeze %d", s.name, i))
			}
			for i := 1; i <= 20; i++ {
				d.transition(t, sb.ID, "snapshot", api.TierSnapshot)
				counts, err := burst(ep, 200, 4)
				if err != nil {
					t.Fatalf("%s, snapshot %d: %v", s.name, i, err)
				}
				if counts[0] != n+1 || counts[len(counts)-1] != n+200 {
					t.Fatalf("%s, snapshot %d: the 200 calls after the restore counted %d..%d, want %d..%d (memory lost, or a call missed)",
						s.name, i, counts[0], counts[len(counts)-1], n+1, n+200)
				}
				n += 200
				if got := d.get(t, sb.ID); got.LastWakeFrom != api.TierSnapshot || got.Note != "" {
					t.Fatalf("%s, snapshot %d: last wake from %q, note %q", s.name, i, got.LastWakeFrom, got.Note)
				}
			}
			d.deleteSandbox(t, sb.ID)
		})
	}
}

// burst makes total calls to ep, each on a new connection, workers at a
// time, and returns their counts sorted; any call that fails fails it.
func burst(ep string, total, workers int) ([]int, error) {
	var mu sync.Mutex
	var counts []int
	var firstErr error
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(total) {
				r, err := call(http.MethodGet, ep+"/", nil, nil, gatewayTimeout)
				var c int
				if err == nil && r.Status != http.StatusOK {
					err = fmt.Errorf("HTTP %d: %s", r.Status, r.Body)
				}
				if err == nil {
					c, err = parseCount(r.Body)
				}
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				counts = append(counts, c)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Ints(counts)
	for i := 1; i < len(counts); i++ {
		if counts[i] == counts[i-1] && firstErr == nil {
			firstErr = fmt.Errorf("count %d answered twice", counts[i])
		}
	}
	return counts, firstErr
}

// TestNoRequestLostToASnapshot: six clients call a sandbox in a loop, three
// over kept-alive connections and three on a new connection each time,
// while it is snapshot ten times. Every request is answered: those that
// arrive during a checkpoint wait for it and then wake the sandbox; those
// in flight when it starts are answered first.
func TestNoRequestLostToASnapshot(t *testing.T) {
	d := startDaemon(t)
	for _, s := range []server{servers()[0], servers()[3]} { // Go and Python
		t.Run(s.name, func(t *testing.T) {
			sb := s.start(t, d, s.name+"-load")
			ep := endpoint(t, sb)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var calls, failures atomic.Int64
			var errMu sync.Mutex
			var firstErr error
			for i := 0; i < 6; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// By hand, not net/http's client: it would quietly
					// retry a GET cut on a reused connection.
					var kc *keptConn
					defer func() { kc.close() }()
					for {
						select {
						case <-stop:
							return
						default:
						}
						var err error
						if i%2 == 0 {
							if kc == nil {
								kc, err = dialKept(ep)
							}
							var again bool
							if err == nil {
								again, err = kc.get()
							}
							if err != nil || !again {
								kc.close()
								kc = nil
							}
						} else {
							err = getNew(ep)
						}
						calls.Add(1)
						if err != nil {
							failures.Add(1)
							errMu.Lock()
							if firstErr == nil {
								firstErr = err
							}
							errMu.Unlock()
						}
					}
				}()
			}
			for i := 1; i <= 10; i++ {
				before := calls.Load()
				testenv.WaitFor(t, 30*time.Second, "the clients' calls go on", func() bool { return calls.Load() >= before+30 })
				d.transition(t, sb.ID, "snapshot", api.TierSnapshot)
			}
			close(stop)
			wg.Wait()
			got := d.get(t, sb.ID)
			t.Logf("%s: %d calls during 10 snapshots, %d failed; last wake from %s", s.name, calls.Load(), failures.Load(), got.LastWakeFrom)
			if f := failures.Load(); f > 0 {
				t.Errorf("%d of %d calls failed; the first: %v", f, calls.Load(), firstErr)
			}
			d.deleteSandbox(t, sb.ID)
		})
	}
}

// keptConn is one kept-alive HTTP/1.1 connection to a gateway endpoint.
type keptConn struct {
	c  net.Conn
	br *bufio.Reader
}

func dialKept(ep string) (*keptConn, error) {
	if err := mustLocal(ep); err != nil {
		return nil, err
	}
	u, _ := url.Parse(ep)
	c, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &keptConn{c: c, br: bufio.NewReader(c)}, nil
}

// get sends GET / and reads the whole answer, which must be a count. It
// reports whether the server keeps the connection open for another (an
// HTTP/1.0 server like Python's http.server closes it).
func (k *keptConn) get() (again bool, err error) {
	k.c.SetDeadline(time.Now().Add(gatewayTimeout))
	if _, err := io.WriteString(k.c, "GET / HTTP/1.1\r\nHost: sandbox\r\n\r\n"); err != nil {
		return false, err
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		return false, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return false, err
	}
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("%s %v: %s", resp.Status, resp.Header, b)
	}
	_, err = parseCount(string(b))
	return !resp.Close, err
}

func (k *keptConn) close() {
	if k != nil {
		k.c.Close()
	}
}

// getNew calls GET / on a connection of its own.
func getNew(ep string) error {
	r, err := call(http.MethodGet, ep+"/", nil, nil, gatewayTimeout)
	if err != nil {
		return err
	}
	if r.Status != http.StatusOK {
		return fmt.Errorf("HTTP %d: %s", r.Status, r.Body)
	}
	_, err = parseCount(r.Body)
	return err
}

// TestVolumeSurvivesEveryTier: what a sandbox writes to its filesystem is
// in its volume, so it is still there after a snapshot and after a detach
// and cold start, when its memory is gone. (A current runsc keeps a
// sandbox's writes in an overlay of its own unless told not to; they
// would be lost with the container.)
func TestVolumeSurvivesEveryTier(t *testing.T) {
	d := startDaemon(t)
	d.registerAgent(t)
	sb := d.create(t, "agent", "writer")
	ep := endpoint(t, sb)
	if got := getBody(t, ep, "/file?path=/note&write=kept"); got != "written" {
		t.Fatalf("write: %q", got)
	}
	for _, step := range []struct {
		op   string
		tier api.Tier
	}{{"freeze", api.TierFrozen}, {"snapshot", api.TierSnapshot}, {"detach", api.TierDetached}} {
		d.transition(t, sb.ID, step.op, step.tier)
		if got := getBody(t, ep, "/file?path=/note"); got != "kept" {
			t.Fatalf("after %s and a wake, /note reads %q, want \"kept\"", step.op, got)
		}
	}
	if got := d.get(t, sb.ID); got.LastWakeFrom != api.TierDetached {
		t.Errorf("last wake from %q, want detached (a cold start)", got.LastWakeFrom)
	}
}
