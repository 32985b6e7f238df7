package sandboxes

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/apikey"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/fleet/fleettest"
	"sandstorm/internal/store"
)

func service(t *testing.T) *Service {
	t.Helper()
	fe := fleettest.New(t, fleettest.NewNode())
	if err := fe.Store.PutTemplate(context.Background(), store.Template{Name: "web", Rootfs: t.TempDir(), Process: api.Process{Args: []string{"/bin/sleep"}}, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return &Service{Store: fe.Store, Fleet: fe.Fleet}
}

func as(team string) context.Context {
	if team == "" {
		return apikey.With(context.Background(), apikey.Caller{Operator: true})
	}
	return apikey.With(context.Background(), apikey.Caller{Team: team})
}

// TestCheckSettings: env names a process can take, labels that fit a
// query string, within their bound; anything else is bad input.
func TestCheckSettings(t *testing.T) {
	for _, c := range []struct {
		env, labels map[string]string
		ok          bool
	}{
		{map[string]string{"A": "1", "PATH": "/x"}, map[string]string{"k": "v"}, true},
		{map[string]string{"": "1"}, nil, false},
		{map[string]string{"A=B": "1"}, nil, false},
		{map[string]string{"A\x00": "1"}, nil, false},
		{nil, map[string]string{"a&b": "v"}, false},
		{nil, map[string]string{"k": "v\x00"}, false},
		{nil, map[string]string{"k": strings.Repeat("v", MaxLabelBytes)}, false},
	} {
		err := CheckSettings(c.env, c.labels)
		if c.ok != (err == nil) || err != nil && !errors.Is(err, errdefs.ErrBadInput) {
			t.Errorf("env %q labels %.20q: %v", c.env, c.labels, err)
		}
	}
}

// TestTeamsSeeOnlyTheirOwn: what a team makes is its own; another team
// finds it as it finds nothing (404, never 403) and does not list it;
// the operator sees all. A team names no principal; its named sandbox's
// is <team>.<name>.
func TestTeamsSeeOnlyTheirOwn(t *testing.T) {
	s := service(t)
	sb, m, err := s.Create(as("red"), CreateRequest{Template: "web", Name: "box", Meta: store.SandboxMeta{Env: map[string]string{"K": "v"}}})
	if err != nil {
		t.Fatal(err)
	}
	if m.Team != "red" || m.ID != sb.ID || m.Env["K"] != "v" || m.StartedAt.IsZero() {
		t.Errorf("kept of it: %+v", m)
	}
	if sb.Principal != "red.box" {
		t.Errorf("a team's named sandbox has principal %q, want red.box", sb.Principal)
	}
	if _, _, _, err := s.Find(as("red"), sb.ID); err != nil {
		t.Errorf("its team: %v", err)
	}
	if _, _, _, err := s.Find(as(""), "box"); err != nil {
		t.Errorf("the operator, by name: %v", err)
	}
	_, _, _, err = s.Find(as("blue"), sb.ID)
	_, _, _, none := s.Find(as("blue"), "no-such-sandbox")
	if !errors.Is(err, errdefs.ErrNotFound) || !errors.Is(none, errdefs.ErrNotFound) {
		t.Errorf("another team's sandbox: %v; a missing one: %v", err, none)
	}
	if strings.Replace(err.Error(), sb.ID, "X", 1) != strings.Replace(none.Error(), "no-such-sandbox", "X", 1) {
		t.Errorf("another team's sandbox is told apart from a missing one: %q vs %q", err, none)
	}
	for team, want := range map[string]int{"red": 1, "blue": 0, "": 1} {
		if vis, err := s.List(as(team)); err != nil || len(vis) != want {
			t.Errorf("team %q lists %d (%v), want %d", team, len(vis), err, want)
		}
	}
	if _, _, err := s.Create(as("red"), CreateRequest{Template: "web", Principal: "payments"}); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("a team naming a principal: %v", err)
	}
	if _, _, err := s.Create(as("red"), CreateRequest{Template: "web", Meta: store.SandboxMeta{Env: map[string]string{"A=B": ""}}}); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("a bad env name: %v", err)
	}
	if _, _, err := s.Create(as("red"), CreateRequest{Template: "nope"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("no such template: %v", err)
	}
	if vis, _ := s.List(as("")); len(vis) != 1 {
		t.Errorf("refused creates left %d sandboxes, want the one", len(vis))
	}
}

// TestTeamTemplates: a team's template is its own and the operator's;
// another team's is not found, exactly as a missing one.
func TestTeamTemplates(t *testing.T) {
	s := service(t)
	if err := s.Store.PutTemplate(context.Background(), store.Template{Name: "reds", Team: "red", Rootfs: t.TempDir(), Process: api.Process{Args: []string{"/bin/sleep"}}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ team, template string }{{"red", "reds"}, {"red", "web"}, {"", "reds"}, {"blue", "web"}} {
		if _, _, err := s.Create(as(c.team), CreateRequest{Template: c.template}); err != nil {
			t.Errorf("team %q from template %s: %v", c.team, c.template, err)
		}
	}
	_, _, err := s.Create(as("blue"), CreateRequest{Template: "reds"})
	_, _, none := s.Create(as("blue"), CreateRequest{Template: "nope"})
	if !errors.Is(err, errdefs.ErrNotFound) || strings.Replace(err.Error(), "reds", "X", 1) != strings.Replace(none.Error(), "nope", "X", 1) {
		t.Errorf("another team's template: %v; a missing one: %v", err, none)
	}
}
