package sambench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// MetricPrefix selects the metrics a scrape records.
const MetricPrefix = "sam_"

// Scrape is what one metrics endpoint said about the main phase.
type Scrape struct {
	URL string `json:"url"`
	// Deltas are after − before of every sam_ counter, and of the _sum
	// and _count of every sam_ histogram and summary, keyed by series
	// (`name{label="value",…}`, labels sorted).
	Deltas map[string]float64 `json:"deltas,omitempty"`
	// GaugesBefore and GaugesAfter are the sam_ gauges (and untyped
	// metrics) as read, since a difference of gauges means little.
	GaugesBefore map[string]float64 `json:"gauges_before,omitempty"`
	GaugesAfter  map[string]float64 `json:"gauges_after,omitempty"`
	// Error says why the scrape after the run failed (no deltas then).
	Error string `json:"error,omitempty"`

	before, after map[string]point
	notes         []string
}

// point is one series' value, with its name and labels kept for selection.
type point struct {
	name    string
	labels  map[string]string
	value   float64
	counter bool // cumulative: counter, or a histogram/summary sum or count
}

func (r *runner) scrapeBefore(ctx context.Context, url string) (*Scrape, error) {
	pts, err := r.scrape(ctx, url)
	if err != nil {
		return nil, err
	}
	s := &Scrape{URL: url, before: pts, GaugesBefore: gauges(pts)}
	if len(pts) == 0 {
		s.notes = append(s.notes, fmt.Sprintf("scrape %s: no %s metrics", url, MetricPrefix))
	}
	return s, nil
}

func (r *runner) scrapeAfter(ctx context.Context, s *Scrape) {
	pts, err := r.scrape(ctx, s.URL)
	if err != nil {
		s.Error = err.Error()
		return
	}
	s.after = pts
	s.GaugesAfter = gauges(pts)
	s.Deltas = map[string]float64{}
	for _, k := range slices.Sorted(maps.Keys(pts)) {
		a := pts[k]
		if !a.counter {
			continue
		}
		b := s.before[k] // a series first seen after the start counts from 0
		d := a.value - b.value
		if d < 0 {
			s.notes = append(s.notes, fmt.Sprintf("scrape %s: %s went down (%g → %g): the process restarted during the run?", s.URL, k, b.value, a.value))
		}
		s.Deltas[k] = d
	}
}

func (r *runner) scrape(ctx context.Context, url string) (map[string]point, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := r.scraper.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads Prometheus text exposition and keeps the sam_ series.
func parseMetrics(in io.Reader) (map[string]point, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(in)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	pts := map[string]point{}
	add := func(name string, labels map[string]string, v float64, counter bool) {
		pts[seriesKey(name, labels)] = point{name: name, labels: labels, value: v, counter: counter}
	}
	for name, f := range fams {
		if !strings.HasPrefix(name, MetricPrefix) {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				add(name, labels, m.GetCounter().GetValue(), true)
			case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
				add(name+"_sum", labels, m.GetHistogram().GetSampleSum(), true)
				add(name+"_count", labels, float64(m.GetHistogram().GetSampleCount()), true)
			case dto.MetricType_SUMMARY:
				add(name+"_sum", labels, m.GetSummary().GetSampleSum(), true)
				add(name+"_count", labels, float64(m.GetSummary().GetSampleCount()), true)
			case dto.MetricType_GAUGE:
				add(name, labels, m.GetGauge().GetValue(), false)
			default:
				add(name, labels, m.GetUntyped().GetValue(), false)
			}
		}
	}
	return pts, nil
}

func gauges(pts map[string]point) map[string]float64 {
	g := map[string]float64{}
	for k, p := range pts {
		if !p.counter {
			g[k] = p.value
		}
	}
	if len(g) == 0 {
		return nil
	}
	return g
}

// seriesKey is `name{a="x",b="y"}` with labels sorted, or name alone.
func seriesKey(name string, labels map[string]string) string {
	if len(labels) == 0 {
		return name
	}
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(labels)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strconv.Quote(labels[k]))
	}
	b.WriteByte('}')
	return b.String()
}

// selector picks series: a metric name and label values they must have.
type selector struct {
	name   string
	labels map[string]string
}

var selectorRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$`)
var selectorLabelRE = regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*$`)

// parseSelector parses `name` or `name{label="value",…}`.
func parseSelector(s string) (selector, error) {
	m := selectorRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return selector{}, fmt.Errorf("%q: want name or name{label=\"value\",…}", s)
	}
	sel := selector{name: m[1], labels: map[string]string{}}
	if strings.TrimSpace(m[2]) == "" {
		return sel, nil
	}
	for part := range strings.SplitSeq(m[2], ",") {
		lm := selectorLabelRE.FindStringSubmatch(part)
		if lm == nil {
			return selector{}, fmt.Errorf("%q: bad label matcher %q", s, part)
		}
		v, err := strconv.Unquote(`"` + lm[2] + `"`)
		if err != nil {
			return selector{}, fmt.Errorf("%q: %w", s, err)
		}
		sel.labels[lm[1]] = v
	}
	return sel, nil
}

func (sel selector) matches(p point) bool {
	if p.name != sel.name {
		return false
	}
	for k, v := range sel.labels {
		if p.labels[k] != v {
			return false
		}
	}
	return true
}

// delta sums after − before over the series sel picks, in every scrape;
// found is false when no scrape had such a series.
func delta(scrapes []*Scrape, sel selector) (sum float64, found bool) {
	for _, s := range scrapes {
		if s.after == nil {
			continue
		}
		for k, a := range s.after {
			if a.counter && sel.matches(a) {
				sum += a.value - s.before[k].value
				found = true
			}
		}
	}
	return sum, found
}

// derive computes the boundary's mean admission time and its refusals.
func derive(scrapes []*Scrape, admission, refusal string) Derived {
	var d Derived
	if admission != "" {
		sum, okS := delta(scrapes, selector{name: admission + "_sum"})
		count, okC := delta(scrapes, selector{name: admission + "_count"})
		if okS && okC {
			d.AdmissionCount = &count
			if count > 0 {
				us := sum / count * 1e6
				d.AdmissionMeanUs = &us
			}
		}
	}
	if sel, err := parseSelector(refusal); err == nil && refusal != "" {
		if v, ok := delta(scrapes, sel); ok {
			d.BoundaryRefusals = &v
		}
	}
	return d
}

// Scraper reads Prometheus metrics around a measurement (the counters'
// deltas): for the benchmarks in the packages below this one.
type Scraper struct{ r *runner }

// NewScraper scrapes with hc.
func NewScraper(hc *http.Client) *Scraper { return &Scraper{r: &runner{scraper: hc}} }

// Before reads url's metrics before a measurement.
func (s *Scraper) Before(ctx context.Context, url string) (*Scrape, error) {
	return s.r.scrapeBefore(ctx, url)
}

// After reads them again after it, into sc.
func (s *Scraper) After(ctx context.Context, sc *Scrape) { s.r.scrapeAfter(ctx, sc) }

// Notes are what went wrong with sc's reading (a scrape that failed, a
// counter that went backwards).
func (sc *Scrape) Notes() []string { return sc.notes }

// Delta is how much the series sel names moved between the two readings
// (found false: no such series).
func (sc *Scrape) Delta(sel string) (float64, bool, error) {
	s, err := parseSelector(sel)
	if err != nil {
		return 0, false, err
	}
	d, found := delta([]*Scrape{sc}, s)
	return d, found, nil
}

// ScrapeOfText is a Scrape of two readings given as Prometheus text (after
// "": the reading after failed), for tests of what reads scrapes.
func ScrapeOfText(before, after string) (*Scrape, error) {
	b, err := parseMetrics(strings.NewReader(before))
	if err != nil {
		return nil, err
	}
	sc := &Scrape{before: b}
	if after != "" {
		if sc.after, err = parseMetrics(strings.NewReader(after)); err != nil {
			return nil, err
		}
	}
	return sc, nil
}
