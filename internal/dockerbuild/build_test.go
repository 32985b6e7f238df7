package dockerbuild

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"

	"sandstorm/internal/errdefs"
)

func TestEveryInstruction(t *testing.T) {
	e := newEnv(t)
	e.file("app.py", "print('hi')\n")
	e.file("src/lib/a.txt", "a\n")
	df := `FROM debian
ARG VERSION=1.0
ENV APP_HOME=/srv/app GREETING="hello world"
LABEL org.example.version=$VERSION maintainer=me
WORKDIR $APP_HOME
USER app
RUN echo $GREETING
COPY --chown=app:staff --chmod=0640 app.py ./
COPY src/ lib/
ADD app.py /opt/app.py
EXPOSE 8080 9000-9001/tcp
STOPSIGNAL SIGINT
MAINTAINER someone
ENTRYPOINT ["python3"]
CMD app.py
`
	img := e.mustBuild(df, nil)
	c := img.Config
	want := ImageConfig{
		Entrypoint:   []string{"python3"},
		Cmd:          []string{"/bin/sh", "-c", "app.py"},
		Env:          []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "APP_HOME=/srv/app", "GREETING=hello world"},
		WorkingDir:   "/srv/app",
		User:         "app",
		ExposedPorts: []int{8080, 9000, 9001},
		Labels:       map[string]string{"org.example.version": "1.0", "maintainer": "me"},
		StopSignal:   "SIGINT",
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("config:\n got %+v\nwant %+v", c, want)
	}
	// base, WORKDIR's mkdir, RUN, three copies.
	if len(img.Layers) != 6 {
		t.Fatalf("layers = %v, want 6", img.Layers)
	}
	steps := e.runner.steps
	if len(steps) != 1 {
		t.Fatalf("runs = %d", len(steps))
	}
	run := steps[0]
	if !slices.Equal(run.Args, []string{"/bin/sh", "-c", "echo $GREETING"}) || run.User != "app" || run.Workdir != "/srv/app" {
		t.Fatalf("run step = %+v", run)
	}
	if !slices.Contains(run.Env, "VERSION=1.0") || !slices.Contains(run.Env, "GREETING=hello world") {
		t.Fatalf("run env = %v", run.Env)
	}
	// WORKDIR made /srv/app, new directories 0755 root.
	checkStat(t, filepath.Join(e.layer(img, 4), "srv/app"), 0o755|os.ModeDir, 0, 0)
	// COPY --chown=app:staff --chmod=0640 app.py ./ lands in the workdir.
	checkStat(t, filepath.Join(e.layer(img, 2), "srv/app/app.py"), 0o640, 1000, 50)
	// The directory it went into is the image's (root's, from WORKDIR).
	checkStat(t, filepath.Join(e.layer(img, 2), "srv/app"), 0o755|os.ModeDir, 0, 0)
	// COPY src/ lib/ copies the directory's contents.
	checkStat(t, filepath.Join(e.layer(img, 1), "srv/app/lib/lib/a.txt"), 0o644, 0, 0)
	// ADD of a plain file copies it.
	checkContent(t, filepath.Join(e.layer(img, 0), "opt/app.py"), "print('hi')\n")
	// Each layer's root looks like the image's.
	checkStat(t, e.layer(img, 0), 0o755|os.ModeDir, 0, 0)
	out := e.out.String()
	for _, s := range []string{"Step 1/15 : FROM debian (Dockerfile:1)", "Step 7/15 : RUN echo $GREETING (Dockerfile:7)", "running echo $GREETING", "Step 15/15 : CMD app.py (Dockerfile:15)"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
}

func checkStat(t *testing.T, p string, mode os.FileMode, uid, gid int) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode() != mode || int(st.Uid) != uid || int(st.Gid) != gid {
		t.Fatalf("%s: %v %d:%d, want %v %d:%d", p, fi.Mode(), st.Uid, st.Gid, mode, uid, gid)
	}
}

func checkContent(t *testing.T, p, want string) {
	t.Helper()
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s = %q, want %q", p, got, want)
	}
}

func TestArgsAndBuildArgs(t *testing.T) {
	e := newEnv(t)
	e.file("v2.txt", "two")
	df := `ARG BASE=debian
FROM ${BASE}
ARG V=1
ARG FROMMETA
ENV X=${V}-x
COPY v${V}.txt /v/
RUN echo $X
CMD ["run", "$X"]
`
	img := e.mustBuild(df, map[string]string{"V": "2", "UNUSED": "u"})
	run := e.runner.steps[0]
	for _, kv := range []string{"V=2", "X=2-x"} {
		if !slices.Contains(run.Env, kv) {
			t.Errorf("run env %v lacks %s", run.Env, kv)
		}
	}
	if slices.ContainsFunc(run.Env, func(s string) bool { return strings.HasPrefix(s, "FROMMETA=") }) {
		t.Errorf("an ARG with no value is set: %v", run.Env)
	}
	if slices.Contains(img.Config.Env, "V=2") || !slices.Contains(img.Config.Env, "X=2-x") {
		t.Errorf("config env %v: ARGs stay out, ENV in", img.Config.Env)
	}
	// Exec form is not expanded (Docker's rule).
	if !slices.Equal(img.Config.Cmd, []string{"run", "$X"}) {
		t.Errorf("cmd = %v", img.Config.Cmd)
	}
	checkContent(t, filepath.Join(e.layer(img, 1), "v/v2.txt"), "two")
	if !strings.Contains(e.out.String(), "not used: UNUSED") {
		t.Errorf("no warning about UNUSED:\n%s", e.out.String())
	}
	// A meta ARG reaches a stage that declares it, and the build arg its
	// FROM.
	e.base["other"] = e.base["debian"]
	e.mustBuild("ARG BASE=debian\nARG M=meta\nFROM ${BASE}\nARG M\nRUN echo $M\n", map[string]string{"BASE": "other"})
	if last := e.runner.steps[len(e.runner.steps)-1]; !slices.Contains(last.Env, "M=meta") {
		t.Errorf("meta arg not in scope: %v", last.Env)
	}
	if !strings.Contains(e.out.String(), "FROM ${BASE}") {
		t.Errorf("output:\n%s", e.out.String())
	}
}

func TestDockerignore(t *testing.T) {
	e := newEnv(t)
	e.file(".dockerignore", "*.log\nsecret/\n!secret/keep\nbuild\n")
	e.file("main.go", "package main")
	e.file("debug.log", "log")
	e.file("sub/x.log", "sub log is not matched by *.log")
	e.file("secret/key", "k")
	e.file("secret/keep", "kept")
	e.file("build/out", "o")
	img := e.mustBuild("FROM scratch\nCOPY . /app/\n", nil)
	l := e.layer(img, 0)
	for _, p := range []string{"app/main.go", "app/sub/x.log", "app/secret/keep", "app/.dockerignore"} {
		if _, err := os.Lstat(filepath.Join(l, p)); err != nil {
			t.Errorf("%s missing: %v", p, err)
		}
	}
	for _, p := range []string{"app/debug.log", "app/secret/key", "app/build"} {
		if _, err := os.Lstat(filepath.Join(l, p)); err == nil {
			t.Errorf("%s copied though excluded", p)
		}
	}
	_, err := e.build("FROM scratch\nCOPY debug.log /\n", nil)
	if !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), "excluded") {
		t.Fatalf("COPY of an excluded file: %v", err)
	}
	// --exclude adds to .dockerignore.
	img = e.mustBuild("FROM scratch\nCOPY --exclude=*.go . /app/\n", nil)
	if _, err := os.Lstat(filepath.Join(e.layer(img, 0), "app/main.go")); err == nil {
		t.Error("--exclude did not exclude")
	}
}

func TestSymlinksAreCopiedNotFollowed(t *testing.T) {
	e := newEnv(t)
	outside := filepath.Join(t.TempDir(), "outside-secret")
	must(t, os.WriteFile(outside, []byte("OUTSIDE SECRET"), 0o600))
	must(t, os.MkdirAll(filepath.Join(e.ctxDir, "d"), 0o755))
	must(t, os.Symlink(outside, filepath.Join(e.ctxDir, "d/abs")))
	must(t, os.Symlink("../../../../../../../../"+outside, filepath.Join(e.ctxDir, "d/rel")))
	must(t, os.Symlink(filepath.Dir(outside), filepath.Join(e.ctxDir, "outdir")))
	img := e.mustBuild("FROM scratch\nCOPY d /d/\nCOPY d/abs /single\n", nil)
	for _, c := range []struct {
		layer     int
		p, target string
	}{
		{1, "d/abs", outside},
		{1, "d/rel", "../../../../../../../../" + outside},
		{0, "single", outside},
	} {
		got, err := os.Readlink(filepath.Join(e.layer(img, c.layer), c.p))
		if err != nil || got != c.target {
			t.Errorf("%s: link %q (%v), want %q", c.p, got, err, c.target)
		}
	}
	// Nothing of the outside file was read into any layer.
	filepath.Walk(e.store.root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), "OUTSIDE SECRET") {
				t.Errorf("%s holds the outside file's content", p)
			}
		}
		return nil
	})
	// A path through a symlink out of the context is refused.
	for _, c := range []struct{ df, want string }{
		{"FROM scratch\nCOPY outdir/outside-secret /x\n", "leads out of the build context"},
		{"FROM scratch\nCOPY outdir/* /x/\n", "no file in the build context matches"},
	} {
		if _, err := e.build(c.df, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.df, err, c.want)
		}
	}
	if left := e.store.tmpLeft(t); len(left) > 0 {
		t.Errorf("temporary directories left: %v", left)
	}
}

func TestRefusals(t *testing.T) {
	e := newEnv(t)
	e.file("a", "a")
	for _, c := range []struct{ df, want string }{
		{"FROM scratch\nCOPY ../etc/passwd /x\n", `Dockerfile:2: COPY ../etc/passwd /x: source ../etc/passwd: ".." is refused`},
		{"FROM scratch\nCOPY a/../../x /x\n", `".." is refused`},
		{"FROM scratch\nADD https://example.com/x.tar.gz /x\n", "Dockerfile:2: ADD https://example.com/x.tar.gz /x: https://example.com/x.tar.gz: a build reads the build context only, never a URL"},
		{"FROM scratch\nADD git@github.com:a/b.git /x\n", "never a URL"},
		{"FROM scratch\nRUN --mount=type=secret,id=x cat /run/secrets/x\n", "RUN --mount is not supported"},
		{"FROM scratch\nHEALTHCHECK CMD true\n", "HEALTHCHECK is not supported"},
		{"FROM scratch\nONBUILD RUN true\n", "ONBUILD is not supported"},
		{"FROM scratch AS a\nFROM scratch\nCOPY --from=a /x /x\n", "COPY --from is not supported"},
		{"FROM scratch\nCOPY nope /x\n", "nope: not found in the build context"},
		{"FROM scratch\nCOPY a a /x\n", "needs a directory destination"},
		{"FROM scratch\nEXPOSE 53/udp\n", "only TCP"},
		{"FROM scratch\nRUN <<EOF\necho\nEOF\n", "here-document"},
		{"FROM scratch\nBOGUS x\n", "Dockerfile:2: unknown instruction: BOGUS"},
		{"RUN true\n", "Dockerfile:1:"},
		{"FROM debian\nCOPY a /bin/a\n", "/bin is a symbolic link in the image"},
		{"FROM debian\nCOPY --chown=nobody a /a\n", `"nobody" is not in the image's /etc/passwd`},
		{"FROM nosuchimage\n", "Dockerfile:1: FROM nosuchimage: image nosuchimage not found"},
	} {
		_, err := e.build(c.df, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.df, err, c.want)
			continue
		}
		if !errors.Is(err, errdefs.ErrBadInput) && !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%q: error %v is of no kind", c.df, err)
		}
	}
	if len(e.runner.steps) != 0 {
		t.Errorf("ran %v", e.runner.commands())
	}
	if left := e.store.tmpLeft(t); len(left) > 0 {
		t.Errorf("temporary directories left: %v", left)
	}
}

func TestChownNamesAndImageDirectories(t *testing.T) {
	e := newEnv(t)
	e.file("f", "x")
	img := e.mustBuild("FROM debian\nCOPY --chown=app f /home/app/sub/f\n", nil)
	l := e.layer(img, 0)
	// /home/app keeps the image's mode and owner; the new sub dir and the
	// file are app's (uid 1000, its primary group 1001).
	checkStat(t, filepath.Join(l, "home/app"), 0o750|os.ModeDir, 1000, 1000)
	checkStat(t, filepath.Join(l, "home/app/sub"), 0o755|os.ModeDir, 1000, 1001)
	checkStat(t, filepath.Join(l, "home/app/sub/f"), 0o644, 1000, 1001)
	checkStat(t, filepath.Join(l, "home"), 0o755|os.ModeDir, 0, 0)
	// A directory the image has is copied into, not over.
	img = e.mustBuild("FROM debian\nCOPY f /home/app\n", nil)
	checkContent(t, filepath.Join(e.layer(img, 0), "home/app/f"), "x")
}

func TestMultiStageAndTarget(t *testing.T) {
	e := newEnv(t)
	df := `FROM debian AS build
RUN echo build
FROM build AS test
RUN echo test
FROM debian AS unused
RUN echo unused
FROM build
RUN echo final
`
	e.mustBuild(df, nil)
	if got := e.runner.commands(); !slices.Equal(got, []string{"echo build", "echo final"}) {
		t.Fatalf("ran %v", got)
	}
	e.runner.steps = nil
	img, err := e.build(df, nil)
	if err != nil || len(e.runner.steps) != 0 {
		t.Fatalf("rebuild: %v, ran %v", err, e.runner.commands())
	}
	e.runner.steps = nil
	timg, err := Build(t.Context(), BuildOptions{Dockerfile: []byte(df), ContextDir: e.ctxDir, Target: "test",
		CacheDir: e.cache, Base: e.base, Runner: e.runner, Store: e.store})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.runner.commands(); !slices.Equal(got, []string{"echo test"}) {
		t.Fatalf("target test ran %v", got)
	}
	// test and the final stage share build's layers.
	if len(timg.Layers) != 3 || timg.Layers[1] != img.Layers[1] {
		t.Fatalf("target layers %v, final %v", timg.Layers, img.Layers)
	}
	if _, err := Build(t.Context(), BuildOptions{Dockerfile: []byte(df), ContextDir: e.ctxDir, Target: "nope",
		Base: e.base, Runner: e.runner, Store: e.store}); !errors.Is(err, errdefs.ErrBadInput) {
		t.Fatalf("unknown target: %v", err)
	}
}
