package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/client"
)

// reply is a whole HTTP answer.
type reply struct {
	Status int
	Header http.Header
	Body   string
}

// mustLocal refuses any URL whose host is not 127.0.0.1: the tests only
// ever talk to the daemon under test and its gateway.
func mustLocal(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Hostname() == "127.0.0.1" {
		return nil
	}
	// The fleet's machines: network namespaces the test made itself
	// (fleetMachine), at 10.188.<k>.2.
	if a, err := netip.ParseAddr(u.Hostname()); err == nil && (fleetNet.Contains(a) || fleetUpNet.Contains(a) || meshGatewayNet.Contains(a) || sshHostNet.Contains(a)) {
		return nil
	}
	return fmt.Errorf("refusing to send a request to %s: tests only talk to 127.0.0.1 and to their own network namespaces", raw)
}

// apiTLS maps a daemon's API host:port to a TLS configuration trusting its
// CA (the API is HTTPS with a certificate from the daemon's own CA).
var apiTLS sync.Map

// trustAPI makes call trust the CA in caFile for the API at apiURL.
func trustAPI(apiURL, caFile string) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return
	}
	pool := x509.NewCertPool()
	if pool.AppendCertsFromPEM(b) {
		u, _ := url.Parse(apiURL)
		apiTLS.Store(u.Host, &tls.Config{RootCAs: pool})
	}
}

// fleetNet holds the addresses of the fleet test's machines.
var fleetNet = netip.MustParsePrefix("10.188.0.0/16")

// fleetUpNet holds the links of the nodes fleet up makes in namespaces
// of its own (10.186.<k>.0/24, internal/fleetup), and meshGatewayNet the
// link of the mesh test's node A (its gateway's address).
var (
	fleetUpNet     = netip.MustParsePrefix("10.186.0.0/16")
	meshGatewayNet = netip.MustParsePrefix("10.199.78.0/24")
	// sshHostNet: the links of TestFleetUpHosts's hosts (10.191.<k>.0/24,
	// startSSHHost) and the sandbox pools of their nodes.
	sshHostNet = netip.MustParsePrefix("10.191.0.0/16")
)

// call sends one request on a connection of its own (no keep-alive, so no
// idle connection into a sandbox lingers) and reads the whole answer.
func call(method, rawURL string, hdr http.Header, body io.Reader, timeout time.Duration) (reply, error) {
	if err := mustLocal(rawURL); err != nil {
		return reply{}, err
	}
	tr := &http.Transport{DisableKeepAlives: true, Proxy: nil}
	if strings.HasPrefix(rawURL, "https://") {
		u, _ := url.Parse(rawURL)
		cfg, ok := apiTLS.Load(u.Host)
		if !ok {
			return reply{}, fmt.Errorf("no CA known for %s (trustAPI)", u.Host)
		}
		tr.TLSClientConfig = cfg.(*tls.Config)
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: timeout}
	req, err := http.NewRequest(method, rawURL, body)
	if err != nil {
		return reply{}, err
	}
	for k, vs := range hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}, err
}

// endpoint returns the gateway URL of the sandbox's port 8000.
func endpoint(t *testing.T, sb api.Sandbox) string {
	t.Helper()
	ep, ok := sb.Endpoints["8000"]
	if !ok {
		t.Fatalf("sandbox %s has no endpoint for port 8000: %v", sb.ID, sb.Endpoints)
	}
	if err := mustLocal(ep); err != nil {
		t.Fatalf("sandbox %s: endpoint %q: %v", sb.ID, ep, err)
	}
	return ep
}

var countRE = regexp.MustCompile(`^count=(\d+) pid=\d+`)

func parseCount(body string) (int, error) {
	m := countRE.FindStringSubmatch(body)
	if m == nil {
		return 0, fmt.Errorf("answer %q is not the demo's \"count=N pid=P\"", body)
	}
	return strconv.Atoi(m[1])
}

// getBody GETs path from a gateway endpoint with Go's net/http and returns
// the body of a 200 answer.
func getBody(t *testing.T, ep, path string) string {
	t.Helper()
	r, err := call(http.MethodGet, ep+path, nil, nil, gatewayTimeout)
	if err != nil {
		t.Fatalf("GET %s%s: %v", ep, path, err)
	}
	if r.Status != http.StatusOK {
		t.Fatalf("GET %s%s: HTTP %d: %s", ep, path, r.Status, r.Body)
	}
	return r.Body
}

// getCount GETs / through the gateway and returns the demo's counter.
func getCount(t *testing.T, ep string) int {
	t.Helper()
	n, err := parseCount(getBody(t, ep, "/"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// curlCount does the same with curl.
func curlCount(t *testing.T, ep string) int {
	t.Helper()
	args := []string{"-sS", "--noproxy", "*", "--max-time", "60", "-w", "\n%{http_code}"}
	if u, _ := url.Parse(ep); u != nil && strings.HasSuffix(u.Hostname(), ".localhost") {
		// A Host-routed endpoint: the name is loopback by RFC 6761, and
		// pinned to 127.0.0.1 here so no resolver is ever asked.
		args = append(args, "--resolve", u.Hostname()+":"+u.Port()+":127.0.0.1")
	} else if err := mustLocal(ep); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("curl", append(args, ep+"/")...).CombinedOutput()
	if err != nil {
		t.Fatalf("curl %s/: %v: %s", ep, err, out)
	}
	s := strings.TrimSpace(string(out))
	i := strings.LastIndex(s, "\n")
	body, code := strings.TrimSpace(s[:max(i, 0)]), s[i+1:]
	if code != "200" {
		t.Fatalf("curl %s/: HTTP %s: %s", ep, code, body)
	}
	n, err := parseCount(body)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// expectCount checks the counter a GET returns.
func expectCount(t *testing.T, ep string, want int, why string) {
	t.Helper()
	if got := getCount(t, ep); got != want {
		t.Fatalf("%s: GET / answered count=%d, want %d", why, got, want)
	}
}

// expectAPIError checks that err is an API error with this status and
// code, and a message.
func expectAPIError(t *testing.T, err error, status int, code string) *client.Error {
	t.Helper()
	var e *client.Error
	if !errors.As(err, &e) {
		t.Fatalf("want API error %d %s, got %v", status, code, err)
	}
	if e.Status != status || e.Body.Code != code || e.Body.Message == "" {
		t.Fatalf("want HTTP %d with code %q and a message, got HTTP %d code %q message %q", status, code, e.Status, e.Body.Code, e.Body.Message)
	}
	return e
}

// raw sends a request to the API with the given token ("" for none).
func (d *Daemon) raw(t *testing.T, method, path, token, contentType string, body io.Reader) reply {
	t.Helper()
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	r, err := call(method, d.API+path, h, body, 5*time.Minute)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// expectErrorReply checks an answer is status with a JSON {code, message}.
func expectErrorReply(t *testing.T, r reply, status int, code string) api.Error {
	t.Helper()
	var e api.Error
	if err := json.Unmarshal([]byte(r.Body), &e); err != nil {
		t.Fatalf("want HTTP %d %s as JSON {code, message}; got HTTP %d with body %q", status, code, r.Status, r.Body)
	}
	if r.Status != status || e.Code != code || e.Message == "" {
		t.Fatalf("want HTTP %d with code %q and a message; got HTTP %d code %q message %q", status, code, r.Status, e.Code, e.Message)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("error answer has Content-Type %q, want application/json", ct)
	}
	return e
}

func itoa(i int) string { return strconv.Itoa(i) }
