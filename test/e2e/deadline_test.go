package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestDeleteOutlivesItsClient: a client that gives up on a DELETE half-way
// (here after 20 ms, long before runsc, the netns and the mounts are gone)
// does not leave half a sandbox behind: the delete runs to its end, and a
// second DELETE meanwhile waits for it and succeeds or finds it gone.
func TestDeleteOutlivesItsClient(t *testing.T) {
	d := startDaemon(t)
	d.registerWeb(t, "web")
	for i, impatient := range []time.Duration{20 * time.Millisecond, 200 * time.Millisecond} {
		sb := d.create(t, "web", "gone-"+string(rune('a'+i)))
		expectCount(t, endpoint(t, sb), 1, "first call")
		c := &http.Client{Timeout: impatient}
		req, _ := http.NewRequest("DELETE", d.API+"/v1/sandboxes/"+sb.ID, nil)
		req.Header.Set("Authorization", "Bearer "+d.Token)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			t.Logf("the DELETE answered within %v (HTTP %d); the disconnect came too late to test anything", impatient, resp.StatusCode)
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
	if !strings.Contains(d.logTail(200), "sandbox deleted") {
		t.Error("no delete in the log")
	}
	if sbs, err := d.C.Sandboxes(ctxT(t)); err != nil || len(sbs) != 0 {
		t.Errorf("sandboxes left: %v %v", sbs, err)
	}
}
