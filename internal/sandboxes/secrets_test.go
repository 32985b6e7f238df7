package sandboxes

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/fleet/fleettest"
	"sandstorm/internal/secrets"
	"sandstorm/internal/store"
)

// TestSecretsAreTheTeams: a secret is stored sealed (its value nowhere in
// its row), listed without its value to its own team only, and bound at
// a create as a new marker in the sandbox's env, its value going to the
// node alone; another team's name is not found, a variable also in env
// is refused, and bad input is refused before anything is stored.
func TestSecretsAreTheTeams(t *testing.T) {
	node := fleettest.NewNode()
	fe := fleettest.New(t, node)
	if err := fe.Store.PutTemplate(as(""), store.Template{Name: "web", Rootfs: t.TempDir(), Process: api.Process{Args: []string{"/bin/sleep"}}}); err != nil {
		t.Fatal(err)
	}
	box, err := secrets.OpenBox(filepath.Join(t.TempDir(), secrets.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{Store: fe.Store, Fleet: fe.Fleet, Secrets: box}
	const value = "tok-0123456789"
	if _, err := s.PutSecret(as("red"), api.SecretRequest{Name: "api", Value: value, Hosts: []string{"API.example.com"}}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []api.SecretRequest{
		{Name: "x y", Value: "v", Hosts: []string{"a.example"}},
		{Name: "x", Value: "", Hosts: []string{"a.example"}},
		{Name: "x", Value: "v\n", Hosts: []string{"a.example"}},
		{Name: "x", Value: "v", Hosts: []string{"10.0.0.1"}},
		{Name: "x", Value: "v"},
	} {
		if _, err := s.PutSecret(as("red"), bad); !errors.Is(err, errdefs.ErrBadInput) {
			t.Errorf("%+v: %v; want bad input", bad, err)
		}
	}
	row, err := fe.Store.Secrets().Get(as(""), "red", "api")
	if err != nil || strings.Contains(string(row.Sealed), value) || row.Hosts[0] != "api.example.com" {
		t.Fatalf("the stored row: %+v, %v", row, err)
	}
	if l, _ := s.ListSecrets(as("blue")); len(l) != 0 {
		t.Errorf("blue lists red's secrets: %+v", l)
	}
	if l, _ := s.ListSecrets(as("red")); len(l) != 1 || l[0].Name != "api" {
		t.Errorf("red's list: %+v", l)
	}

	sb, meta, err := s.Create(as("red"), CreateRequest{Template: "web", Secrets: map[string]string{"TOKEN": "api"}})
	if err != nil {
		t.Fatal(err)
	}
	marker := meta.Env["TOKEN"]
	sent := node.Secrets[sb.ID]
	if !strings.HasPrefix(marker, secrets.MarkerPrefix) || len(sent) != 1 || sent[0].Marker != marker || sent[0].Value != value || sent[0].Hosts[0] != "api.example.com" {
		t.Errorf("env %q; the node was sent %+v", meta.Env, sent)
	}
	if meta.Env["NODE_EXTRA_CA_CERTS"] != api.SecretCAPath {
		t.Errorf("NODE_EXTRA_CA_CERTS = %q", meta.Env["NODE_EXTRA_CA_CERTS"])
	}
	if _, _, err := s.Create(as("blue"), CreateRequest{Template: "web", Secrets: map[string]string{"TOKEN": "api"}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("blue binding red's secret: %v; want not found", err)
	}
	clash := CreateRequest{Template: "web", Secrets: map[string]string{"TOKEN": "api"}, Meta: store.SandboxMeta{Env: map[string]string{"TOKEN": "x"}}}
	if _, _, err := s.Create(as("red"), clash); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("a variable in env and secrets: %v", err)
	}
	if err := s.DeleteSecret(as("blue"), "api"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("blue deleting red's: %v", err)
	}
}
