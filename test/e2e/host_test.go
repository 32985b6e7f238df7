package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/testenv"
)

// TestHostRouting: with --gateway-host-listen, one listener reaches every
// sandbox's port by Host (http://<port>-<name>.sandbox.localhost:<port>/),
// waking it from any tier; curl resolves *.localhost to loopback by
// itself (RFC 6761). An unknown name is a 404.
func TestHostRouting(t *testing.T) {
	hostPort := testenv.FreePort(t)
	d := startDaemon(t, "--gateway-host-listen", "127.0.0.1:"+itoa(hostPort))
	d.registerWeb(t, "web")
	a := d.create(t, "web", "alpha")
	b := d.create(t, "web", "beta")
	for _, sb := range []api.Sandbox{a, b} {
		want := "http://8000-" + sb.Name + ".sandbox.localhost:" + itoa(hostPort)
		if got := sb.HostEndpoints["8000"]; got != want {
			t.Fatalf("%s: host endpoint %q, want %q", sb.Name, got, want)
		}
	}
	d.transition(t, a.ID, "snapshot", api.TierSnapshot)
	// Through the Host-routed listener, with the Host the endpoint names,
	// sent to loopback only.
	byHost := func(sb api.Sandbox) int {
		t.Helper()
		body, status, err := getByHost(sb.HostEndpoints["8000"])
		if err != nil || status != 200 {
			t.Fatalf("%s by Host: %v %d %s", sb.Name, err, status, body)
		}
		n, err := parseCount(body)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := byHost(a); n != 1 {
		t.Errorf("alpha (from snapshot) by Host answered count=%d, want 1", n)
	}
	if got := d.get(t, a.ID); got.Tier != api.TierHot || got.LastWakeFrom != api.TierSnapshot {
		t.Errorf("alpha after a request by Host: %s, woken from %s", got.Tier, got.LastWakeFrom)
	}
	byHost(b)
	if n := byHost(b); n != 2 {
		t.Errorf("beta's second call by Host: count=%d, want 2", n)
	}
	// And curl, which resolves the name itself.
	out := curlCount(t, b.HostEndpoints["8000"])
	if out != 3 {
		t.Errorf("curl by name: count=%d, want 3", out)
	}
	body, status, err := getByHost("http://8000-nobody.sandbox.localhost:" + itoa(hostPort))
	if err != nil || status != http.StatusNotFound || !strings.Contains(body, "<port>-<sandbox") {
		t.Errorf("unknown sandbox by Host: %v %d %s", err, status, body)
	}
}

// getByHost GETs raw/ with its host name as the Host, connecting to
// 127.0.0.1 whatever the name (the tests talk to loopback only).
func getByHost(raw string) (string, int, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", 0, err
	}
	tr := &http.Transport{Proxy: nil, DisableKeepAlives: true, DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, "127.0.0.1:"+u.Port())
	}}
	resp, err := (&http.Client{Transport: tr, Timeout: gatewayTimeout}).Get(raw + "/")
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode, err
}
