package daemon

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	sdnotify "github.com/coreos/go-systemd/v22/daemon"

	"sandstorm/internal/handoff"
	"sandstorm/internal/node"
)

// A reload (SIGHUP, `sandstormd reload`, `systemctl reload sandstormd`)
// re-executes the binary at sandstormd's path in the same PID and hands it
// every listening socket (internal/handoff), so that an upgrade of
// sandstormd refuses no connection (issue 18 item 3):
//
//  1. the binary at the path (the new one after an upgrade) must say it
//     speaks this handoff protocol (`sandstormd handoff-version`), else
//     the reload is refused and this process serves on;
//  2. every listener stops accepting but stays open (Registry.Pause): new
//     connections wait in the kernel's accept backlog, datagrams in their
//     socket's receive queue;
//  3. requests in flight are answered, for at most --reload-drain: the API
//     and the node's seam (http.Server.Shutdown; responses that stream —
//     server-sent events, log follows, the master's watch of a node — are
//     ended at once, their clients reconnect), the gateway
//     (gateway.Handover), transitions in flight (node.Handover);
//  4. execve(2) with the sockets' descriptors and a 0600 record of them.
//
// The next process adopts every sandbox as a restart does (reconcile) and
// takes each listener back as it opens it; a connection that waited is
// served then. The PID, the data dir's lock and the sandboxes' parent
// (this process is their subreaper) never change, so a service manager
// sees one main process throughout.

// HandoffVersion is what `sandstormd handoff-version` prints: the handoff
// protocol this binary speaks.
var HandoffVersion = strconv.Itoa(handoff.Version)

// DefaultReloadDrain bounds a reload's wait for requests in flight, as the
// gateway's drain before a checkpoint does (gateway.Config.DrainWait).
const DefaultReloadDrain = 5 * time.Second

// Ready is <data-dir>/sandstormd.ready: which exec of the daemon serves.
// `sandstormd reload` waits for its Exec to change.
type Ready struct {
	PID int `json:"pid"`
	// Exec names this exec of the process: the nonce of the handover that
	// started it, or a fresh one at a start.
	Exec   string    `json:"exec"`
	Binary string    `json:"binary"`
	Since  time.Time `json:"since"`
	// HandedOver is how many sockets this exec took from the previous one.
	HandedOver int `json:"handed_over"`
	// Refused says why the last reload asked of this exec was refused
	// (it serves on), and when.
	Refused   string    `json:"refused,omitempty"`
	RefusedAt time.Time `json:"refused_at,omitzero"`
}

const readyFile = "sandstormd.ready"

// ReadReady reads the readiness file of the daemon serving dataDir.
func ReadReady(dataDir string) (Ready, error) {
	var r Ready
	b, err := os.ReadFile(filepath.Join(dataDir, readyFile))
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(b, &r)
}

func writeReady(dataDir string, r Ready) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	path := filepath.Join(dataDir, readyFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func newNonce() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// serving says this exec serves: the readiness file for `sandstormd
// reload`, READY=1 for systemd (sd_notify(3); Type=notify).
func serving(o Options, log *slog.Logger) {
	exe, _ := os.Executable()
	r := Ready{PID: os.Getpid(), Exec: o.reg.From().Nonce, Binary: exe, Since: time.Now().UTC(), HandedOver: len(o.reg.From().Entries)}
	if r.Exec == "" {
		r.Exec = newNonce()
	}
	if err := writeReady(o.DataDir, r); err != nil {
		log.Warn("cannot write the readiness file `sandstormd reload` waits for", "err", err)
	}
	sdnotify.SdNotify(false, sdnotify.SdNotifyReady)
	if o.reg.From().Nonce != "" {
		log.Info("reload: serving as the new binary", "binary", exe, "sockets_handed_over", r.HandedOver)
	}
}

// refuseReload records a refused reload in the readiness file, where
// `sandstormd reload` reads why.
func refuseReload(o Options, log *slog.Logger, why error) {
	log.Error("reload refused; serving on as before", "err", why)
	r, err := ReadReady(o.DataDir)
	if err != nil || r.PID != os.Getpid() {
		return
	}
	r.Refused, r.RefusedAt = why.Error(), time.Now().UTC()
	writeReady(o.DataDir, r)
}

// preflight checks the binary at this process's path can take over: it
// runs and speaks this handoff protocol. An older binary would not know
// the descriptors it inherits and would find its addresses taken.
func preflight() (string, error) {
	exe, err := os.Executable() // a replaced file's new one: Go drops " (deleted)"
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, exe, "handoff-version").Output()
	if err != nil {
		return "", fmt.Errorf("%s handoff-version: %w: the binary at sandstormd's path cannot take the sockets over (use a stop and a start for it: systemctl restart sandstormd)", exe, err)
	}
	if v := strings.TrimSpace(string(out)); v != HandoffVersion {
		return "", fmt.Errorf("%s speaks handoff protocol %q, this process %s: use a stop and a start for it (systemctl restart sandstormd)", exe, v, HandoffVersion)
	}
	return exe, nil
}

// errReloadRefused: the reload did not start; the caller serves on.
var errReloadRefused = errors.New("reload refused")

// handover is step 2–4 above. servers are the HTTP servers to drain (their
// listeners are in the registry), streams their streaming responses, nd
// the node (nil on a master alone). It returns only if the reload did not
// happen: errReloadRefused (this process serves on as before) or the exec's
// failure (the sockets are closed; the caller stops, as on SIGTERM).
//
// ctx is the daemon's: a stop asked for during the handover (SIGTERM) is
// a stop, never lost across the exec.
func handover(ctx context.Context, o Options, log *slog.Logger, servers []*http.Server, streams *streamSet, nd *node.Node) error {
	exe, err := preflight()
	if err != nil {
		refuseReload(o, log, err)
		return errReloadRefused
	}
	start := time.Now()
	sdnotify.SdNotify(false, sdnotify.SdNotifyReloading)
	held := o.reg.Pause()
	log.Info("reload: listeners paused (connections wait in their backlogs); answering requests in flight", "sockets", held, "binary", exe, "drain", o.ReloadDrain)
	dctx, cancel := context.WithTimeout(context.Background(), o.ReloadDrain)
	defer cancel()
	var wg sync.WaitGroup
	ended := streams.end()
	for _, srv := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			drainServer(dctx, srv)
		}()
	}
	var nres node.HandoverResult
	if nd != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nres = nd.Handover(dctx, o.ReloadDrain)
		}()
	}
	wg.Wait()
	entries := o.reg.Held()
	log.Info("reload: executing the new binary", "binary", exe, "sockets", handoff.Describe(entries), "streams_ended", ended,
		"gateway_answered", nres.Gateway.Answered, "gateway_idle_closed", nres.Gateway.Idle, "gateway_cut", nres.Gateway.Cut,
		"boundary_flows_reset", nres.Flows, "sandboxes_still_moving", nres.Busy, "took", time.Since(start).Round(time.Millisecond))
	// Signals across the exec. SIGHUP is ignored until the new binary
	// handles it (an ignored disposition survives execve(2); Go's Notify
	// takes it back): its default would end the process. SIGTERM and
	// SIGINT get their default back, so one that arrives from here on
	// ends the process — a stop — rather than being caught here and lost
	// with this program; one caught before is a stop asked for during the
	// handover, done instead of the exec.
	signal.Ignore(syscall.SIGHUP)
	signal.Reset(syscall.SIGTERM, syscall.SIGINT)
	if ctx.Err() != nil {
		log.Info("reload: a stop was asked for during the handover; stopping instead")
		return nil
	}
	err = o.reg.Exec(o.DataDir, newNonce(), exe, os.Args, os.Environ())
	log.Error("reload: the exec failed; stopping (the sandboxes keep running; start sandstormd again)", "err", err)
	return err
}

// Reload asks the sandstormd serving dataDir to reload (SIGHUP) and waits
// until the new exec serves, the reload is refused, the process exits or
// ctx ends. It returns the readiness before and after.
func Reload(ctx context.Context, dataDir string) (before, after Ready, err error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "sandstormd.pid"))
	if err != nil {
		return before, after, fmt.Errorf("no sandstormd serves %s (%v): start one with: sandstormd serve --data-dir %s", dataDir, err, dataDir)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return before, after, fmt.Errorf("%s holds no PID", filepath.Join(dataDir, "sandstormd.pid"))
	}
	if !alive(pid) {
		return before, after, fmt.Errorf("sandstormd (PID %d, from %s) is not running", pid, filepath.Join(dataDir, "sandstormd.pid"))
	}
	before, err = ReadReady(dataDir)
	if err != nil || before.PID != pid {
		return before, after, fmt.Errorf("sandstormd (PID %d) does not serve yet, or predates reloads (no %s): wait for it to serve, or stop and start it", pid, filepath.Join(dataDir, readyFile))
	}
	sent := time.Now()
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return before, after, fmt.Errorf("signal sandstormd (PID %d): %w", pid, err)
	}
	// During execve(2) the PID may show as a zombie for a moment: when a
	// thread other than the leader execs, the leader is a zombie until the
	// exec'ing thread takes its PID over (de_thread). Only a process seen
	// gone for a second has exited. (Seen in CI: a reload that went
	// through, reported as an exit.)
	var goneSince time.Time
	for {
		if r, err := ReadReady(dataDir); err == nil && r.PID == pid {
			if r.Exec != before.Exec {
				return before, r, nil
			}
			if r.Refused != "" && !r.RefusedAt.Before(sent) { // this request's, not an earlier one's
				return before, r, fmt.Errorf("sandstormd (PID %d) refused the reload and serves on as before: %s", pid, r.Refused)
			}
		}
		switch {
		case alive(pid):
			goneSince = time.Time{}
		case goneSince.IsZero():
			goneSince = time.Now()
		case time.Since(goneSince) > time.Second:
			return before, after, fmt.Errorf("sandstormd (PID %d) exited during the reload; its sandboxes keep running: see its log, and start it again", pid)
		}
		select {
		case <-ctx.Done():
			return before, after, fmt.Errorf("sandstormd (PID %d) did not serve again within the wait: see its log (%w)", pid, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// drainServer answers what srv's connections, accepted before the pause,
// ask, then shuts it down; what is left when ctx ends is cut. Shutdown
// alone would drop a request read after it began, answering nothing
// (net/http's conn.serve: seen as curl's "empty reply" in
// TestReloadUnderTraffic), so it is called only once every connection has
// had its request answered. Meanwhile keep-alives are off: each answer
// says Connection: close, and idle connections are closed.
func drainServer(ctx context.Context, srv *http.Server) {
	srv.SetKeepAlivesEnabled(false)
	if t, ok := conns.Load(srv); ok {
		t.(*connTracker).waitAnswered(ctx)
	}
	if srv.Shutdown(ctx) != nil {
		srv.Close()
	}
}

// conns holds the connTracker of each server made drainable.
var conns sync.Map // *http.Server → *connTracker

// drainable tracks srv's connections (http.Server.ConnState) for a reload
// to wait on, and returns srv.
func drainable(srv *http.Server) *http.Server {
	t := &connTracker{fresh: map[net.Conn]time.Time{}}
	prev := srv.ConnState
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		t.set(c, st)
		if prev != nil {
			prev(c, st)
		}
	}
	conns.Store(srv, t)
	return srv
}

// connTracker knows which connections have not yet had a request read
// (StateNew) or have one being answered (StateActive), and whether its
// server's Serve still runs.
type connTracker struct {
	mu    sync.Mutex
	fresh map[net.Conn]time.Time // since when new; zero: active
	// serving counts the Serve calls of this server still running
	// (serveDrainable). A connection Serve has accepted is tracked only
	// once Serve has called ConnState(StateNew) for it, which it does
	// before it accepts again: so once Serve has returned — its listener
	// closed by the pause — every connection it took is in fresh.
	serving atomic.Int32
}

// serveDrainable is srv.Serve(ln) for a server made drainable, telling
// its tracker while it runs (connTracker.serving).
func serveDrainable(srv *http.Server, ln net.Listener) error {
	if t, ok := conns.Load(srv); ok {
		ct := t.(*connTracker)
		ct.serving.Add(1)
		defer ct.serving.Add(-1)
	}
	return srv.Serve(ln)
}

// serveWait bounds how long a drain waits for a server's Serve to return
// once its listener is closed: at once, in practice; a listener the pause
// did not close would otherwise hold the reload for its whole drain.
const serveWait = 500 * time.Millisecond

func (t *connTracker) set(c net.Conn, st http.ConnState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch st {
	case http.StateNew:
		t.fresh[c] = time.Now()
	case http.StateActive:
		t.fresh[c] = time.Time{}
	default:
		delete(t.fresh, c)
	}
}

// newConnWait is how long a connection that has sent nothing yet is
// waited for: a client sends its request right after it connects; one
// silent for longer is taken for idle (as Shutdown takes one silent for
// 5 s), so a stray open connection does not hold a reload up.
const newConnWait = time.Second

// waitAnswered waits until no connection is new (for less than
// newConnWait) or active, or ctx ends — first, for up to serveWait, until
// the server's Serve has returned: a connection accepted just before the
// pause closed the listener but not yet tracked would otherwise be missed,
// its request read after Shutdown began and dropped unanswered (net/http's
// conn.serve returns once the server is shutting down: curl's "empty
// reply" in TestReloadUnderTraffic, CI at 9c2466b).
func (t *connTracker) waitAnswered(ctx context.Context) {
	for until := time.Now().Add(serveWait); t.serving.Load() > 0 && time.Now().Before(until); {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Millisecond):
		}
	}
	for {
		t.mu.Lock()
		n := 0
		for _, since := range t.fresh {
			if since.IsZero() || time.Since(since) < newConnWait {
				n++
			}
		}
		t.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// streamSet ends streaming responses at a reload. A response whose handler
// has flushed is a stream (server-sent events, a log follow, a node's
// report stream, a long envd call's output): it may never end by itself,
// so a reload cancels its request's context and its client reconnects. A
// response that has not flushed is an ordinary request and is waited for.
type streamSet struct {
	mu      sync.Mutex
	closing bool
	live    map[*streamReq]struct{}
}

type streamReq struct {
	cancel    context.CancelFunc
	streaming atomic.Bool
}

func newStreamSet() *streamSet { return &streamSet{live: map[*streamReq]struct{}{}} }

func (s *streamSet) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		sr := &streamReq{cancel: cancel}
		s.mu.Lock()
		s.live[sr] = struct{}{}
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			delete(s.live, sr)
			s.mu.Unlock()
		}()
		h.ServeHTTP(&streamWriter{ResponseWriter: w, set: s, req: sr}, r.WithContext(ctx))
	})
}

// end cancels every stream, and any response that starts streaming from
// now on; it returns how many it ended.
func (s *streamSet) end() int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	n := 0
	for sr := range s.live {
		if sr.streaming.Load() {
			sr.cancel()
			n++
		}
	}
	return n
}

// streamWriter notes a flush. It passes Flush and Hijack on, and Unwrap
// gives http.ResponseController the writer beneath.
type streamWriter struct {
	http.ResponseWriter
	set *streamSet
	req *streamReq
}

func (w *streamWriter) Flush() {
	w.req.streaming.Store(true)
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
	w.set.mu.Lock()
	closing := w.set.closing
	w.set.mu.Unlock()
	if closing {
		w.req.cancel()
	}
}

func (w *streamWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if h, ok := w.ResponseWriter.(http.Hijacker); ok {
		return h.Hijack()
	}
	return nil, nil, errors.New("this connection cannot be taken over")
}

func (w *streamWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
