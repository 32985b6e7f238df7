package e2b

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/apikey"
	"sandstorm/internal/fleet/fleettest"
	"sandstorm/internal/sam/inject"
	"sandstorm/internal/store"
	"sandstorm/internal/testenv"
)

type env struct {
	svc  *Service
	st   *store.Store
	node *fleettest.Node
	api  *httptest.Server // the REST API; X-Team sets the caller (the master's auth does, for real)
	traf *httptest.Server
}

func newEnv(t *testing.T) *env {
	t.Helper()
	n := fleettest.NewNode()
	fe := fleettest.New(t, n)
	st, fl, log := fe.Store, fe.Fleet, fe.Log
	if err := st.PutTemplate(context.Background(), store.Template{Name: "base", Rootfs: t.TempDir(), Process: api.Process{Args: []string{"/bin/sleep"}}, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	svc := New(Config{Store: st, Fleet: fl, Domain: "sandbox.test", TokenKey: []byte("k"), Log: log})
	apiH := svc.API()
	e := &env{svc: svc, st: st, node: n}
	e.api = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := apikey.Caller{Operator: true}
		if team := r.Header.Get("X-Team"); team != "" {
			c = apikey.Caller{Team: team}
		}
		apiH.ServeHTTP(w, r.WithContext(apikey.With(r.Context(), c)))
	}))
	e.traf = httptest.NewServer(svc.Traffic())
	t.Cleanup(e.api.Close)
	t.Cleanup(e.traf.Close)
	return e
}

type answer struct {
	status int
	header http.Header
	body   string
}

// send sends req with headers h added and answers the status and body.
func send(t *testing.T, req *http.Request, h map[string]string) (int, string) {
	t.Helper()
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// expect is call, with a status other than want an error about what.
func (e *env) expect(t *testing.T, want int, what, team, method, path, body string) answer {
	t.Helper()
	a := e.call(t, team, method, path, body)
	if a.status != want {
		t.Errorf("%s: %d %s, want %d", what, a.status, a.body, want)
	}
	return a
}

func (e *env) call(t *testing.T, team, method, path, body string) answer {
	t.Helper()
	req, _ := http.NewRequest(method, e.api.URL+path, strings.NewReader(body))
	if team != "" {
		req.Header.Set("X-Team", team)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{resp.StatusCode, resp.Header, string(b)}
	if a.status >= 400 {
		// E2B's error body: the SDK reads the code from it.
		var eb struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(b, &eb); err != nil || eb.Code != a.status || eb.Message == "" {
			t.Errorf("%s %s: %d %q is not E2B's {code: status, message}", method, path, a.status, b)
		}
	}
	return a
}

func (e *env) create(t *testing.T, team, body string) sandbox {
	t.Helper()
	a := e.call(t, team, "POST", "/sandboxes", body)
	if a.status != http.StatusCreated {
		t.Fatalf("create %s: %d %s", body, a.status, a.body)
	}
	var sb sandbox
	json.Unmarshal([]byte(a.body), &sb)
	return sb
}

var semver = regexp.MustCompile(`^\d+\.\d+\.\d+$`)

// TestCreateAnswersWhatTheSDKRequires: every field the SDK requires of a
// create's answer (openapi.yml Sandbox.required; envdVersion semver, which
// the SDK compares), and an access token that only the master can make.
func TestCreateAnswersWhatTheSDKRequires(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, "red", `{"templateID": "base", "metadata": {"app": "x"}, "envVars": {"K": "V"}}`)
	if sb.SandboxID == "" || sb.TemplateID != "base" || sb.ClientID == "" || !semver.MatchString(sb.EnvdVersion) || sb.Domain == nil || *sb.Domain != "sandbox.test" {
		t.Errorf("create answered %+v", sb)
	}
	if sb.EnvdAccessToken != e.svc.AccessToken(sb.SandboxID) || len(sb.EnvdAccessToken) != 64 {
		t.Errorf("access token %q", sb.EnvdAccessToken)
	}
	m, err := e.st.Teams().GetSandboxMeta(context.Background(), sb.SandboxID)
	if err != nil || m.Team != "red" || m.Metadata["app"] != "x" || m.Env["K"] != "V" {
		t.Errorf("kept %+v %v", m, err)
	}
	if d := m.EndAt.Sub(m.StartedAt); d != DefaultTimeout {
		t.Errorf("lifetime %v, want E2B's default %v", d, DefaultTimeout)
	}
	for _, bad := range []string{
		`{"templateID": "nosuch"}`,
		`{"templateID": "base", "timeout": -1}`,
		`{"templateID": "base", "network": {"allowOut": "api.example.com"}}`,
		`{"templateID": "base", "network": {"denyOut": ["api.example.com"]}}`,
		`{"templateID": "base", "network": {"egressProxy": {"address": "proxy.example.com:1080"}}}`,
		`{"templateID": "base", "envVars": {"A=B": "c"}}`,
		`{"templateID": "base", "autoPauseMemory": false, "autoResume": {"enabled": true}}`,
		`{not json`,
	} {
		if a := e.call(t, "red", "POST", "/sandboxes", bad); a.status < 400 || a.status >= 500 {
			t.Errorf("create %s: %d %s, want a 4xx", bad, a.status, a.body)
		}
	}
}

// TestTeamsAndNotFound: another team's sandbox is not found on every
// route, exactly as a missing one.
func TestTeamsAndNotFound(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, "red", `{}`)
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/sandboxes/%s", ""},
		{"DELETE", "/sandboxes/%s", ""},
		{"POST", "/sandboxes/%s/pause", ""},
		{"POST", "/sandboxes/%s/connect", `{"timeout": 10}`},
		{"POST", "/sandboxes/%s/timeout", `{"timeout": 10}`},
		{"GET", "/sandboxes/%s/metrics", ""},
		{"PUT", "/sandboxes/%s/network", `{"denyOut": ["0.0.0.0/0"]}`},
	} {
		theirs := e.call(t, "blue", c.method, fmt.Sprintf(c.path, sb.SandboxID), c.body)
		missing := e.call(t, "blue", c.method, fmt.Sprintf(c.path, "nosuch"), c.body)
		if theirs.status != http.StatusNotFound || missing.status != http.StatusNotFound {
			t.Errorf("%s %s by another team: %d, missing: %d; want 404 both", c.method, c.path, theirs.status, missing.status)
		}
	}
	if a := e.call(t, "blue", "GET", "/v2/sandboxes", ""); a.body != "[]\n" {
		t.Errorf("another team's list: %s", a.body)
	}
	e.expect(t, http.StatusOK, "the owner's get", "red", "GET", "/sandboxes/"+sb.SandboxID, "")
}

// TestUpdateNetwork: PUT /sandboxes/{id}/network replaces the rules
// whole (a field left out is cleared), allow_internet_access false is
// deny all, and what an update cannot set is refused with the rules
// left as they were.
func TestUpdateNetwork(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, "red", `{"network": {"allowOut": ["api.example.com"], "denyOut": ["0.0.0.0/0"]}}`)
	rules := func() *api.Egress {
		t.Helper()
		got, err := e.node.Get(context.Background(), sb.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		return got.Egress
	}
	path := "/sandboxes/" + sb.SandboxID + "/network"
	e.expect(t, http.StatusNoContent, "deny 10/8 only", "red", "PUT", path, `{"denyOut": ["10.0.0.0/8"]}`)
	if r := rules(); r == nil || len(r.AllowOut) != 0 || !slices.Equal(r.DenyOut, []string{"10.0.0.0/8"}) {
		t.Errorf("after an update with denyOut only: %+v; want allowOut cleared", r)
	}
	e.expect(t, http.StatusNoContent, "internet access off", "red", "PUT", path, `{"allow_internet_access": false, "allowOut": ["*.example.com"]}`)
	if r := rules(); r == nil || !slices.Equal(r.AllowOut, []string{"*.example.com"}) || !slices.Equal(r.DenyOut, []string{"0.0.0.0/0"}) {
		t.Errorf("after allow_internet_access false: %+v", r)
	}
	for _, bad := range []string{
		`{"denyOut": ["api.example.com"]}`,
		`{"allowOut": "api.example.com"}`,
		`{"egressProxy": {"address": "proxy.example.com:1080"}}`,
		`{"rules": {"api.example.com": [{"transform": {"headers": {"X": "y"}}}]}}`,
		`{"maskRequestHost": "x"}`,
		`{not json`,
	} {
		if a := e.call(t, "red", "PUT", path, bad); a.status < 400 || a.status >= 500 {
			t.Errorf("update %s: %d %s, want a 4xx", bad, a.status, a.body)
		}
	}
	// A field E2B's API does not have is a 400 that says so, not a 409
	// "not supported"; the SDK's camelCase spelling of
	// allow_internet_access is pointed to the API's.
	if a := e.expect(t, http.StatusBadRequest, "a camelCase allowInternetAccess", "red", "PUT", path, `{"allowInternetAccess": false}`); !strings.Contains(string(a.body), "allow_internet_access") {
		t.Errorf("a camelCase allowInternetAccess: %s, want the API's spelling named", a.body)
	}
	e.expect(t, http.StatusBadRequest, "a typo", "red", "PUT", path, `{"denyOuts": ["0.0.0.0/0"]}`)
	e.expect(t, http.StatusConflict, "an egress proxy", "red", "PUT", path, `{"egressProxy": {"address": "proxy.example.com:1080"}}`)
	if r := rules(); r == nil || !slices.Equal(r.AllowOut, []string{"*.example.com"}) {
		t.Errorf("refused updates changed the rules: %+v", r)
	}
	e.expect(t, http.StatusNoContent, "no fields", "red", "PUT", path, `{}`)
	if r := rules(); r != nil {
		t.Errorf("an update with no fields left %+v; want no rules", r)
	}
}

// TestMetricsRange: start and end bound the samples (Unix seconds): a
// range before the sandbox, or after now, has none; a bad bound is 400.
// A sample is what the node measured, in E2B's names.
func TestMetricsRange(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, "", `{}`)
	e.node.Used = api.Usage{CPUCount: 2, CPUPct: 12.5, MemBytes: 3 << 20, MemCacheBytes: 1 << 20, DiskBytes: 4096, DiskLimitBytes: 1 << 30}
	a := e.call(t, "", "GET", "/sandboxes/"+sb.SandboxID+"/metrics", "")
	var one []struct {
		CPUCount                           int
		CPUUsedPct                         float64
		MemUsed, MemTotal, MemCache        int64
		DiskUsed, DiskTotal, TimestampUnix int64
	}
	if err := json.Unmarshal([]byte(a.body), &one); err != nil || len(one) != 1 {
		t.Fatalf("metrics: %d %s", a.status, a.body)
	}
	if m := one[0]; m.CPUCount != 2 || m.CPUUsedPct != 12.5 || m.MemUsed != 3<<20 || m.MemCache != 1<<20 || m.DiskUsed != 4096 || m.DiskTotal != 1<<30 || m.TimestampUnix == 0 {
		t.Errorf("metrics: %+v, not what the node measured", m)
	}
	now := time.Now().Unix()
	for q, want := range map[string]string{
		"": "1",
		fmt.Sprintf("?start=%d&end=%d", now-5, now+5):       "1",
		fmt.Sprintf("?start=%d&end=%d", now-7200, now-3600): "0",
		fmt.Sprintf("?start=%d", now+3600):                  "0",
		"?start=yesterday":                                  "400",
	} {
		a := e.call(t, "", "GET", "/sandboxes/"+sb.SandboxID+"/metrics"+q, "")
		var samples []map[string]any
		json.Unmarshal([]byte(a.body), &samples)
		got := fmt.Sprint(len(samples))
		if a.status != http.StatusOK {
			got = fmt.Sprint(a.status)
		}
		if got != want {
			t.Errorf("metrics%s: %s (%s), want %s", q, got, a.body, want)
		}
	}
}

// TestPauseConnect: a pause is a snapshot and lists paused; a second
// pause is a 409; a connect wakes it (201, it resumed it) and lists it
// running; a connect to a running one is 200; traffic to a paused one
// resumes it too.
func TestPauseConnect(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, "", `{"timeout": 60}`)
	if a := e.call(t, "", "POST", "/sandboxes/"+sb.SandboxID+"/pause", ""); a.status != http.StatusNoContent {
		t.Fatalf("pause: %d %s", a.status, a.body)
	}
	if e.node.Tier(sb.SandboxID) != api.TierSnapshot {
		t.Errorf("paused, the node has it %s", e.node.Tier(sb.SandboxID))
	}
	e.expect(t, http.StatusConflict, "a second pause", "", "POST", "/sandboxes/"+sb.SandboxID+"/pause", "")
	if a := e.call(t, "", "GET", "/v2/sandboxes?state=paused", ""); !strings.Contains(a.body, sb.SandboxID) {
		t.Errorf("paused list: %s", a.body)
	}
	if a := e.call(t, "", "POST", "/sandboxes/"+sb.SandboxID+"/connect", `{"timeout": 30}`); a.status != http.StatusCreated || !strings.Contains(a.body, sb.EnvdAccessToken) {
		t.Errorf("connect to a paused one: %d %s, want 201 with its token", a.status, a.body)
	}
	if e.node.Tier(sb.SandboxID) != api.TierHot {
		t.Errorf("connected, the node has it %s", e.node.Tier(sb.SandboxID))
	}
	e.expect(t, http.StatusOK, "connect to a running one", "", "POST", "/sandboxes/"+sb.SandboxID+"/connect", `{"timeout": 30}`)
	e.expect(t, http.StatusOK, "connect", "", "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{}`)
	e.expect(t, http.StatusBadRequest, "connect with a negative timeout", "", "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{"timeout": -5}`)
}

// TestListFiltersAndPages: metadata (a query string in one parameter),
// state and template filter; limit pages, with the next page's token in
// x-next-token, each sandbox exactly once, in either order.
func TestListFiltersAndPages(t *testing.T) {
	e := newEnv(t)
	for i := range 5 {
		e.create(t, "", fmt.Sprintf(`{"metadata": {"suite": "a", "i": "%d"}}`, i))
	}
	e.create(t, "", `{"metadata": {"suite": "b"}}`)
	list := func(q string) ([]string, string) {
		a := e.call(t, "", "GET", "/v2/sandboxes?metadata=suite%3Da&"+q, "")
		var page []detail
		if err := json.Unmarshal([]byte(a.body), &page); err != nil {
			t.Fatalf("%s: %s", q, a.body)
		}
		var ids []string
		for _, d := range page {
			ids = append(ids, d.SandboxID)
			if d.State != "running" || d.EnvdVersion == "" || d.StartedAt.IsZero() || d.EndAt.IsZero() || d.MemoryMB == 0 || d.CPUCount == 0 {
				t.Errorf("listed %+v: a field the SDK requires is empty", d)
			}
		}
		return ids, a.header.Get("x-next-token")
	}
	for _, order := range []string{"asc", "desc"} {
		all, none := list("order=" + order)
		if len(all) != 5 || none != "" {
			t.Fatalf("order=%s, one page: %v, token %q", order, all, none)
		}
		var got []string
		token := ""
		for pages := 0; pages < 10; pages++ {
			ids, next := list("order=" + order + "&limit=2&nextToken=" + token)
			got = append(got, ids...)
			if token = next; token == "" {
				break
			}
		}
		if strings.Join(got, ",") != strings.Join(all, ",") {
			t.Errorf("order=%s paged %v, want %v", order, got, all)
		}
	}
	asc, _ := list("order=asc")
	desc, _ := list("")
	slices.Reverse(desc)
	if strings.Join(asc, ",") != strings.Join(desc, ",") {
		t.Errorf("the default order is not the reverse of asc: %v, %v", asc, desc)
	}
	for q, want := range map[string]int{
		"metadata=suite%3Da%26i%3D3": 1, "state=paused": 0, "state=running,paused": 6, "template=base": 6, "template=other": 0,
	} {
		a := e.call(t, "", "GET", "/v2/sandboxes?"+q, "")
		var page []detail
		json.Unmarshal([]byte(a.body), &page)
		if len(page) != want {
			t.Errorf("?%s: %d sandboxes, want %d", q, len(page), want)
		}
	}
	e.expect(t, http.StatusBadRequest, "an unknown state", "", "GET", "/v2/sandboxes?state=sleeping", "")
}

// TestLifetimes: at its end a sandbox is killed, or with autoPause
// snapshotted and listed paused.
func TestLifetimes(t *testing.T) {
	e := newEnv(t)
	kill := e.create(t, "", `{"timeout": 0}`)
	pause := e.create(t, "", `{"timeout": 0, "autoPause": true}`)
	keep := e.create(t, "", `{"timeout": 3600}`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.svc.Run(ctx)
	testenv.WaitFor(t, 10*time.Second, "both ended", func() bool {
		_, err := e.st.Teams().GetSandboxMeta(ctx, kill.SandboxID)
		m, _ := e.st.Teams().GetSandboxMeta(ctx, pause.SandboxID)
		return err != nil && m.Paused
	})
	if _, err := e.node.Get(ctx, kill.SandboxID); err == nil {
		t.Error("the one to kill is still on its node")
	}
	if e.node.Tier(pause.SandboxID) != api.TierSnapshot {
		t.Errorf("the auto-paused one is %s", e.node.Tier(pause.SandboxID))
	}
	if e.node.Tier(keep.SandboxID) != api.TierHot {
		t.Errorf("the one with an hour left is %s", e.node.Tier(keep.SandboxID))
	}
}

// TestTraffic: envd calls are served with the sandbox's own token only,
// which is not forwarded, nor is an environment a client sends; the
// sandbox's env is; a sandbox that is gone is a 502.
func TestTraffic(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, "red", `{"envVars": {"K": "V"}}`)
	call := func(id, token string, extra map[string]string) (int, string) {
		req, _ := http.NewRequest("POST", e.traf.URL+"/process.Process/List", strings.NewReader("{}"))
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", "49983")
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		return send(t, req, extra)
	}
	if st, _ := call(sb.SandboxID, "", nil); st != http.StatusUnauthorized {
		t.Errorf("no token: %d", st)
	}
	if st, _ := call(sb.SandboxID, e.svc.AccessToken("other"), nil); st != http.StatusUnauthorized {
		t.Errorf("another sandbox's token: %d", st)
	}
	st, body := call(sb.SandboxID, sb.EnvdAccessToken, map[string]string{api.EnvdEnvHeader: api.EncodeEnv(map[string]string{"EVIL": "1"})})
	if st != http.StatusOK || body != "envd "+sb.SandboxID+" /process.Process/List" {
		t.Fatalf("with its token: %d %q", st, body)
	}
	// The code interpreter's /execute runs code as envd does: its token
	// too, taken off before the call goes in; its contexts are open, as
	// the SDK calls them without it.
	interp := func(token string, path ...string) (int, string) {
		req, _ := http.NewRequest("POST", e.traf.URL+cmp.Or(strings.Join(path, ""), "/execute"), strings.NewReader(`{"code": "1"}`))
		req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
		req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(api.CodeInterpreterPort))
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		return send(t, req, nil)
	}
	if st, _ := interp(""); st != http.StatusUnauthorized {
		t.Errorf("the code interpreter with no token: %d, want 401", st)
	}
	if st, body := interp(sb.EnvdAccessToken); st != http.StatusOK || !strings.HasPrefix(body, "port 49999 of "+sb.SandboxID+" /execute") {
		t.Errorf("the code interpreter with its token: %d %q", st, body)
	}
	for _, p := range []string{"/execute/", "/./execute", "/other", "/contexts/../execute", "/contexts/x/../../execute"} {
		if st, _ := interp("", p); st != http.StatusUnauthorized {
			t.Errorf("the code interpreter's %s with no token: %d, want 401", p, st)
		}
	}
	if st, _ := interp("", "/contexts"); st != http.StatusOK {
		t.Errorf("the code interpreter's /contexts with no token: %d, want 200 (open, as the SDK calls it)", st)
	}
	got := e.node.Envd[len(e.node.Envd)-1]
	if got.Header.Get("X-Access-Token") != "" || got.Header.Get(api.EnvdEnvHeader) != api.EncodeEnv(map[string]string{"K": "V"}) {
		t.Errorf("forwarded headers %v: the token must go, the sandbox's env (only) come", got.Header)
	}
	// Paused is the user's state: traffic is told so (502, what the
	// SDK's isRunning reads as not running) and it stays paused...
	e.call(t, "red", "POST", "/sandboxes/"+sb.SandboxID+"/pause", "")
	if st, body := call(sb.SandboxID, sb.EnvdAccessToken, nil); st != http.StatusBadGateway || !strings.Contains(body, "paused") {
		t.Errorf("traffic to a paused sandbox: %d %s, want 502", st, body)
	}
	if m, _ := e.st.Teams().GetSandboxMeta(context.Background(), sb.SandboxID); !m.Paused || e.node.Tier(sb.SandboxID) != api.TierSnapshot {
		t.Errorf("after traffic to a paused sandbox: paused %v, tier %s", m.Paused, e.node.Tier(sb.SandboxID))
	}
	// ...unless it was made with autoResume: then traffic resumes it,
	// with a lifetime from now.
	ar := e.create(t, "red", `{"autoResume": {"enabled": true}}`)
	e.call(t, "red", "POST", "/sandboxes/"+ar.SandboxID+"/pause", "")
	if st, _ := call(ar.SandboxID, ar.EnvdAccessToken, nil); st != http.StatusOK {
		t.Errorf("traffic to a paused autoResume sandbox: %d", st)
	}
	if m, _ := e.st.Teams().GetSandboxMeta(context.Background(), ar.SandboxID); m.Paused || time.Until(m.EndAt) < DefaultTimeout-time.Second {
		t.Errorf("after traffic to a paused autoResume sandbox: paused %v, ends in %v", m.Paused, time.Until(m.EndAt))
	}
	e.call(t, "red", "DELETE", "/sandboxes/"+sb.SandboxID, "")
	if st, _ := call(sb.SandboxID, sb.EnvdAccessToken, nil); st != http.StatusBadGateway {
		t.Errorf("a killed sandbox: %d, want 502 (the SDK's 'not found')", st)
	}
}

// TestPage: E2B's list paging, without a server: a token is given only
// when a page follows; a sandbox made or deleted between two pages moves
// nothing across the cut; startedAfter is inclusive; metadata is decoded
// once more than a query is (the SDK encodes each pair, then the whole).
func TestPage(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var all []detail
	for i := range 4 {
		all = append(all, detail{SandboxID: fmt.Sprint("s", i), StartedAt: t0.Add(time.Duration(i) * time.Second), State: "running"})
	}
	ids := func(ds []detail) string {
		var out []string
		for _, d := range ds {
			out = append(out, d.SandboxID)
		}
		return strings.Join(out, ",")
	}
	p1, tok := page(all, filter{}, true, 2, "")
	if ids(p1) != "s3,s2" || tok == "" {
		t.Fatalf("desc page 1: %s, token %q", ids(p1), tok)
	}
	// s2 is deleted and s4 made before page 2 is asked.
	later := append([]detail{all[0], all[1], all[3]}, detail{SandboxID: "s4", StartedAt: t0.Add(9 * time.Second), State: "running"})
	if p2, tok2 := page(later, filter{}, true, 2, tok); ids(p2) != "s1,s0" || tok2 != "" {
		t.Errorf("desc page 2: %s, token %q, want s1,s0 and no token", ids(p2), tok2)
	}
	if p, tok := page(all, filter{}, false, 4, ""); ids(p) != "s0,s1,s2,s3" || tok != "" {
		t.Errorf("asc, one exact page: %s, token %q", ids(p), tok)
	}
	q, _ := url.ParseQuery("startedAfter=" + url.QueryEscape(t0.Add(2*time.Second).Format(time.RFC3339Nano)) +
		"&metadata=" + url.QueryEscape("k="+url.QueryEscape("a b")+"&"+url.QueryEscape("x&y")+"="+url.QueryEscape("v=1")))
	f, err := parseFilter(q)
	if err != nil {
		t.Fatal(err)
	}
	if f.metadata["k"] != "a b" || f.metadata["x&y"] != "v=1" {
		t.Errorf("metadata decoded as %q", f.metadata)
	}
	f.metadata = nil
	if p, _ := page(all, f, false, 10, ""); ids(p) != "s2,s3" {
		t.Errorf("startedAfter s2's start: %s, want s2,s3 (inclusive)", ids(p))
	}
}

// TestPorts: a sandbox's own port is reached by the SDK's getHost name
// (<port>-<id>.<domain>) or its headers, with no token while its traffic
// is public; a private one's (allowPublicTraffic false) asks its traffic
// token, which its create answered and which is not forwarded; the Host
// the sandbox sees is maskRequestHost's when set; a gone sandbox is
// E2B's 502; an egress rule is refused, not ignored.
func TestPorts(t *testing.T) {
	e := newEnv(t)
	get := func(id, port string, h map[string]string) (int, string) {
		req, _ := http.NewRequest("GET", e.traf.URL+"/page?x=1", nil)
		req.Host = port + "-" + id + ".sandbox.test"
		return send(t, req, h)
	}
	pub := e.create(t, "red", `{}`)
	if st, body := get(pub.SandboxID, "8000", nil); st != 200 || body != "port 8000 of "+pub.SandboxID+" /page, host 8000-"+pub.SandboxID+".sandbox.test" {
		t.Errorf("a public sandbox's port: %d %q", st, body)
	}
	if pub.TrafficAccessToken != "" {
		t.Errorf("a public sandbox was given a traffic token")
	}
	priv := e.create(t, "red", `{"network": {"allowPublicTraffic": false, "maskRequestHost": "inner.example:${PORT}"}}`)
	if priv.TrafficAccessToken == "" || priv.TrafficAccessToken == priv.EnvdAccessToken {
		t.Fatalf("a private sandbox's traffic token: %q", priv.TrafficAccessToken)
	}
	for name, h := range map[string]map[string]string{
		"no token":          nil,
		"its envd token":    {"E2b-Traffic-Access-Token": priv.EnvdAccessToken},
		"another's token":   {"E2b-Traffic-Access-Token": e.svc.TrafficToken(pub.SandboxID)},
		"as X-Access-Token": {"X-Access-Token": priv.TrafficAccessToken},
	} {
		if st, _ := get(priv.SandboxID, "8000", h); st != http.StatusForbidden {
			t.Errorf("a private sandbox's port, %s: %d, want 403", name, st)
		}
	}
	st, body := get(priv.SandboxID, "8000", map[string]string{"E2b-Traffic-Access-Token": priv.TrafficAccessToken})
	if st != 200 || !strings.HasSuffix(body, "host inner.example:8000") {
		t.Errorf("a private sandbox's port with its token: %d %q", st, body)
	}
	if r := e.node.Envd; len(r) > 0 {
		t.Errorf("a port call went to envd: %v", r)
	}
	if st, body := get("nosuch", "8000", nil); st != http.StatusBadGateway || !strings.Contains(body, `"sandboxId":"nosuch"`) {
		t.Errorf("a gone sandbox's port: %d %s", st, body)
	}
	if st, _ := get(pub.SandboxID, "99999", nil); st != http.StatusBadRequest {
		t.Errorf("port 99999: %d", st)
	}
	e.expect(t, http.StatusConflict, "an egress proxy", "red", "POST", "/sandboxes", `{"network": {"egressProxy": {"address": "proxy.example.com:1080"}}}`)
	// Egress rules go to the node with the create, E2B's
	// allow_internet_access false as denyOut all.
	a := e.call(t, "red", "POST", "/sandboxes", `{"network": {"allowOut": ["1.1.1.1"], "denyOut": ["0.0.0.0/0"]}, "allow_internet_access": false}`)
	var made sandbox
	if a.status != http.StatusCreated || json.Unmarshal([]byte(a.body), &made) != nil {
		t.Fatalf("a create with egress rules: %d %s", a.status, a.body)
	}
	if got := e.node.Boxes[made.SandboxID].Egress; got == nil || !slices.Equal(got.AllowOut, []string{"1.1.1.1"}) || !slices.Equal(got.DenyOut, []string{"0.0.0.0/0", "0.0.0.0/0"}) {
		t.Errorf("the node was asked for egress %+v", got)
	}
}

// TestPauseConnectRace: pauses and connects on one sandbox from many
// clients at once each answer a state E2B defines (pause 204 or 409,
// connect 200 or 201), never a 5xx, and what is kept agrees with the
// node at the end: paused exactly when the node has it snapshotted.
func TestPauseConnectRace(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, "red", `{"timeout": 60}`)
	var wg sync.WaitGroup
	bad := make(chan string, 64)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			op, ok := "pause", map[int]bool{204: true, 409: true}
			if i%2 == 1 {
				op, ok = "connect", map[int]bool{200: true, 201: true}
			}
			body := ""
			if op == "connect" {
				body = `{"timeout": 60}`
			}
			if a := e.call(t, "red", "POST", "/sandboxes/"+sb.SandboxID+"/"+op, body); !ok[a.status] {
				bad <- fmt.Sprintf("%s: %d %s", op, a.status, a.body)
			}
		}()
	}
	wg.Wait()
	close(bad)
	for b := range bad {
		t.Error(b)
	}
	m, err := e.st.Teams().GetSandboxMeta(context.Background(), sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if snap := e.node.Tier(sb.SandboxID) == api.TierSnapshot; m.Paused && !snap {
		t.Errorf("kept as paused, but the node has it %s", e.node.Tier(sb.SandboxID))
	}
}

// TestFork: a fork is a clone: count children, each its own sandbox, its
// parent's team's with its env, running, with E2B's answer per child and
// the lifetime asked; another team cannot fork it (404); a paused one is
// not forked (409).
func TestFork(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, "red", `{"envVars": {"K": "V"}}`)
	a := e.call(t, "red", "POST", "/sandboxes/"+sb.SandboxID+"/fork", `{"count": 2, "timeout": 60}`)
	var res []struct {
		Sandbox *sandbox       `json:"sandbox"`
		Error   map[string]any `json:"error"`
	}
	if err := json.Unmarshal([]byte(a.body), &res); err != nil || a.status != http.StatusCreated || len(res) != 2 {
		t.Fatalf("fork of 2: %d %s", a.status, a.body)
	}
	seen := map[string]bool{sb.SandboxID: true}
	for _, r := range res {
		if r.Sandbox == nil || seen[r.Sandbox.SandboxID] || r.Sandbox.EnvdAccessToken != e.svc.AccessToken(r.Sandbox.SandboxID) {
			t.Fatalf("a fork: %+v", r)
		}
		seen[r.Sandbox.SandboxID] = true
		m, err := e.st.Teams().GetSandboxMeta(context.Background(), r.Sandbox.SandboxID)
		if err != nil || m.Team != "red" || m.Env["K"] != "V" || time.Until(m.EndAt) > time.Minute || time.Until(m.EndAt) < 50*time.Second {
			t.Errorf("kept of fork %s: %+v %v", r.Sandbox.SandboxID, m, err)
		}
	}
	e.expect(t, http.StatusNotFound, "another team's fork", "blue", "POST", "/sandboxes/"+sb.SandboxID+"/fork", `{}`)
	e.expect(t, http.StatusBadRequest, "count 0", "red", "POST", "/sandboxes/"+sb.SandboxID+"/fork", `{"count": 0}`)
	e.call(t, "red", "POST", "/sandboxes/"+sb.SandboxID+"/pause", "")
	e.expect(t, http.StatusConflict, "a paused sandbox's fork", "red", "POST", "/sandboxes/"+sb.SandboxID+"/fork", `{}`)
}

// TestSnapshots: a snapshot of a sandbox is kept in the snapshot tier,
// the sandbox running on; it is listed (by sandbox, by name, paged), not
// among the sandboxes; a sandbox is made from it as from a template, the
// caller's; another team cannot see, use or delete it (404); deleted, it
// is gone.
func TestSnapshots(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, "red", `{}`)
	a := e.call(t, "red", "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", `{"name": "before-upgrade"}`)
	var snap snapshotInfo
	if err := json.Unmarshal([]byte(a.body), &snap); err != nil || a.status != http.StatusCreated || snap.SnapshotID == "" || len(snap.Names) != 1 || snap.Names[0] != "before-upgrade" {
		t.Fatalf("snapshot: %d %s", a.status, a.body)
	}
	if e.node.Tier(snap.SnapshotID) != api.TierSnapshot || e.node.Tier(sb.SandboxID) != api.TierHot {
		t.Errorf("the snapshot is %s, its sandbox %s", e.node.Tier(snap.SnapshotID), e.node.Tier(sb.SandboxID))
	}
	if idle := e.node.Boxes[snap.SnapshotID].Idle; idle == nil || idle.DetachAfter != "0" {
		t.Errorf("a snapshot's idle timers %+v: it must never be detached (what is made from it has its memory)", idle)
	}
	unnamed := e.call(t, "red", "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", ``)
	if unnamed.status != http.StatusCreated {
		t.Fatalf("an unnamed snapshot: %d %s", unnamed.status, unnamed.body)
	}
	list := func(team, q string) []snapshotInfo {
		var out []snapshotInfo
		a := e.call(t, team, "GET", "/snapshots"+q, "")
		json.Unmarshal([]byte(a.body), &out)
		return out
	}
	for q, want := range map[string]int{"": 2, "?name=before-upgrade": 1, "?name=nope": 0, "?sandboxID=" + sb.SandboxID: 2, "?sandboxID=other": 0} {
		if got := list("red", q); len(got) != want {
			t.Errorf("snapshots%s: %v, want %d", q, got, want)
		}
	}
	if got := list("red", "?limit=1"); len(got) != 1 {
		t.Errorf("a page of 1: %v", got)
	}
	if got := list("blue", ""); len(got) != 0 {
		t.Errorf("another team sees %v", got)
	}
	var listed []detail
	json.Unmarshal([]byte(e.call(t, "red", "GET", "/v2/sandboxes", "").body), &listed)
	if len(listed) != 1 || listed[0].SandboxID != sb.SandboxID {
		t.Errorf("the sandboxes' list: %+v, want the sandbox alone", listed)
	}
	e.expect(t, http.StatusNotFound, "a snapshot as a sandbox", "red", "GET", "/sandboxes/"+snap.SnapshotID, "")
	e.expect(t, http.StatusNotFound, "another team's create from it", "blue", "POST", "/sandboxes", `{"templateID": "`+snap.SnapshotID+`"}`)
	from := e.create(t, "red", `{"templateID": "`+snap.SnapshotID+`", "metadata": {"k": "v"}}`)
	if m, err := e.st.Teams().GetSandboxMeta(context.Background(), from.SandboxID); err != nil || m.Team != "red" || m.Metadata["k"] != "v" || m.SnapshotOf != "" {
		t.Errorf("kept of a sandbox from the snapshot: %+v %v", m, err)
	}
	if e.node.Tier(snap.SnapshotID) != api.TierSnapshot {
		t.Errorf("after a create from it the snapshot is %s", e.node.Tier(snap.SnapshotID))
	}
	e.expect(t, http.StatusNotFound, "another team's delete", "blue", "DELETE", "/templates/"+snap.SnapshotID, "")
	e.expect(t, http.StatusNoContent, "delete", "red", "DELETE", "/templates/"+snap.SnapshotID, "")
	e.expect(t, http.StatusNotFound, "a second delete", "red", "DELETE", "/templates/"+snap.SnapshotID, "")
	e.expect(t, http.StatusOK, "what was made from a deleted snapshot", "red", "GET", "/sandboxes/"+from.SandboxID, "")
}

// TestPauseWithoutMemory: pause({memory: false}) keeps the files only
// (the detached tier: a connect cold-boots it), as does the pause at the
// end of a sandbox made with autoPauseMemory false; a pause with memory
// is the snapshot tier.
func TestPauseWithoutMemory(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, "red", `{}`)
	if a := e.call(t, "red", "POST", "/sandboxes/"+sb.SandboxID+"/pause", `{"memory": false}`); a.status != http.StatusNoContent {
		t.Fatalf("pause without memory: %d %s", a.status, a.body)
	}
	if tier := e.node.Tier(sb.SandboxID); tier != api.TierDetached {
		t.Errorf("paused without memory, the node has it %s", tier)
	}
	if a := e.call(t, "red", "POST", "/sandboxes/"+sb.SandboxID+"/connect", `{"timeout": 30}`); a.status != http.StatusCreated || e.node.Tier(sb.SandboxID) != api.TierHot {
		t.Errorf("connect: %d, tier %s", a.status, e.node.Tier(sb.SandboxID))
	}
	with := e.create(t, "red", `{}`)
	e.call(t, "red", "POST", "/sandboxes/"+with.SandboxID+"/pause", `{"memory": true}`)
	if tier := e.node.Tier(with.SandboxID); tier != api.TierSnapshot {
		t.Errorf("paused with memory, the node has it %s", tier)
	}
	ends := e.create(t, "red", `{"timeout": 0, "autoPause": true, "autoPauseMemory": false}`)
	m, _ := e.st.Teams().GetSandboxMeta(context.Background(), ends.SandboxID)
	if err := e.svc.end(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	m, _ = e.st.Teams().GetSandboxMeta(context.Background(), ends.SandboxID)
	if tier := e.node.Tier(ends.SandboxID); !m.Paused || tier != api.TierDetached {
		t.Errorf("at its end without memory: paused %v, tier %s", m.Paused, tier)
	}
}

// TestResumeAsked: a node's ask, sent when its ingress had traffic for a
// paused sandbox, resumes one made with autoResume, with E2B's default
// lifetime from now, and leaves one paused without it paused.
func TestResumeAsked(t *testing.T) {
	e := newEnv(t)
	ar := e.create(t, "red", `{"autoResume": {"enabled": true}}`)
	plain := e.create(t, "red", `{}`)
	for _, id := range []string{ar.SandboxID, plain.SandboxID} {
		if a := e.call(t, "red", "POST", "/sandboxes/"+id+"/pause", ""); a.status != http.StatusNoContent {
			t.Fatalf("pause %s: %d %s", id, a.status, a.body)
		}
	}
	e.svc.ResumeAsked("node-a", ar.SandboxID)
	e.svc.ResumeAsked("node-a", plain.SandboxID)
	e.svc.ResumeAsked("node-a", "no-such-sandbox")
	if m, _ := e.st.Teams().GetSandboxMeta(context.Background(), ar.SandboxID); m.Paused || time.Until(m.EndAt) < DefaultTimeout-time.Minute {
		t.Errorf("the autoResume sandbox after a node's ask: paused %v, ends in %s", m.Paused, time.Until(m.EndAt))
	}
	if m, _ := e.st.Teams().GetSandboxMeta(context.Background(), plain.SandboxID); !m.Paused {
		t.Error("a sandbox paused without autoResume was resumed by a node's ask")
	}
}

// TestNetworkRules: a create's network.rules become header rules bound to
// the sandbox as its secrets are (its boundary sets them on requests to
// their names; the values never enter the sandbox), later rules for a
// name winning, with NODE_EXTRA_CA_CERTS naming its CA. What cannot be
// served is refused, and nothing is made.
func TestNetworkRules(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, "red", `{"network": {"allowOut": ["api.example.com"], "rules": {
		"api.example.com": [{"transform": {"headers": {"x-token": "v1"}}}, {"transform": {"headers": {"X-Token": "v2", "X-Other": "o"}}}],
		"*.corp.example": [{}]}}}`)
	want := []inject.Binding{{Name: "rule:api.example.com", Hosts: []string{"api.example.com"}, Headers: map[string]string{"X-Token": "v2", "X-Other": "o"}}}
	if got := e.node.Secrets[sb.SandboxID]; !reflect.DeepEqual(got, want) {
		t.Errorf("bound %+v, want %+v", got, want)
	}
	if m, err := e.st.Teams().GetSandboxMeta(context.Background(), sb.SandboxID); err != nil || m.Env["NODE_EXTRA_CA_CERTS"] != api.SecretCAPath {
		t.Errorf("env %v, %v; want NODE_EXTRA_CA_CERTS", m.Env, err)
	}
	// A key with a port (getHost under a domain with one) is its name's.
	sb = e.create(t, "red", `{"network": {"rules": {"8080-abc.example.test:8443": [{"transform": {"headers": {"X-Test-Token": "t"}}}]}}}`)
	want = []inject.Binding{{Name: "rule:8080-abc.example.test", Hosts: []string{"8080-abc.example.test"}, Headers: map[string]string{"X-Test-Token": "t"}}}
	if got := e.node.Secrets[sb.SandboxID]; !reflect.DeepEqual(got, want) {
		t.Errorf("bound %+v, want %+v", got, want)
	}
	made := len(e.node.Secrets)
	for _, bad := range []string{
		`{"rules": {"1.1.1.1": [{"transform": {"headers": {"X": "y"}}}]}}`,
		`{"rules": {"1.1.1.1:443": [{"transform": {"headers": {"X": "y"}}}]}}`,
		`{"rules": {"[::1]:443": [{"transform": {"headers": {"X": "y"}}}]}}`,
		`{"rules": {"api.example.com:https": [{"transform": {"headers": {"X": "y"}}}]}}`,
		`{"rules": {"10.0.0.0/8": [{"transform": {"headers": {"X": "y"}}}]}}`,
		`{"rules": {"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.identity.tokens.aws}"}}}]}}`,
		`{"rules": {"api.example.com": [{"transform": {"headers": {"Host": "evil.example"}}}]}}`,
		`{"rules": {"api.example.com": [{"transform": {"headers": {"X": "a\r\nB: c"}}}]}}`,
		`{"rules": {"api.example.com": "x"}}`,
		`{"rules": {"https://api.example.com/": [{"transform": {"headers": {"X": "y"}}}]}}`,
	} {
		if a := e.call(t, "red", "POST", "/sandboxes", `{"network": `+bad+`}`); a.status < 400 || a.status >= 500 {
			t.Errorf("create with %s: %d %s, want a 4xx", bad, a.status, a.body)
		}
	}
	if len(e.node.Secrets) != made {
		t.Error("a refused create bound rules")
	}
}
