package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sandstorm/internal/demo"
)

// Results is one run of a benchmark: where and on what it ran, with which
// parameters, and every raw sample of every series. Write it with a Dir.
type Results struct {
	// Tool names the benchmark, e.g. "bench/tiers".
	Tool string `json:"tool"`
	// Title heads the Markdown rendering.
	Title    string    `json:"title"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished,omitzero"`
	Machine  Machine   `json:"machine"`
	Source   Source    `json:"source"`
	// Params are the run's parameters (flags, intervals, counts), as the
	// tool chooses to name them; values must marshal to JSON.
	Params map[string]any `json:"params"`
	// Notes are remarks on the whole run (warnings, what was cleaned up).
	Notes  []string  `json:"notes,omitempty"`
	Series []*Series `json:"series"`
	// Tables are derived tables (see Table), rendered after the summary
	// table; a tool that has none leaves it empty.
	Tables []*Table `json:"tables,omitempty"`
}

// Series is one measured quantity: its raw samples in milliseconds, in the
// order they were taken, and what went wrong on the way.
type Series struct {
	// Name identifies the series, e.g. "wake-frozen/app64/client".
	Name string `json:"name"`
	// Description says what one sample is: from which event to which, and
	// who timed it.
	Description string `json:"description,omitempty"`
	// Seed is the published figure to compare with, as text ("3.8 ms"),
	// or empty when there is none.
	Seed string `json:"seed,omitempty"`
	// SamplesMs are the raw samples in milliseconds.
	SamplesMs []float64 `json:"samples_ms"`
	// Summary is computed from SamplesMs when the results are written;
	// nil while there are no samples.
	Summary *Summary `json:"summary,omitempty"`
	// Failures are attempts that produced no sample, each saying why.
	Failures []string `json:"failures,omitempty"`
	// Notes are observations about samples that were kept (for example a
	// sandbox whose memory did not survive a wake).
	Notes []string `json:"notes,omitempty"`
	// Skipped says why the series was not measured, or stopped early.
	Skipped string `json:"skipped,omitempty"`
	// RoundEnds, for a tool that measures in rounds (bench/tiers), is how
	// many samples the series had at the end of each round: round k's
	// samples are SamplesMs[RoundEnds[k-1]:RoundEnds[k]].
	RoundEnds []int `json:"round_ends,omitempty"`
}

// NewResults returns empty results for tool, started now.
func NewResults(tool, title string) *Results {
	return &Results{Tool: tool, Title: title, Started: time.Now().UTC(), Params: map[string]any{}}
}

// AddSeries appends a new empty series and returns it.
func (r *Results) AddSeries(name, description, seed string) *Series {
	// A series measured in rounds is added once per round: it is one
	// series, its samples accumulate.
	for _, s := range r.Series {
		if s.Name == name {
			return s
		}
	}
	s := &Series{Name: name, Description: description, Seed: seed, SamplesMs: []float64{}}
	r.Series = append(r.Series, s)
	return s
}

// P50 is the median (nearest rank, as the tables give it) of the series
// named name; 0 when there is none or it has no samples.
func (r *Results) P50(name string) float64 {
	for _, s := range r.Series {
		if s.Name == name {
			if d, err := Distribute(s.SamplesMs); err == nil {
				return d.P50
			}
		}
	}
	return 0
}

// Note appends a run-wide note.
func (r *Results) Note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// Summarize recomputes the summary of every series from its samples.
func (r *Results) Summarize() {
	for _, s := range r.Series {
		s.Summarize()
	}
}

// Add records one sample in milliseconds.
func (s *Series) Add(ms float64) { s.SamplesMs = append(s.SamplesMs, ms) }

// AddDuration records one sample given as a duration.
func (s *Series) AddDuration(d time.Duration) { s.Add(Ms(d)) }

// EndRound marks the end of a round (RoundEnds).
func (s *Series) EndRound() { s.RoundEnds = append(s.RoundEnds, len(s.SamplesMs)) }

// Rounds splits samples into the rounds ends marks (RoundEnds): with no
// ends, one round of all of them; samples after the last end (a round cut
// short) are a round of their own.
func Rounds(samples []float64, ends []int) [][]float64 {
	var out [][]float64
	from := 0
	for _, e := range ends {
		e = min(max(e, from), len(samples))
		out = append(out, samples[from:e])
		from = e
	}
	if from < len(samples) || len(ends) == 0 {
		out = append(out, samples[from:])
	}
	return out
}

// Fail records an attempt that produced no sample.
func (s *Series) Fail(format string, args ...any) {
	s.Failures = append(s.Failures, fmt.Sprintf(format, args...))
}

// Note records an observation about a kept sample.
func (s *Series) Note(format string, args ...any) {
	s.Notes = append(s.Notes, fmt.Sprintf(format, args...))
}

// Summarize recomputes s.Summary from s.SamplesMs (nil when empty).
func (s *Series) Summarize() {
	if s.SamplesMs == nil {
		s.SamplesMs = []float64{}
	}
	sum, err := Summarize(s.SamplesMs)
	if err != nil {
		s.Summary = nil
		return
	}
	s.Summary = &sum
}

// Dir is a results directory being written. Files go to Path, which is
// Final with ".tmp" appended (ignored by git), until Finish renames it, so a
// run that dies half-way leaves a directory that says so.
type Dir struct {
	Path  string
	Final string
}

// DirName is the conventional name of a results directory:
// "<YYYY-MM-DD>-<short commit>" of the run's start (UTC) and source.
func (r *Results) DirName() string {
	return r.Started.UTC().Format("2006-01-02") + "-" + r.Source.Short()
}

// NewDir creates the results directory base/name (as base/name.tmp until
// Finish). If base/name exists, "-2", "-3", … are appended so that an
// earlier run is never overwritten.
func NewDir(base, name string) (*Dir, error) {
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, fmt.Errorf("results directory: %w", err)
	}
	for i := 1; i < 1000; i++ {
		final := filepath.Join(base, name)
		if i > 1 {
			final = fmt.Sprintf("%s-%d", final, i)
		}
		if exists(final) {
			continue
		}
		tmp := final + ".tmp"
		err := os.Mkdir(tmp, 0o755)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("results directory: %w", err)
		}
		return &Dir{Path: tmp, Final: final}, nil
	}
	return nil, fmt.Errorf("results directory: too many runs named %s in %s", name, base)
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// Write summarizes r and writes results.json (raw samples and all) and
// results.md (the rendered tables) into d.Path, replacing earlier copies,
// so it can be called after every series to keep partial results.
func (d *Dir) Write(r *Results) error {
	r.Summarize()
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("results: %w", err)
	}
	if err := writeFile(filepath.Join(d.Path, "results.json"), append(js, '\n')); err != nil {
		return err
	}
	return writeFile(filepath.Join(d.Path, "results.md"), []byte(r.Markdown()))
}

// Done writes r a last time, stamped as finished now, and renames the
// directory to its final name, which it returns; when the write fails, it
// returns the temporary directory (what a run wrote so far is there).
func (d *Dir) Done(r *Results) (string, error) {
	r.Finished = time.Now().UTC()
	if err := d.Write(r); err != nil {
		return d.Path, err
	}
	return d.Finish()
}

// Finish renames the directory to its final name and returns that path.
func (d *Dir) Finish() (string, error) {
	if err := os.Rename(d.Path, d.Final); err != nil {
		return d.Path, fmt.Errorf("results: %w", err)
	}
	d.Path = d.Final
	return d.Final, nil
}

func writeFile(path string, data []byte) error {
	tmp := path + ".part"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("results: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("results: %w", err)
	}
	return nil
}

// ReadResults reads a results.json written by Dir.Write.
func ReadResults(path string) (*Results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

// Run is what a node benchmark begins with: its results (the machine, with
// the runsc it measures, and the source tree), the directory they go to,
// a work directory of its own (removed by Close), the demo rootfs it runs
// (if it runs one) and the sandstormd it measures.
type Run struct {
	Results *Results
	Dir     *Dir
	Work    string
	// Runsc is the runsc binary, made absolute.
	Runsc string
	// Demo is the demo built into Rootfs.
	Demo   demo.Demo
	Rootfs string
	Binary Binary
}

// Plan is what Begin makes a run of.
type Plan struct {
	Tool, Title string
	// Out is where the results directory goes, named Prefix + the date
	// and commit; Repo is the source tree.
	Out, Repo, Prefix string
	// Runsc is the runsc the run measures; a sandstormd built from Repo
	// has it linked beside it, as its default runsc.
	Runsc string
	// Demo names the demo to build ("": none); Sandstormd is the binary to
	// measure ("": built from Repo).
	Demo, Sandstormd string
}

// Open is how every benchmark's results begin: tool's results titled
// title, with the machine and the source tree at repo (out, where they
// go, is not a change to it), and their directory in out, named prefix +
// the date and commit. A run whose name needs more than that (a platform,
// a variant) adds to prefix.
func Open(ctx context.Context, tool, title, out, repo, prefix string) (*Results, *Dir, error) {
	res := NewResults(tool, title)
	res.Machine = CollectMachine(ctx)
	absOut, _ := filepath.Abs(out)
	res.Source = CollectSource(ctx, repo, absOut)
	dir, err := NewDir(out, prefix+res.DirName())
	return res, dir, err
}

// Begin starts a run of p.
func Begin(ctx context.Context, p Plan) (*Run, error) {
	absRunsc, err := filepath.Abs(p.Runsc)
	if err != nil {
		return nil, err
	}
	res, dir, err := Open(ctx, p.Tool, p.Title, p.Out, p.Repo, p.Prefix)
	if err != nil {
		return nil, err
	}
	res.Machine.UseRunsc(ctx, absRunsc)
	work, err := os.MkdirTemp("", "ss"+strings.TrimSuffix(p.Prefix, "-")+"-")
	if err != nil {
		return nil, err
	}
	r := &Run{Results: res, Dir: dir, Work: work, Runsc: absRunsc}
	if p.Demo != "" {
		r.Rootfs = filepath.Join(work, p.Demo)
		r.Demo, err = demo.Build(p.Demo, r.Rootfs)
	}
	if err == nil {
		r.Binary, err = SandstormdBinary(ctx, p.Repo, p.Sandstormd, work, absRunsc)
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Close removes the work directory.
func (r *Run) Close() { os.RemoveAll(r.Work) }
