package e2b

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"sandstorm/internal/apikey"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/store"
)

// E2B's template builder (js-sdk src/template/buildApi.ts): a team asks
// for a build of a name (POST /v3/templates), uploads the files its COPY
// steps read, each by its hash (GET /templates/{id}/files/{hash} gives
// a signed URL, uploads.go), starts it with its steps (POST
// /v2/templates/{id}/builds/{buildID}), and follows its status and logs
// (GET .../status); tags name its builds. A team's templates are its own:
// its names are its namespace, and another team's template is not found.

var (
	validAlias = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,99}$`)
	validTag   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)
)

// defaultTag is the tag of a template's latest build, which its name
// alone means.
const defaultTag = "default"

// splitName splits "alias[:tag]" and checks both parts.
func splitName(ref string) (alias, tag string, err error) {
	alias, tag, hasTag := strings.Cut(ref, ":")
	if !validAlias.MatchString(alias) {
		return "", "", errdefs.New(errdefs.ErrBadInput, "template name %q: 1-100 of a-z, 0-9, '_', '.' and '-', starting with a letter or digit", alias)
	}
	if !hasTag {
		return alias, "", nil
	}
	if !validTag.MatchString(tag) {
		return "", "", errdefs.New(errdefs.ErrBadInput, "tag %q of %q: 1-128 of letters, digits, '_', '.' and '-'", tag, ref)
	}
	return alias, tag, nil
}

// newID is a template's ID as E2B makes them: 20 of a-z and 0-9.
func newID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// newUUID is a build's ID, a random (version 4) UUID as E2B's.
func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// templateName is the registered template a build makes.
func templateName(buildID string) string {
	return "e2b-" + strings.ReplaceAll(buildID, "-", "")
}

// requestBuild is POST /v3/templates {name, tags, cpuCount, memoryMB}:
// the template of the name (made if the team has none), a new build of
// it waiting for its steps; 202.
func (s *Service) requestBuild(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name     string   `json:"name"`
		Alias    string   `json:"alias"`
		Tags     []string `json:"tags"`
		CPUCount int      `json:"cpuCount"`
		MemoryMB int      `json:"memoryMB"`
		TeamID   string   `json:"teamID"`
	}
	if err := decode(w, r, &req); err != nil {
		fail(w, err)
		return
	}
	if s.cfg.Templates == nil {
		fail(w, errdefs.New(errdefs.ErrNotSupported, "this master builds no templates (it has no layer store)"))
		return
	}
	if req.Name == "" {
		req.Name = req.Alias
	}
	alias, tag, err := splitName(req.Name)
	if err != nil {
		fail(w, err)
		return
	}
	tags := []string{defaultTag}
	if tag != "" {
		tags = append(tags, tag)
	}
	for _, t := range req.Tags {
		if !validTag.MatchString(t) {
			fail(w, errdefs.New(errdefs.ErrBadInput, "tag %q: 1-128 of letters, digits, '_', '.' and '-'", t))
			return
		}
		if !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	if req.MemoryMB < 0 || req.MemoryMB > 64<<10 {
		fail(w, errdefs.New(errdefs.ErrBadInput, "memoryMB %d: want 0 to 65536", req.MemoryMB))
		return
	}
	team := apikey.From(r.Context()).Team
	tpl, err := s.cfg.Store.Teams().E2BTemplate(r.Context(), team, alias)
	if errors.Is(err, errdefs.ErrNotFound) {
		tpl = store.E2BTemplate{ID: newID(), Team: team, Alias: alias}
		if err = s.cfg.Store.Teams().PutE2BTemplate(r.Context(), tpl); errors.Is(err, errdefs.ErrExists) {
			// Another request made it first: that one is the template.
			tpl, err = s.cfg.Store.Teams().E2BTemplate(r.Context(), team, alias)
		}
	}
	if err != nil {
		fail(w, err)
		return
	}
	b := s.builds.add(&build{id: newUUID(), templateID: tpl.ID, team: team, alias: alias, tags: tags, memoryMiB: req.MemoryMB, status: "waiting", created: time.Now(), done: make(chan struct{})})
	s.cfg.Log.Info("e2b template build requested", "template", tpl.ID, "alias", alias, "build", b.id, "team", team)
	writeJSON(w, http.StatusAccepted, map[string]any{
		"templateID": tpl.ID, "buildID": b.id, "public": false,
		"aliases": []string{alias}, "names": []string{alias}, "tags": tags[1:],
	})
}

// ownTemplate is the caller's template whose ID or alias is the path's
// templateID, or not found.
func (s *Service) ownTemplate(r *http.Request, ref string) (store.E2BTemplate, error) {
	t, err := s.cfg.Store.Teams().E2BTemplate(r.Context(), apikey.From(r.Context()).Team, ref)
	if errors.Is(err, errdefs.ErrNotFound) {
		return t, errdefs.New(errdefs.ErrNotFound, "template %q: not found", ref)
	}
	return t, err
}

// templatesGet serves GET /templates/{a}/{b}: an alias
// (/templates/aliases/{alias}) or a template's tags
// (/templates/{templateID}/tags), which one mux pattern cannot tell
// apart.
func (s *Service) templatesGet(w http.ResponseWriter, r *http.Request) {
	switch a, b := r.PathValue("a"), r.PathValue("b"); {
	case a == "aliases":
		s.aliasInfo(w, r, b)
	case b == "tags":
		s.listTags(w, r, a)
	default:
		fail(w, errdefs.New(errdefs.ErrNotFound, "%s %s: not part of the E2B API served here", r.Method, r.URL.Path))
	}
}

// aliasInfo is GET /templates/aliases/{alias}: the caller's template of
// that name, or the operator's (public: every team may use it).
func (s *Service) aliasInfo(w http.ResponseWriter, r *http.Request, alias string) {
	if t, err := s.ownTemplate(r, alias); err == nil {
		writeJSON(w, http.StatusOK, map[string]any{"templateID": t.ID, "public": false})
		return
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		fail(w, err)
		return
	}
	if t, err := s.sbx.Template(r.Context(), alias); err == nil && t.Team == "" {
		writeJSON(w, http.StatusOK, map[string]any{"templateID": t.Name, "public": true})
		return
	}
	fail(w, errdefs.New(errdefs.ErrNotFound, "template %q: not found", alias))
}

// tagInfo is E2B's TemplateTag.
type tagInfo struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

// listTags is GET /templates/{templateID}/tags.
func (s *Service) listTags(w http.ResponseWriter, r *http.Request, ref string) {
	t, err := s.ownTemplate(r, ref)
	if err != nil {
		fail(w, err)
		return
	}
	tags, err := s.cfg.Store.Teams().E2BTags(r.Context(), t.ID)
	if err != nil {
		fail(w, err)
		return
	}
	out := make([]tagInfo, 0, len(tags))
	for _, g := range tags {
		out = append(out, tagInfo{Tag: g.Tag, BuildID: g.BuildID, CreatedAt: g.CreatedAt})
	}
	writeJSON(w, http.StatusOK, out)
}

// assignTags is POST /templates/tags {target: "name:tag", tags}: the
// build the target's tag names gets tags too.
func (s *Service) assignTags(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if err := decode(w, r, &req); err != nil {
		fail(w, err)
		return
	}
	alias, tag, err := splitName(req.Target)
	if err != nil {
		fail(w, err)
		return
	}
	if len(req.Tags) == 0 {
		fail(w, errdefs.New(errdefs.ErrBadInput, "tags: name at least one"))
		return
	}
	for _, t := range req.Tags {
		if !validTag.MatchString(t) {
			fail(w, errdefs.New(errdefs.ErrBadInput, "tag %q: 1-128 of letters, digits, '_', '.' and '-' (a tag alone, not name:tag)", t))
			return
		}
	}
	t, g, err := s.tagged(r, alias, tag)
	if err != nil {
		fail(w, err)
		return
	}
	if err := s.cfg.Store.Teams().SetE2BTags(r.Context(), t.ID, g.BuildID, g.Template, req.Tags); err != nil {
		fail(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"buildID": g.BuildID, "tags": req.Tags})
}

// tagged is the caller's template alias and its tag (defaultTag if "").
func (s *Service) tagged(r *http.Request, alias, tag string) (store.E2BTemplate, store.E2BTag, error) {
	if tag == "" {
		tag = defaultTag
	}
	t, err := s.ownTemplate(r, alias)
	if err != nil {
		return t, store.E2BTag{}, err
	}
	tags, err := s.cfg.Store.Teams().E2BTags(r.Context(), t.ID)
	if err != nil {
		return t, store.E2BTag{}, err
	}
	for _, g := range tags {
		if g.Tag == tag {
			return t, g, nil
		}
	}
	return t, store.E2BTag{}, errdefs.New(errdefs.ErrNotFound, "template %s has no tag %q", alias, tag)
}

// removeTags is DELETE /templates/tags {name, tags}.
func (s *Service) removeTags(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if err := decode(w, r, &req); err != nil {
		fail(w, err)
		return
	}
	alias, _, err := splitName(req.Name)
	if err != nil {
		fail(w, err)
		return
	}
	if len(req.Tags) == 0 || slices.Contains(req.Tags, defaultTag) {
		fail(w, errdefs.New(errdefs.ErrBadInput, "tags: name at least one, and not %q (the latest build's)", defaultTag))
		return
	}
	t, err := s.ownTemplate(r, alias)
	if err != nil {
		fail(w, err)
		return
	}
	if err := s.cfg.Store.Teams().DeleteE2BTags(r.Context(), t.ID, req.Tags); err != nil {
		fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resolveTemplate is the registered template a create's templateID
// names: the caller's template by alias or ID, with a tag or its latest
// build; else the name itself (an operator's template, which
// sandboxes.Service checks the caller may use).
func (s *Service) resolveTemplate(ctx context.Context, ref string) (string, error) {
	alias, tag, _ := strings.Cut(ref, ":")
	t, err := s.cfg.Store.Teams().E2BTemplate(ctx, apikey.From(ctx).Team, alias)
	if errors.Is(err, errdefs.ErrNotFound) {
		return ref, nil
	}
	if err != nil {
		return "", err
	}
	if tag == "" {
		tag = defaultTag
	}
	tags, err := s.cfg.Store.Teams().E2BTags(ctx, t.ID)
	if err != nil {
		return "", err
	}
	for _, g := range tags {
		if g.Tag == tag {
			return g.Template, nil
		}
	}
	return "", errdefs.New(errdefs.ErrNotFound, "template %q: no build of it is ready (tag %q)", alias, tag)
}
