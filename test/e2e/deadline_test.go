package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sandstorm/api"
)

// TestDeleteOutlivesItsClient: a client that gives up on a DELETE half-way
// (here after 20 ms, long before runsc, the netns and the mounts are gone)
// does not leave half a sandbox behind: the delete runs to its end, and a
// second DELETE meanwhile waits for it and succeeds or finds it gone.
func TestDeleteOutlivesItsClient(t *testing.T) {
	d := startDaemon(t)
	d.registerWeb(t, "web")
	cutShort := 0
	for i, impatient := range []time.Duration{20 * time.Millisecond, 200 * time.Millisecond} {
		sb := d.create(t, "web", "gone-"+string(rune('a'+i)))
		expectCount(t, endpoint(t, sb), 1, "first call")
		// The TLS handshake is done first, on a connection kept alive,
		// so that the impatience cuts the DELETE short, not the handshake.
		tr := d.C.HTTP.Transport.(*http.Transport).Clone()
		c := &http.Client{Transport: tr}
		warm, _ := http.NewRequest("GET", d.API+"/v1/node", nil)
		warm.Header.Set("Authorization", "Bearer "+d.Token)
		if resp, err := c.Do(warm); err != nil {
			t.Fatal(err)
		} else {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		ictx, cancel := context.WithTimeout(context.Background(), impatient)
		req, _ := http.NewRequestWithContext(ictx, "DELETE", d.API+"/v1/sandboxes/"+sb.ID, nil)
		req.Header.Set("Authorization", "Bearer "+d.Token)
		resp, err := c.Do(req)
		cancel()
		tr.CloseIdleConnections()
		if err == nil {
			resp.Body.Close()
			t.Logf("the DELETE answered within %v (HTTP %d); the disconnect came too late to test anything", impatient, resp.StatusCode)
		} else {
			cutShort++
		}
		// A second DELETE while the first runs: 204 once it is gone, or 404.
		r := d.raw(t, "DELETE", "/v1/sandboxes/"+sb.ID, d.Token, "", nil)
		if r.Status != http.StatusNoContent && r.Status != http.StatusNotFound {
			t.Errorf("second DELETE: HTTP %d %s", r.Status, r.Body)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			r := d.raw(t, "GET", "/v1/sandboxes/"+sb.ID, d.Token, "", nil)
			if r.Status == http.StatusNotFound {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox %s still there a minute after its client gave up on the DELETE: HTTP %d %s", sb.ID, r.Status, r.Body)
			}
			time.Sleep(50 * time.Millisecond)
		}
		d.assertGone(t, sb.ID)
	}
	if cutShort == 0 {
		t.Error("no DELETE was cut short by its client: this run tested nothing")
	}
	if !strings.Contains(d.logTail(200), "sandbox deleted") {
		t.Error("no delete in the log")
	}
	if sbs, err := d.C.Sandboxes(ctxT(t)); err != nil || len(sbs) != 0 {
		t.Errorf("sandboxes left: %v %v", sbs, err)
	}
}

// sandboxPid is the pid of sandbox id's runsc-sandbox process, from runsc's
// state file.
func (d *Daemon) sandboxPid(t *testing.T, id string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(d.DataDir, "runsc", id+"_sandbox:"+id+".state"))
	if err != nil {
		t.Fatalf("runsc state of %s: %v", id, err)
	}
	var st struct {
		Sandbox struct {
			Pid int `json:"pid"`
		} `json:"sandbox"`
	}
	if err := json.Unmarshal(data, &st); err != nil || st.Sandbox.Pid <= 0 {
		t.Fatalf("runsc state of %s names no pid: %v %s", id, err, data)
	}
	return st.Sandbox.Pid
}

// stopSandbox SIGSTOPs a sandbox's runsc-sandbox process: every runsc
// command that needs it (state, checkpoint, delete) then hangs. The test
// kills whatever is left stopped at its end.
func (d *Daemon) stopSandbox(t *testing.T, id string) {
	t.Helper()
	pid := d.sandboxPid(t, id)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
}

// TestHungRunsc: a sandbox whose runsc sandbox process is stopped (so that
// runsc commands to it never return) does not hang the node: a snapshot of
// it ends within the backend's deadlines and leaves it in a tier that is
// true, a restart opens the API at once and repairs it without holding up
// the others, and a delete of another stopped one completes and leaves
// nothing behind.
func TestHungRunsc(t *testing.T) {
	d := startDaemon(t)
	d.registerWeb(t, "web")
	a := d.create(t, "web", "hung-a")
	b := d.create(t, "web", "hung-b")
	c := d.create(t, "web", "fine-c")
	for _, sb := range []api.Sandbox{a, b, c} {
		expectCount(t, endpoint(t, sb), 1, sb.Name+": first call")
	}

	// A snapshot of a hung sandbox ends, and says what happened.
	d.stopSandbox(t, a.ID)
	start := time.Now()
	_, err := d.C.Transition(ctxT(t), a.ID, "snapshot")
	took := time.Since(start)
	got := d.get(t, a.ID)
	t.Logf("snapshot of a stopped sandbox: %v after %v; tier %s, note %q", err, took.Round(time.Millisecond), got.Tier, got.Note)
	if took > 2*time.Minute {
		t.Errorf("the snapshot took %v", took)
	}
	if got.Transition != "" || got.Note == "" {
		t.Errorf("after the snapshot: tier %s, transition %q, note %q; want a settled tier and a note", got.Tier, got.Transition, got.Note)
	}
	expectCount(t, endpoint(t, c), 2, "the other sandbox meanwhile")

	// A restart with b hung: the API answers at once, the repair of b does
	// not hold up c's, and ends within its deadlines.
	d.stopSandbox(t, b.ID)
	d.Kill(t)
	d.noWaitReconcile = true
	start = time.Now()
	d.Start(t)
	if up := time.Since(start); up > 15*time.Second {
		t.Errorf("the API took %v to answer after the restart", up)
	}
	if _, err := d.C.Sandbox(ctxT(t), c.ID); err != nil {
		t.Errorf("GET of a sandbox during the repair: %v", err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		st, err := d.C.Node(ctxT(t))
		if err == nil && st.Reconciling == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still reconciling 3 minutes after the restart: %+v %v", st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	d.noWaitReconcile = false
	t.Logf("repair after the restart: %v", time.Since(start).Round(time.Millisecond))
	gb := d.get(t, b.ID)
	if gb.Transition != "" || gb.Tier == api.TierHot && gb.Note == "" {
		t.Errorf("the hung sandbox after the restart: tier %s, transition %q, note %q", gb.Tier, gb.Transition, gb.Note)
	}
	expectCount(t, endpoint(t, c), 3, "the other sandbox after the restart")

	// A delete of a hung sandbox completes and leaves nothing.
	if gb.Tier == api.TierHot || gb.Tier == api.TierFrozen {
		d.stopSandbox(t, b.ID)
	} else {
		expectCount(t, endpoint(t, b), 1, "the repaired sandbox, cold-started")
		d.stopSandbox(t, b.ID)
	}
	start = time.Now()
	if err := d.C.DeleteSandbox(ctxT(t), b.ID); err != nil {
		t.Fatalf("delete of a stopped sandbox: %v", err)
	}
	t.Logf("delete of a stopped sandbox: %v", time.Since(start).Round(time.Millisecond))
	if took := time.Since(start); took > time.Minute {
		t.Errorf("the delete took %v", took)
	}
	d.assertGone(t, b.ID)
}
