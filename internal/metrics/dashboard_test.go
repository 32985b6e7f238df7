package metrics_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"sandstorm/internal/metrics"
	"sandstorm/internal/sam/boundary"
)

// dashboardFile is the Grafana dashboard the README points at.
const dashboardFile = "../../docs/grafana-sandstorm.json"

// TestDashboardMatchesMetrics keeps docs/grafana-sandstorm.json and the
// metrics from drifting apart: every metric a panel or variable queries is
// one sandstormd exports (a histogram's _bucket, _sum and _count
// included), and every sandstorm_* metric it exports has a panel.
func TestDashboardMatchesMetrics(t *testing.T) {
	exported := exportedFamilies(t)
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s is not JSON: %v", dashboardFile, err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatalf("%s: no title, uid or panels", dashboardFile)
	}
	var exprs []string
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		exprs = append(exprs, v.Definition)
	}
	// A metric name in PromQL: a word that starts as sandstormd's metrics
	// do (label names and functions do not), not followed by "(".
	name := regexp.MustCompile(`\b((?:sandstorm|sam_box|go|process)_[a-z0-9_]+)\b`)
	queried := map[string]bool{}
	for _, e := range exprs {
		for _, m := range name.FindAllStringSubmatch(e, -1) {
			queried[m[1]] = true
		}
	}
	for q := range queried {
		base := q
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(q, suf); ok && exported[b] == dto.MetricType_HISTOGRAM {
				base = b
			}
		}
		if _, ok := exported[base]; !ok {
			t.Errorf("the dashboard queries %s, which sandstormd does not export", q)
		}
	}
	var missing []string
	for f := range exported {
		if !strings.HasPrefix(f, "sandstorm_") {
			continue
		}
		found := false
		for q := range queried {
			if q == f || strings.HasPrefix(q, f+"_") && exported[f] == dto.MetricType_HISTOGRAM {
				found = true
			}
		}
		if !found {
			missing = append(missing, f)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("no panel for %v", missing)
	}
}

// exportedFamilies is every metric family a sandstormd serving master and
// node exports, with its type: a registry made as the daemon makes it,
// with a request through the API's instrumentation and a node reported,
// so that every family has a series.
func exportedFamilies(t *testing.T) map[string]dto.MetricType {
	t.Helper()
	reg := metrics.NewRegistry()
	metrics.NewNode(reg)
	reg.MustRegister(metrics.NodeCollector(func() (metrics.NodeState, error) {
		return metrics.NodeState{Sandboxes: map[[2]string]int{{"hot", "web"}: 1}, Templates: []string{"web"}, Pooled: map[string]int{"web": 1}}, nil
	}))
	m := metrics.NewMaster(reg)
	reg.MustRegister(metrics.NodeHealthCollector(func() []metrics.NodeHealth {
		return []metrics.NodeHealth{{Name: "n1", LastReport: time.Now()}}
	}))
	boundary.NewMetrics(reg)
	h := m.Instrument(http.NotFoundHandler(), func(*http.Request) string { return "GET /v1/nodes" })
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/v1/nodes", nil))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]dto.MetricType{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf.GetType()
	}
	return out
}
