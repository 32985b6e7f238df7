package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/apikey"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/rootfs"
	"sandstorm/internal/templates"
)

// A build's state is kept in the master's memory while it runs and for
// buildKeep after (its logs, its end); what it made — the registered
// template and its tags — is in the store.

// buildKeep is how long a finished build's status and logs are kept.
const buildKeep = time.Hour

// maxLogEntries bounds a build's logs; later lines are counted, not kept.
const maxLogEntries = 20000

// logEntry is E2B's BuildLogEntry.
type logEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

// reason is E2B's BuildStatusReason.
type reason struct {
	Message    string     `json:"message"`
	Step       string     `json:"step,omitempty"`
	LogEntries []logEntry `json:"logEntries"`
}

type build struct {
	id, templateID, team, alias string
	tags                        []string
	memoryMiB                   int
	created                     time.Time

	mu      sync.Mutex
	status  string // waiting, building, ready, error
	logs    []logEntry
	dropped int
	partial []byte
	reason  *reason
	ended   time.Time
	done    chan struct{} // closed at its end
}

// Write takes a build's output, a log entry a line.
func (b *build) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.partial = append(b.partial, p...)
	for {
		i := bytes.IndexByte(b.partial, '\n')
		if i < 0 {
			break
		}
		b.logLocked("info", strings.TrimRight(string(b.partial[:i]), "\r"))
		b.partial = b.partial[i+1:]
	}
	return len(p), nil
}

func (b *build) logLocked(level, msg string) {
	if len(b.logs) >= maxLogEntries {
		b.dropped++
		return
	}
	b.logs = append(b.logs, logEntry{Timestamp: time.Now().UTC(), Level: level, Message: msg})
}

func (b *build) log(level, format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.logLocked(level, fmt.Sprintf(format, args...))
}

// end records how the build ended.
func (b *build) end(r *reason) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.partial) > 0 {
		b.logLocked("info", string(b.partial))
		b.partial = nil
	}
	if b.dropped > 0 {
		b.logLocked("warn", fmt.Sprintf("%d more lines of output not kept", b.dropped))
	}
	b.status, b.reason, b.ended = "ready", r, time.Now()
	if r != nil {
		b.status = "error"
		b.logLocked("error", r.Message)
	}
	close(b.done)
}

// builds are the builds the master knows of, by ID.
type builds struct {
	mu   sync.Mutex
	byID map[string]*build
}

func (bs *builds) add(b *build) *build {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if bs.byID == nil {
		bs.byID = map[string]*build{}
	}
	for id, old := range bs.byID {
		old.mu.Lock()
		gone := !old.ended.IsZero() && time.Since(old.ended) > buildKeep
		old.mu.Unlock()
		if gone {
			delete(bs.byID, id)
		}
	}
	bs.byID[b.id] = b
	return b
}

// find is build id of template ref (its ID or alias) if the caller's.
func (s *Service) findBuild(r *http.Request) (*build, error) {
	s.builds.mu.Lock()
	b := s.builds.byID[r.PathValue("buildID")]
	s.builds.mu.Unlock()
	ref := r.PathValue("templateID")
	if b == nil || b.team != apikey.From(r.Context()).Team || (b.templateID != ref && b.alias != ref) {
		return nil, errdefs.New(errdefs.ErrNotFound, "build %q of template %q: not found", r.PathValue("buildID"), ref)
	}
	return b, nil
}

// startBuild is POST /v2/templates/{templateID}/builds/{buildID} with
// the steps: checked and translated now (a step that cannot be is 400),
// built in the background; 202.
func (s *Service) startBuild(w http.ResponseWriter, r *http.Request) {
	var req buildStart
	body := http.MaxBytesReader(w, r.Body, 8<<20)
	dec := json.NewDecoder(body)
	if err := dec.Decode(&req); err != nil {
		fail(w, errdefs.New(errdefs.ErrBadInput, "malformed JSON body: %v", err))
		return
	}
	b, err := s.findBuild(r)
	if err != nil {
		fail(w, err)
		return
	}
	p, err := s.planOf(r.Context(), req)
	if err != nil {
		fail(w, err)
		return
	}
	b.mu.Lock()
	started := b.status != "waiting"
	b.status = "building"
	b.mu.Unlock()
	if started {
		fail(w, errdefs.New(errdefs.ErrConflict, "build %s was started already", b.id))
		return
	}
	go s.runBuild(b, p, req)
	w.WriteHeader(http.StatusAccepted)
}

// planOf checks where req starts and translates it.
func (s *Service) planOf(ctx context.Context, req buildStart) (*plan, error) {
	if set(req.FromImageRegistry) {
		return nil, errdefs.New(errdefs.ErrNotSupported, "fromImageRegistry: registry credentials are not taken here yet; push the image where the master may pull it anonymously")
	}
	var base from
	switch {
	case req.FromImage != "" && req.FromTemplate != "":
		return nil, errdefs.New(errdefs.ErrBadInput, "fromImage and fromTemplate exclude each other")
	case req.FromImage != "":
		ref, err := s.cfg.Templates.Mirror(req.FromImage)
		if err != nil {
			return nil, err
		}
		base.image = ref
	case req.FromTemplate != "":
		name, err := s.resolveTemplate(ctx, req.FromTemplate)
		if err != nil {
			return nil, err
		}
		t, err := s.sbx.Template(ctx, name)
		if err != nil {
			return nil, errdefs.New(errdefs.ErrNotFound, "fromTemplate %q: not found", req.FromTemplate)
		}
		base.template = t.Name
		base.user, base.dir = t.Process.User, t.Process.Cwd
		if t.Process.Envd != nil {
			base.user, base.dir = t.Process.Envd.User, t.Process.Envd.Workdir
		}
	default:
		return nil, errdefs.New(errdefs.ErrBadInput, "say where the build starts: fromImage or fromTemplate")
	}
	return translate(req, base)
}

// runBuild builds b: its context from the uploads its COPY steps name,
// then the Dockerfile, its output as b's logs; at its end its tags point
// at the template it made.
func (s *Service) runBuild(b *build, p *plan, req buildStart) {
	ctx := apikey.With(context.Background(), apikey.Caller{Team: b.team, Operator: b.team == ""})
	start := time.Now()
	b.log("info", "Building template %s (%s), build %s", b.alias, b.templateID, b.id)
	ctxDir, err := os.MkdirTemp(s.cfg.Templates.BuildDir(), "e2b-context-")
	if err != nil {
		b.end(&reason{Message: err.Error(), Step: "base"})
		return
	}
	defer os.RemoveAll(ctxDir)
	for _, h := range p.hashes {
		if err := s.unpackUpload(b.team, h, filepath.Join(ctxDir, h)); err != nil {
			b.end(&reason{Message: err.Error(), Step: p.stepOfHash(h)})
			return
		}
	}
	name := templateName(b.id)
	w := warmOf(req.ReadyCmd)
	treq := api.BuildRequest{Dockerfile: p.dockerfile.String(), Template: api.TemplateRequest{
		Name: name, MemoryMiB: b.memoryMiB, Warm: &w,
		Process: api.Process{Args: processOf(req.StartCmd), Envd: &api.Envd{User: p.user, Workdir: p.dir}},
	}}
	_, err = s.cfg.Templates.BuildWith(ctx, treq, ctxDir, b, templates.BuildOptions{Team: b.team, NoCache: p.force})
	if err != nil {
		s.cfg.Log.Info("e2b template build failed", "template", b.templateID, "build", b.id, "err", err)
		b.end(p.reasonOf(err))
		return
	}
	if err := s.cfg.Store.Teams().SetE2BTags(context.Background(), b.templateID, b.id, name, b.tags); err != nil {
		b.end(&reason{Message: fmt.Sprintf("tag the build: %v", err), Step: "finalize"})
		return
	}
	b.log("info", "Template %s built in %s", b.alias, time.Since(start).Round(time.Millisecond))
	s.cfg.Log.Info("e2b template built", "template", b.templateID, "build", b.id, "registered", name, "ms", time.Since(start).Milliseconds())
	b.end(nil)
}

// unpackUpload extracts team's upload of hash into dir.
func (s *Service) unpackUpload(team, hash, dir string) error {
	f, err := os.Open(s.uploadPath(team, hash))
	if errors.Is(err, os.ErrNotExist) {
		return errdefs.New(errdefs.ErrPrecondition, "the files of hash %s were not uploaded: build again", hash)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	if _, err := rootfs.Extract(f, dir, rootfs.Limits{}); err != nil {
		return fmt.Errorf("the files of hash %s: %w", hash, err)
	}
	return nil
}

func (p *plan) stepOfHash(h string) string {
	for line := 1; line <= p.line; line++ {
		if p.steps[line].FilesHash == h {
			return p.lines[line]
		}
	}
	return "base"
}

var dockerfileLine = regexp.MustCompile(`^Dockerfile:(\d+): `)

// reasonOf is a failed build's reason, in E2B's words where E2B has
// them, with the step that failed.
func (p *plan) reasonOf(err error) *reason {
	msg := err.Error()
	m := dockerfileLine.FindStringSubmatch(msg)
	if m == nil {
		return &reason{Message: msg, Step: "finalize"}
	}
	line, _ := strconv.Atoi(m[1])
	rest := strings.TrimPrefix(msg, m[0])
	st, name := p.steps[line], p.lines[line]
	if st.Type == "RUN" {
		cmd := st.Args[0]
		if len(st.Args) > 1 && strings.Contains(rest, "USER "+st.Args[1]+": ") {
			// E2B's envd refuses a user it has not got in these words.
			return &reason{Message: fmt.Sprintf("failed to run command '%s': command failed: unauthenticated: invalid username: '%s'", cmd, st.Args[1]), Step: name}
		}
		return &reason{Message: fmt.Sprintf("failed to run command '%s': %s", cmd, rest), Step: name}
	}
	return &reason{Message: rest, Step: name}
}

// buildStatus is GET /templates/{templateID}/builds/{buildID}/status
// ?logsOffset&limit&level: the build's status and its logs from
// logsOffset, at most limit (100, E2B's) of them.
func (s *Service) buildStatus(w http.ResponseWriter, r *http.Request) {
	b, err := s.findBuild(r)
	if err != nil {
		fail(w, err)
		return
	}
	q := r.URL.Query()
	offset, limit := 0, 100
	if v := q.Get("logsOffset"); v != "" {
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 {
			fail(w, errdefs.New(errdefs.ErrBadInput, "logsOffset %q: want a number from 0", v))
			return
		}
	}
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 0 || limit > 100 {
			fail(w, errdefs.New(errdefs.ErrBadInput, "limit %q: want 0 to 100", v))
			return
		}
	}
	b.mu.Lock()
	entries := []logEntry{}
	if offset < len(b.logs) {
		entries = append(entries, b.logs[offset:min(len(b.logs), offset+limit)]...)
	}
	status, rsn := b.status, b.reason
	b.mu.Unlock()
	logs := make([]string, len(entries))
	for i, e := range entries {
		logs[i] = fmt.Sprintf("[%s] %s", e.Timestamp.Format(time.RFC3339), e.Message)
	}
	out := map[string]any{"templateID": b.templateID, "buildID": b.id, "status": status, "logEntries": entries, "logs": logs}
	if rsn != nil {
		rr := *rsn
		rr.LogEntries = []logEntry{}
		out["reason"] = rr
	}
	writeJSON(w, http.StatusOK, out)
}
