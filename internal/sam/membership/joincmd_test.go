package membership

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/cli"
	"sandstorm/internal/pki"
	"sandstorm/internal/sam/controlplane"
	"sandstorm/internal/sam/oidctest"
)

// servedCP is a control plane that controlplane.Serve runs on loopback
// until the test ends, for join commands to enrol into.
type servedCP struct {
	ctx       context.Context
	addr, dir string
}

// serveCP serves o (in a data dir of its own, named cp, on loopback).
func serveCP(t *testing.T, o controlplane.Options) *servedCP {
	t.Helper()
	s := &servedCP{dir: filepath.Join(t.TempDir(), "cp")}
	o.DataDir, o.Listen, o.Name, o.Log = s.dir, "127.0.0.1:0", "cp", slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithCancel(context.Background())
	s.ctx = ctx
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- controlplane.Serve(ctx, o, func(a string) { addr <- a })
	}()
	select {
	case s.addr = <-addr:
	case err := <-done:
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// join runs "sam-node join" into dir, trusting the control plane's CA,
// with stdin and the extra flags given.
func (s *servedCP) join(dir, stdin string, extra ...string) error {
	cmd := JoinCommand("sam-node", dir)
	cmd.SetArgs(append([]string{"--control-plane", "https://" + s.addr, "--ca", filepath.Join(s.dir, "pki", pki.CAFile),
		"--control-plane-name", "cp", "--name", filepath.Base(dir)}, extra...))
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	return cmd.ExecuteContext(s.ctx)
}

// TestJoinCommandOIDC: sam-node join --oidc-token-file (the command
// sam-router shares) enrols a machine into a control plane served with
// --oidc-issuer, --oidc-ca and an allow rule, with an ID token a real
// issuer signed; the same ID token does not enrol a second machine; both
// a bootstrap token and an ID token is a usage error.
func TestJoinCommandOIDC(t *testing.T) {
	client := oidctest.Client{ID: "sam-mesh", Secret: "s"}
	iss := oidctest.Start(t, []oidctest.User{{ID: "u1", Username: "alice", Password: "pw", Email: "alice@ops.example", EmailVerified: true}}, client)
	tmp := t.TempDir()
	caFile := filepath.Join(tmp, "oidc-ca.pem")
	os.WriteFile(caFile, iss.CAPEM, 0o644)
	cp := serveCP(t, controlplane.Options{
		OIDC:       controlplane.OIDCConfig{Issuer: iss.URL, ClientID: client.ID, AllowEmails: []string{"alice@ops.example"}},
		OIDCCAFile: caFile})

	tokFile := filepath.Join(tmp, "id-token")
	if err := os.WriteFile(tokFile, []byte(iss.IDToken(t, client, "alice", "pw")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	join := func(dir string, extra ...string) error { return cp.join(dir, "", extra...) }
	dir := filepath.Join(tmp, "node-a")
	if err := join(dir, "--oidc-token-file", tokFile); err != nil {
		t.Fatalf("join with an ID token: %v", err)
	}
	m, err := OpenDir(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if c, err := m.Verify(m.Credential()); err != nil || c.Member != "node-a" {
		t.Errorf("the joined member's credential: %+v, %v", c, err)
	}
	if err := join(filepath.Join(tmp, "node-b"), "--oidc-token-file", tokFile); err == nil || !strings.Contains(err.Error(), "already") {
		t.Errorf("a second machine with the same ID token: %v, want refused", err)
	}
	var usage cli.UsageError
	if err := join(filepath.Join(tmp, "node-c"), "--oidc-token-file", tokFile, "--token", "samb_x"); !errors.As(err, &usage) {
		t.Errorf("both --token and --oidc-token-file: %v, want a usage error", err)
	}
}

// TestJoinCommandTokenFile: join --token-file reads the bootstrap token
// from a file, or from stdin with "-" (reading only its first line), so
// it never needs to be on a command line; an empty one is refused before
// any enrolment, and so is a second token flag.
func TestJoinCommandTokenFile(t *testing.T) {
	tmp := t.TempDir()
	cp := serveCP(t, controlplane.Options{})
	caPEM, err := os.ReadFile(filepath.Join(cp.dir, "pki", pki.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	hc, err := httpsClient(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := os.ReadFile(filepath.Join(cp.dir, controlplane.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	operator := &controlplane.Client{Base: "https://" + cp.addr, AdminToken: strings.TrimSpace(string(admin)), HTTP: hc}
	tok, err := operator.CreateToken(cp.ctx, api.MeshTokenRequest{MaxUses: 2, TTLSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	join := cp.join
	joined := func(dir string) {
		t.Helper()
		m, err := OpenDir(dir, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if c, err := m.Verify(m.Credential()); err != nil || c.Member != filepath.Base(dir) {
			t.Errorf("%s's credential: %+v, %v", dir, c, err)
		}
	}

	tokFile := filepath.Join(tmp, "token")
	if err := os.WriteFile(tokFile, []byte(tok.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := join(filepath.Join(tmp, "node-a"), "", "--token-file", tokFile); err != nil {
		t.Fatalf("join --token-file FILE: %v", err)
	}
	joined(filepath.Join(tmp, "node-a"))
	// From stdin, with more after the token's line (a script fed on),
	// which is not the token.
	if err := join(filepath.Join(tmp, "node-b"), tok.Token+"\nrest of a script\n", "--token-file", "-"); err != nil {
		t.Fatalf("join --token-file -: %v", err)
	}
	joined(filepath.Join(tmp, "node-b"))
	// The token is spent (2 uses): a third join is refused by the
	// control plane, so the token really was the one read.
	if err := join(filepath.Join(tmp, "node-c"), tok.Token+"\n", "--token-file", "-"); err == nil {
		t.Error("a third join on a 2-use token read from stdin was accepted")
	}

	empty := filepath.Join(tmp, "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	for _, c := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"--token-file", empty}, "holds no token"},
		{"\n", []string{"--token-file", "-"}, "stdin held no token"},
		{"", []string{"--token-file", filepath.Join(tmp, "missing")}, "no such file"},
	} {
		if err := join(filepath.Join(tmp, "node-x"), c.stdin, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("join %v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(tmp, "node-x")); err == nil {
		t.Error("a join with no token made its mesh dir")
	}
	var usage cli.UsageError
	if err := join(filepath.Join(tmp, "node-y"), "", "--token-file", tokFile, "--token", tok.Token); !errors.As(err, &usage) {
		t.Errorf("both --token-file and --token: %v, want a usage error", err)
	}
}
