package dockerbuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sandstorm/internal/errdefs"
)

const eightSteps = `FROM debian
RUN echo one
COPY a.txt /a.txt
RUN echo three
RUN echo four
ENV X=1
RUN echo six
RUN echo seven
`

func TestSecondBuildIsCached(t *testing.T) {
	e := newEnv(t)
	e.file("a.txt", "a")
	first := e.mustBuild(eightSteps, nil)
	if n := len(e.runner.steps); n != 5 {
		t.Fatalf("first build ran %d steps", n)
	}
	entries := e.cacheEntries()
	second := e.mustBuild(eightSteps, nil)
	if n := len(e.runner.steps); n != 5 {
		t.Fatalf("second build ran %v again", e.runner.commands()[5:])
	}
	if !reflect.DeepEqual(first, second) {
		t.Fatalf("images differ:\n%+v\n%+v", first, second)
	}
	if got := strings.Count(e.out.String(), " ---> CACHED"); got != 6 {
		t.Fatalf("%d CACHED, want 6 (5 RUN, 1 COPY):\n%s", got, e.out.String())
	}
	if !slices.Equal(entries, e.cacheEntries()) {
		t.Fatalf("cache entries changed: %v -> %v", entries, e.cacheEntries())
	}
}

func TestOneLineChangeRerunsFromThatLine(t *testing.T) {
	e := newEnv(t)
	e.file("a.txt", "a")
	e.mustBuild(eightSteps, nil)
	e.runner.steps = nil
	changed := strings.Replace(eightSteps, "RUN echo four", "RUN echo FOUR", 1)
	e.mustBuild(changed, nil)
	if got := e.runner.commands(); !slices.Equal(got, []string{"echo FOUR", "echo six", "echo seven"}) {
		t.Fatalf("reran %v", got)
	}
	out := e.out.String()
	// Steps 2-4 are cached, 5 on are not.
	for _, l := range []string{"Step 2/8", "Step 3/8", "Step 4/8"} {
		if !strings.Contains(out, l) || !strings.Contains(after(out, l), " ---> CACHED") {
			t.Errorf("%s not cached:\n%s", l, out)
		}
	}
	if strings.Contains(after(out, "Step 5/8"), "CACHED") {
		t.Errorf("a step after the change was cached:\n%s", out)
	}
	// A copied file's content is part of its step's key.
	e.runner.steps = nil
	e.file("a.txt", "changed")
	e.mustBuild(changed, nil)
	if got := e.runner.commands(); !slices.Equal(got, []string{"echo three", "echo FOUR", "echo six", "echo seven"}) {
		t.Fatalf("after a.txt changed, reran %v", got)
	}
	// So is a build arg a RUN has in scope, from its ARG on.
	e.runner.steps = nil
	withArg := strings.Replace(changed, "RUN echo six", "ARG A=1\nRUN echo six", 1)
	e.mustBuild(withArg, nil)
	e.runner.steps = nil
	e.mustBuild(withArg, map[string]string{"A": "2"})
	if got := e.runner.commands(); !slices.Equal(got, []string{"echo six", "echo seven"}) {
		t.Fatalf("after A changed, reran %v", got)
	}
}

// after is s from the line that starts with step to the next step.
func after(s, step string) string {
	i := strings.Index(s, step)
	if i < 0 {
		return ""
	}
	rest := s[i+len(step):]
	if j := strings.Index(rest, "Step "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

func TestFailingRunNamesItsLineAndKeepsNothing(t *testing.T) {
	e := newEnv(t)
	df := "FROM debian\nRUN echo ok\n\n# a comment\nRUN pip install x && exit 1\nRUN echo never\n"
	_, err := e.build(df, nil)
	if err == nil {
		t.Fatal("a failing RUN built")
	}
	if want := "Dockerfile:5: RUN pip install x && exit 1: exit status 1"; err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
	if !errors.Is(err, errdefs.ErrBadInput) {
		t.Fatalf("error %v is not ErrBadInput", err)
	}
	if !strings.Contains(e.out.String(), "running pip install x && exit 1") {
		t.Fatalf("the step's output is not streamed:\n%s", e.out.String())
	}
	if got := e.runner.commands(); !slices.Equal(got, []string{"echo ok", "pip install x && exit 1"}) {
		t.Fatalf("ran %v", got)
	}
	// One entry: "RUN echo ok"'s, none for the failing step.
	if got := e.cacheEntries(); len(got) != 1 {
		t.Fatalf("cache entries %v, want one", got)
	}
	if left := e.store.tmpLeft(t); len(left) > 0 {
		t.Fatalf("temporary directories left: %v", left)
	}
	// A failing COPY (its directory made, then refused) leaves none either.
	e.file("d/f", "x")
	must(t, os.Symlink("f", filepath.Join(e.ctxDir, "d/l")))
	_, err = e.build("FROM debian\nCOPY d /home/app/\nCOPY d/f /home/app/l/\n", nil)
	if err == nil {
		t.Fatal("copied under a symlink")
	}
	if left := e.store.tmpLeft(t); len(left) > 0 {
		t.Fatalf("temporary directories left: %v", left)
	}
}

func TestAddExtractsLocalTar(t *testing.T) {
	e := newEnv(t)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, f := range []struct{ name, body string }{{"pkg/bin/tool", "tool"}, {"pkg/README", "read me"}} {
		must(t, tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o755, Size: int64(len(f.body)), Typeflag: tar.TypeReg}))
		tw.Write([]byte(f.body))
	}
	must(t, tw.Close())
	must(t, zw.Close())
	e.file("pkg.tar.gz", buf.String())
	img := e.mustBuild("FROM debian\nADD pkg.tar.gz /opt\nADD --unpack=false pkg.tar.gz /keep/\n", nil)
	checkContent(t, filepath.Join(e.layer(img, 1), "opt/pkg/bin/tool"), "tool")
	checkContent(t, filepath.Join(e.layer(img, 0), "keep/pkg.tar.gz"), buf.String())

	// An archive that would escape is refused, and leaves nothing.
	buf.Reset()
	tw = tar.NewWriter(&buf)
	must(t, tw.WriteHeader(&tar.Header{Name: "../escape", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg}))
	tw.Write([]byte("x"))
	must(t, tw.Close())
	e.file("bad.tar", buf.String())
	_, err := e.build("FROM debian\nADD bad.tar /opt\n", nil)
	if !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), "Dockerfile:2: ADD bad.tar /opt") {
		t.Fatalf("escaping tar: %v", err)
	}
	if left := e.store.tmpLeft(t); len(left) > 0 {
		t.Fatalf("temporary directories left: %v", left)
	}
}
