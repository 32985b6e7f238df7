package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/memguard"
)

// TestConcurrentCreates: 200 sandboxes created through the API at the same
// moment all succeed, each with an address and endpoint of its own, a
// sample of them answers through the gateway, and 200 deletes at once leave
// nothing behind. Every create makes a network namespace and veth and
// addresses it while the others do the same, which is what made netlink
// address dumps come back interrupted (NLM_F_DUMP_INTR) and creates fail
// with HTTP 500 "results may be incomplete or inconsistent".
func TestConcurrentCreates(t *testing.T) {
	const n = 200
	const sampleEvery = 10 // probe every 10th sandbox through the gateway
	gw := pickGatewayPorts(t, n)
	d := startDaemon(t, "--gateway-ports", gw)
	d.GwPorts = gw
	// The agent: a static Go binary answering /healthz, the smallest
	// sandbox there is to have 200 of.
	d.registerAgent(t)
	memBefore := memAvailableMiB(t)
	// The least memory available at any moment of the test, for its log.
	low := memguard.WatchLow(250 * time.Millisecond)
	defer func() {
		minAvail := low.Stop()
		t.Logf("MemAvailable: %d MiB before the creates, %d MiB at the lowest (%d MiB used by %d sandboxes at the peak)", memBefore, minAvail, memBefore-minAvail, n)
	}()

	// All n at once: the point is as many netns creations at the same
	// moment as possible.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var (
		wg    sync.WaitGroup
		sbs   = make([]api.Sandbox, n)
		errs  = make([]error, n)
		start = make(chan struct{})
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			sb, err := d.C.CreateSandbox(ctx, api.SandboxRequest{Template: "agent", Name: fmt.Sprintf("conc-%03d", i)})
			if err == nil {
				d.track(sb.ID)
			}
			sbs[i], errs[i] = sb, err
		}()
	}
	began := time.Now()
	close(start)
	wg.Wait()
	createTook := time.Since(began)
	var failed []string
	for i, err := range errs {
		if err != nil {
			failed = append(failed, fmt.Sprintf("conc-%03d: %v", i, err))
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d concurrent creates failed (in %v):\n%s", len(failed), n, createTook.Round(time.Millisecond), strings.Join(failed, "\n"))
	}
	t.Logf("%d concurrent creates in %v", n, createTook.Round(time.Millisecond))

	// Each is hot, with an address and a gateway endpoint no other has.
	addrs, eps := map[string]string{}, map[string]string{}
	for _, sb := range sbs {
		if sb.Tier != api.TierHot {
			t.Errorf("sandbox %s (%s) is %q, want hot", sb.ID, sb.Name, sb.Tier)
		}
		if sb.Address == "" {
			t.Errorf("sandbox %s (%s) has no address", sb.ID, sb.Name)
		} else if other, dup := addrs[sb.Address]; dup {
			t.Errorf("sandboxes %s and %s share address %s", other, sb.Name, sb.Address)
		}
		addrs[sb.Address] = sb.Name
		ep := endpoint(t, sb)
		if other, dup := eps[ep]; dup {
			t.Errorf("sandboxes %s and %s share endpoint %s", other, sb.Name, ep)
		}
		eps[ep] = sb.Name
	}

	// A sample answers through its gateway endpoint (all at once, too).
	var probeErrs []string
	var mu sync.Mutex
	for i := 0; i < n; i += sampleEvery {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb := sbs[i]
			r, err := call(http.MethodGet, sb.Endpoints["8000"]+"/healthz", nil, nil, gatewayTimeout)
			if err == nil && (r.Status != http.StatusOK || r.Body != "ok") {
				err = fmt.Errorf("HTTP %d: %q", r.Status, r.Body)
			}
			if err != nil {
				mu.Lock()
				probeErrs = append(probeErrs, fmt.Sprintf("%s (%s): GET /healthz: %v", sb.Name, sb.Endpoints["8000"], err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Strings(probeErrs)
	for _, e := range probeErrs {
		t.Error(e)
	}

	// All deleted at once, and nothing of any of them is left.
	began = time.Now()
	for i, sb := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d.C.DeleteSandbox(ctx, sb.ID)
		}()
	}
	wg.Wait()
	deleteTook := time.Since(began)
	for i, err := range errs {
		if err != nil {
			t.Errorf("delete %s (%s): %v", sbs[i].ID, sbs[i].Name, err)
		}
	}
	left, err := d.C.Sandboxes(ctx)
	if err != nil {
		t.Fatalf("list sandboxes: %v", err)
	}
	for _, sb := range left {
		t.Errorf("sandbox %s (%s) still listed after its delete", sb.ID, sb.Name)
	}
	for _, sb := range sbs {
		d.assertGone(t, sb.ID)
	}
	t.Logf("%d concurrent deletes in %v", n, deleteTook.Round(time.Millisecond))
}
