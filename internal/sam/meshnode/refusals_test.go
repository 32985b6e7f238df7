package meshnode

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/sam/fakellm"
	"sandstorm/internal/sam/refusals"
)

// TestNodeRefusalsItemised: what the node refuses an agent — a model, an
// MCP server, a tool — and what it refuses another member's agent by its
// own policy is counted in its table with the principal, the target and
// the reason, and the member the call came from.
func TestNodeRefusalsItemised(t *testing.T) {
	llmB := fakellm.Start(t, "m-b")
	log, _ := testLogger(t)
	pf := policyFile(t, meshPolicy)
	net := &memNet{members: map[string]*memMember{}}
	b := net.add(t, "node-b", Config{Providers: []Provider{{Name: "llm-b", URL: llmB.BaseURL(), Models: []string{"m-b"}}}, PolicyFile: pf, Logger: log.With("node", "b")})
	a := net.add(t, "node-a", Config{PolicyFile: pf, Logger: log.With("node", "a")})
	agent := httptest.NewServer(a.Handler())
	t.Cleanup(agent.Close)

	ca := agentOpenAI(agent.URL, "agent-a")
	for i := 0; i < 3; i++ {
		_, err := ca.Chat.Completions.New(ctxT(t), chat("m-c", "not mine"))
		wantAPIError(t, err, http.StatusForbidden)
	}
	if _, err := ca.Models.Get(ctxT(t), "m-secret"); err == nil {
		t.Fatal("an ungranted model was described")
	}
	if code, _ := get(t, a.Handler(), "/mcp/present", http.Header{HeaderPrincipal: {"agent-a"}}); code != http.StatusForbidden {
		t.Fatalf("/mcp/present: %d", code)
	}
	s := agentMCP(t, agent.URL+"/mcp", "agent-a", nil)
	if text, isErr := callText(t, s, "everything__get-sum", map[string]any{"a": 1}); !isErr || !strings.Contains(text, "not granted") {
		t.Fatalf("an ungranted tool: %q (error %v)", text, isErr)
	}
	// On B, a call from node-a's agent that B's policy does not grant.
	body, _ := json.Marshal(toolCall{Server: "everything", Tool: "get-sum"})
	r := httptest.NewRequest(http.MethodPost, "/v1/tools/call", bytes.NewReader(body))
	r.Header.Set(HeaderMember, "node-a")
	r.Header.Set(HeaderPrincipal, "agent-a")
	w := httptest.NewRecorder()
	b.MeshHandler().ServeHTTP(w, r)
	if !strings.Contains(w.Body.String(), "not granted") {
		t.Fatalf("B's answer: %d %s", w.Code, w.Body.String())
	}

	type row struct{ principal, what, target, reason, from string }
	rows := func(n *Node) map[row]uint64 {
		rep := n.Refusals().Take()
		if err := refusals.Check(rep); err != nil {
			t.Fatalf("the node's report fails the control plane's check: %v", err)
		}
		out := map[row]uint64{}
		for _, r := range rep.Rows {
			if r.By != api.RefusedBySAMNode {
				t.Errorf("row by %q", r.By)
			}
			out[row{r.Principal, r.What, r.Target, r.Reason, r.From}] = r.Count
		}
		return out
	}
	gotA := rows(a)
	for want, n := range map[row]uint64{
		{"agent-a", api.RefusedModel, "m-c", "not granted", ""}:                3,
		{"agent-a", api.RefusedModel, "m-secret", "not granted", ""}:           1,
		{"agent-a", api.RefusedMCPServer, "present", "not granted", ""}:        1,
		{"agent-a", api.RefusedTool, "everything__get-sum", "not granted", ""}: 1,
	} {
		if gotA[want] != n {
			t.Errorf("A: %+v counted %d, want %d (all: %v)", want, gotA[want], n, gotA)
		}
	}
	if len(gotA) != 4 {
		t.Errorf("A: %d rows, want 4: %v", len(gotA), gotA)
	}
	gotB := rows(b)
	if n := gotB[row{"agent-a", api.RefusedTool, "everything__get-sum", "not granted by this member's policy", "node-a"}]; n != 1 || len(gotB) != 1 {
		t.Errorf("B: %v", gotB)
	}
}

// postReport sends a report to the node's agent handler as sandstormd
// does (no principal), or as a request through a boundary would arrive
// (with one).
func postReport(t *testing.T, h http.Handler, body []byte, header http.Header) (int, string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, RefusalsPath, bytes.NewReader(body))
	for k, v := range header {
		r.Header[k] = v
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Body.String()
}

func report(rows ...api.RefusalRow) []byte {
	b, _ := json.Marshal(api.RefusalReport{Rows: rows})
	return b
}

func boundaryRow(principal, target string) api.RefusalRow {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	return api.RefusalRow{Principal: principal, By: api.RefusedByBoundary, What: api.RefusedDNS, Target: target, Reason: "destination not granted", Count: 2, First: t0, Last: t0}
}

// TestRefusalsEndpoint: POST RefusalsPath takes the boundaries' report
// from the node's own machine only — a request naming a principal or a
// service (what a boundary sends) is refused and changes nothing — and
// refuses a bad, oversized or over-long report whole; a flood of reports
// costs the node's table its size.
func TestRefusalsEndpoint(t *testing.T) {
	log, _ := testLogger(t)
	n, _ := startNode(t, Config{Logger: log})
	h := n.Handler()
	good := report(boundaryRow("agent-a", "example.com"))
	for what, header := range map[string]http.Header{
		"a principal": {HeaderPrincipal: {"agent-a"}},
		"a service":   {HeaderService: {"mcp://everything"}},
	} {
		if code, body := postReport(t, h, good, header); code != http.StatusForbidden {
			t.Errorf("a report naming %s: %d %s, want 403", what, code, body)
		}
	}
	if n.Refusals().Len() != 0 {
		t.Fatal("a report through a boundary's channel was kept")
	}
	long := make([]api.RefusalRow, refusals.MaxRows+1)
	for i := range long {
		long[i] = boundaryRow("agent-a", fmt.Sprintf("n%d.example", i))
	}
	tooLong, _ := json.Marshal(api.RefusalReport{Rows: long})
	for what, c := range map[string]struct {
		body []byte
		code int
	}{
		"not JSON":              {[]byte("rows: []"), http.StatusBadRequest},
		"an unknown field":      {[]byte(`{"rows": [], "secret": 1}`), http.StatusBadRequest},
		"two reports":           {append(append([]byte{}, good...), good...), http.StatusBadRequest},
		"a row of no principal": {report(boundaryRow("", "example.com"), boundaryRow("agent-a", "kept.example")), http.StatusBadRequest},
		"too many rows":         {tooLong, http.StatusBadRequest},
		"more than a MiB":       {append([]byte(`{"rows": [], "dropped": 1`+strings.Repeat(" ", refusals.MaxBodyBytes)), '}'), http.StatusRequestEntityTooLarge},
	} {
		if code, body := postReport(t, h, c.body, nil); code != c.code {
			t.Errorf("%s: %d %s, want %d", what, code, body, c.code)
		}
	}
	r := httptest.NewRequest(http.MethodGet, RefusalsPath, nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", w.Code)
	}
	if n.Refusals().Len() != 0 {
		t.Fatal("something of a refused report was kept")
	}
	if code, body := postReport(t, h, good, nil); code != http.StatusNoContent {
		t.Fatalf("a good report: %d %s", code, body)
	}
	// A flood: far more rows than the table holds, from one report after
	// another; the table keeps its size and counts the rest.
	const reports = 50
	for i := 0; i < reports; i++ {
		rows := make([]api.RefusalRow, refusals.MaxRows)
		for j := range rows {
			rows[j] = boundaryRow("attacker", fmt.Sprintf("r%d-%d.example", i, j))
		}
		b, _ := json.Marshal(api.RefusalReport{Rows: rows, Dropped: 1000})
		if code, body := postReport(t, h, b, nil); code != http.StatusNoContent {
			t.Fatalf("report %d: %d %s", i, code, body)
		}
	}
	rep := n.Refusals().Take()
	var total uint64
	for _, r := range rep.Rows {
		total += r.Count
	}
	if len(rep.Rows) != refusals.MaxRows || total+rep.Dropped != 2+reports*(refusals.MaxRows*2+1000) {
		t.Errorf("%d rows, %d itemised + %d dropped", len(rep.Rows), total, rep.Dropped)
	}
}
