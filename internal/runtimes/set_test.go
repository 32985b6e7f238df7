package runtimes

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// fakeBuild writes a stand-in for a runsc build: a script that prints
// "runsc version <version>" (extra makes two scripts of one version
// differ).
func fakeBuild(t *testing.T, dir, version, extra string) string {
	t.Helper()
	p := filepath.Join(dir, "runsc")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n# "+extra+"\necho 'runsc version "+version+"'\necho 'spec: 1.2.1'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// versionCounted runs the binary, as gvisor.Version does, counting calls.
func versionCounted(calls *atomic.Int32) VersionFunc {
	return func(ctx context.Context, path string) (string, error) {
		calls.Add(1)
		out, err := exec.CommandContext(ctx, path, "--version").Output()
		if err != nil {
			return "", err
		}
		line, _, _ := strings.Cut(string(out), "\n")
		return strings.TrimPrefix(line, "runsc version "), nil
	}
}

func TestOpenKeepsEveryBuild(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "runsc-versions")
	var calls atomic.Int32
	ver := versionCounted(&calls)
	srcA := fakeBuild(t, t.TempDir(), "v-a", "build a")

	s, err := Open(ctx, dir, srcA, ver, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := s.Current()
	if a.Version != "v-a" || !a.Key.Valid() || !strings.HasPrefix(string(a.Key), "v-a-") {
		t.Fatalf("current build %+v", a)
	}
	if a.Path == srcA || filepath.Dir(filepath.Dir(a.Path)) != dir {
		t.Fatalf("the node runs %s, want a copy under %s", a.Path, dir)
	}
	src, _ := os.ReadFile(srcA)
	kept, _ := os.ReadFile(a.Path)
	if !bytes.Equal(src, kept) {
		t.Fatal("the kept copy differs from its source")
	}
	for _, p := range []struct {
		path string
		mode os.FileMode
	}{{dir, 0o700}, {filepath.Dir(a.Path), 0o700}, {a.Path, 0o755}} {
		fi, err := os.Stat(p.path)
		if err != nil || fi.Mode().Perm() != p.mode {
			t.Errorf("%s: %v %v, want mode %v", p.path, fi.Mode(), err, p.mode)
		}
	}

	if _, err := os.Stat(filepath.Join(filepath.Dir(a.Path), checkedFile)); err != nil {
		t.Fatalf("no record of the copy's identity when it hashed right: %v", err)
	}
	// The same file again: recognised by its identity, not copied or run.
	calls.Store(0)
	s, err = Open(ctx, dir, srcA, ver, nil)
	if err != nil || s.Current() != a || calls.Load() != 0 {
		t.Fatalf("reopened with the same source: %+v, %v, %d version calls", s.Current(), err, calls.Load())
	}

	// An upgrade: another build of the same version (two builds can claim
	// one), then another version. Each is kept under a key of its own.
	srcB := fakeBuild(t, t.TempDir(), "v-a", "build b, same version string")
	s, err = Open(ctx, dir, srcB, ver, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := s.Current()
	if b.Key == a.Key || b.Version != a.Version {
		t.Fatalf("a second build of version v-a got key %s (first: %s)", b.Key, a.Key)
	}
	if got := s.Keys(); len(got) != 2 {
		t.Fatalf("kept %v, want both builds", got)
	}
	// A copy of build a elsewhere is build a: not copied in twice.
	other := filepath.Join(t.TempDir(), "runsc")
	os.WriteFile(other, src, 0o755)
	s, err = Open(ctx, dir, other, ver, nil)
	if err != nil || s.Current().Key != a.Key || len(s.Keys()) != 2 {
		t.Fatalf("the same bytes at another path: current %s, kept %v, %v", s.Current().Key, s.Keys(), err)
	}

	if err := s.Remove(a.Key); err == nil {
		t.Fatal("the current build was removed")
	}
	if err := s.Remove(b.Key); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(b.Path)); !os.IsNotExist(err) {
		t.Fatalf("removed build's directory: %v", err)
	}
	if _, err := s.Get(b.Key); !errors.Is(err, ErrNotKept) {
		t.Fatalf("Get of a removed build: %v", err)
	}
	if p := s.PathOf(b.Key); p != b.Path {
		t.Fatalf("PathOf a removed build = %s, want its old path (which fails to run)", p)
	}
	if _, err := os.Stat(s.PathOf(b.Key)); !os.IsNotExist(err) {
		t.Fatal("a removed build can still be run")
	}
	if p := s.PathOf("../../bin-0123456789abcdef"); !strings.HasPrefix(p, dir+"/") {
		t.Fatalf("PathOf an invalid key = %s", p)
	}
}

// TestOpenRefusesAnAlteredBuild: a kept build whose bytes no longer hash
// to its name is never run (moved aside, Get refuses it), and one whose
// mode was loosened is tightened again; a copy cut short is removed.
func TestOpenRefusesAnAlteredBuild(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "runsc-versions")
	var calls atomic.Int32
	ver := versionCounted(&calls)
	s, err := Open(ctx, dir, fakeBuild(t, t.TempDir(), "v-old", "old"), ver, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := s.Current()
	srcNew := fakeBuild(t, t.TempDir(), "v-new", "new")
	s, err = Open(ctx, dir, srcNew, ver, nil)
	if err != nil {
		t.Fatal(err)
	}
	cur := s.Current()
	f, err := os.OpenFile(old.Path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("echo pwned\n")
	f.Close()
	os.Chmod(cur.Path, 0o777)
	os.Mkdir(filepath.Join(dir, newPrefix+"cut-short"), 0o700)

	s, err = Open(ctx, dir, srcNew, ver, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(old.Key); !errors.Is(err, ErrNotKept) || !strings.Contains(err.Error(), "changed after it was kept") {
		t.Fatalf("Get of the altered build: %v", err)
	}
	if _, err := os.Stat(old.Path); !os.IsNotExist(err) {
		t.Fatal("the altered build is still where it would be run")
	}
	aside, _ := filepath.Glob(filepath.Join(dir, string(old.Key)+refusedTag+"*"))
	if len(aside) != 1 {
		t.Fatalf("the altered build was not kept aside for a person to look at: %v", aside)
	}
	if fi, _ := os.Stat(cur.Path); fi.Mode().Perm() != 0o755 {
		t.Fatalf("loosened mode not repaired: %v", fi.Mode())
	}
	if _, err := os.Stat(filepath.Join(dir, newPrefix+"cut-short")); !os.IsNotExist(err) {
		t.Fatal("a copy cut short was kept")
	}
	if got := s.Refused(); len(got) != 1 || got[old.Key] == "" {
		t.Fatalf("Refused() = %v", got)
	}

	// doctor's read-only look sees the refused one no more, and reports a
	// loosened mode instead of repairing it.
	os.Chmod(cur.Path, 0o775)
	ins, _, err := Inspect(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ins) != 1 || ins[0].Key != cur.Key || ins[0].Err == nil {
		t.Fatalf("Inspect = %+v", ins)
	}
	if fi, _ := os.Stat(cur.Path); fi.Mode().Perm() != 0o775 {
		t.Fatal("Inspect changed the mode")
	}
}

func TestStampAndImageVersion(t *testing.T) {
	img := t.TempDir()
	if k, err := ReadStamp(img); k != "" || err != nil {
		t.Fatalf("no stamp: %q, %v", k, err)
	}
	b := Build{Key: Key("v-" + shaA[:16]), Version: "v", SHA256: shaA}
	if err := WriteStamp(img, b); err != nil {
		t.Fatal(err)
	}
	if k, err := ReadStamp(img); k != b.Key || err != nil {
		t.Fatalf("ReadStamp = %q, %v", k, err)
	}
	os.WriteFile(filepath.Join(img, StampFile), []byte(`{"key":"../x"}`), 0o600)
	if _, err := ReadStamp(img); err == nil {
		t.Fatal("a stamp naming no key was taken")
	}

	// A state file as gVisor writes one: magic, metadata length, metadata.
	meta, _ := json.Marshal(map[string]string{"runsc_version": "gvisor.dev/gvisor@test", "_timestamp": "now"})
	var buf bytes.Buffer
	buf.Write(statefileMagic)
	binary.Write(&buf, binary.BigEndian, uint64(len(meta)))
	buf.Write(meta)
	buf.WriteString("the state itself")
	os.WriteFile(filepath.Join(img, "checkpoint.img"), buf.Bytes(), 0o600)
	if v, err := ImageVersion(img); v != "gvisor.dev/gvisor@test" || err != nil {
		t.Fatalf("ImageVersion = %q, %v", v, err)
	}
	os.WriteFile(filepath.Join(img, "checkpoint.img"), []byte("not a state file at all"), 0o600)
	if _, err := ImageVersion(img); err == nil {
		t.Fatal("ImageVersion of garbage")
	}
}

func TestReport(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "v")
	var calls atomic.Int32
	s, err := Open(context.Background(), dir, fakeBuild(t, t.TempDir(), "v1", ""), versionCounted(&calls), nil)
	if err != nil {
		t.Fatal(err)
	}
	keep, _, missing := Plan(s.Keys(), s.Current().Key, []Ref{{Key: "gone-" + Key(shaB[:16]), Use: Image, ID: "x"}})
	if err := s.WriteReport(keep, missing); err != nil {
		t.Fatal(err)
	}
	ins, rep, err := Inspect(dir)
	if err != nil || len(ins) != 1 || ins[0].Err != nil {
		t.Fatalf("Inspect: %+v %v", ins, err)
	}
	if rep == nil || rep.Current != s.Current().Key || len(rep.Kept) != 1 || len(rep.Missing) != 1 || rep.Builds[s.Current().Key].Version != "v1" {
		t.Fatalf("report %+v", rep)
	}
}
