package fleetup

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sandstorm/internal/sam/membership"
)

// TestMemberOf: a mesh dir kept by a fleet down without --purge (a
// credential and this control plane's CA) is a member already, and fleet
// up starts it without a token; an empty or half-joined one joins; one of
// another control plane is an error that says what to do.
func TestMemberOf(t *testing.T) {
	c := &meshCP{ca: []byte("-----BEGIN CERTIFICATE-----\nthis one\n-----END CERTIFICATE-----\n")}
	dir := t.TempDir()
	if ok, err := c.memberOf(filepath.Join(dir, "none")); ok || err != nil {
		t.Errorf("no dir: %v %v", ok, err)
	}
	// A failed join leaves the CA, not a credential.
	os.WriteFile(filepath.Join(dir, membership.CAFile), c.ca, 0o600)
	if ok, err := c.memberOf(dir); ok || err != nil {
		t.Errorf("a CA and no credential: %v %v", ok, err)
	}
	os.WriteFile(filepath.Join(dir, membership.CredentialFile), []byte("{}"), 0o600)
	if ok, err := c.memberOf(dir); !ok || err != nil {
		t.Errorf("a member of this control plane: %v %v", ok, err)
	}
	os.WriteFile(filepath.Join(dir, membership.CAFile), []byte("another CA"), 0o600)
	if _, err := c.memberOf(dir); err == nil || !strings.Contains(err.Error(), "another mesh") || !strings.Contains(err.Error(), dir) {
		t.Errorf("a member of another control plane: %v", err)
	}
}

// TestLocalProcs: what fleet down --purge removes here (data dirs and
// logs) is every process of the fleet on this machine — master, nodes,
// the mesh's — and nothing of a node or sam-node on another host, whose
// own purge removes its files there.
func TestLocalProcs(t *testing.T) {
	p := func(name string) Proc { return Proc{DataDir: "/f/" + name, Log: "/f/" + name + ".log"} }
	st := State{
		Master: p("master"),
		Nodes:  []NodeState{{Proc: p("node-1"), Name: "node-1"}, {Proc: p("far"), Name: "far", Host: "root@far"}},
		Mesh: &MeshState{ControlPlane: p("control-plane"), Routers: []MeshRouter{{Proc: p("router-1")}},
			Nodes: []MeshNode{{Proc: p("node-1-mesh")}, {Proc: p("far-mesh"), Host: "root@far"}}},
	}
	var got []string
	for _, pr := range localProcs(st) {
		got = append(got, pr.DataDir+","+pr.Log)
	}
	want := "/f/master,/f/master.log /f/node-1,/f/node-1.log /f/node-1-mesh,/f/node-1-mesh.log /f/router-1,/f/router-1.log /f/control-plane,/f/control-plane.log"
	if strings.Join(got, " ") != want {
		t.Errorf("local procs:\n got %v\nwant %s", got, want)
	}
}

// TestNodeArgs: "{addr}" in --node-arg is each node's own address.
func TestNodeArgs(t *testing.T) {
	got := nodeArgs([]string{"--ingress-public", "{addr}", "--ingress-dns={addr}:5353", "--freeze-after=2s"}, "10.1.2.3")
	want := []string{"--ingress-public", "10.1.2.3", "--ingress-dns=10.1.2.3:5353", "--freeze-after=2s"}
	if !slices.Equal(got, want) {
		t.Errorf("nodeArgs: %q, want %q", got, want)
	}
}
