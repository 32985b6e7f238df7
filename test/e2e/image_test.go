package e2e

import (
	"archive/tar"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"sandstorm/api"
	"sandstorm/internal/client"
	"sandstorm/internal/ociimage/ocitest"
	"sandstorm/internal/testenv"
)

// imageFixture is the web demo as an image in a registry the test runs
// (basic auth), the way a user would bring it: the rootfs as one layer,
// and a second that adds a user, deletes a file of the first (a
// whiteout) and replaces a directory's contents (opaque); the config
// names the interpreter by its bare name (found on the image's PATH) and
// a user by name.
type imageFixture struct {
	reg            *ocitest.Registry
	ref            string // repo:tag
	digestRef      string // repo@sha256:…
	img            v1.Image
	cfg            v1.Config
	layers         []v1.Layer // img's: the web rootfs, then the two above
	goodAuth       string     // a Docker config file with the right password
	badAuth        string     // … and with a wrong one
	password, user string
}

func newImageFixture(t *testing.T) *imageFixture {
	t.Helper()
	f := &imageFixture{user: "puller", password: "s3cret-pull-token"}
	f.reg = ocitest.NewRegistry(t, ocitest.Options{User: f.user, Password: f.password})
	base := ocitest.ImageFromDir(t, webRootfs)
	layers, err := base.Layers()
	if err != nil {
		t.Fatal(err)
	}
	passwd, err := os.ReadFile(filepath.Join(webRootfs, "etc", "passwd"))
	if err != nil {
		passwd = []byte("root:x:0:0:root:/root:/bin/sh\n")
	}
	top := ocitest.LayerFromTar(t, ocitest.Tar(t, []ocitest.TarEntry{
		{Name: "etc/passwd", Type: tar.TypeReg, Mode: 0o644, Body: append(passwd, "app:x:1001:1001:app:/home/app:/bin/false\n"...)},
		{Name: "etc/group", Type: tar.TypeReg, Mode: 0o644, Body: []byte("root:x:0:\napp:x:1001:\n")},
		{Name: "srv/.wh.app.py.orig", Type: tar.TypeReg, Mode: 0o644},
		{Name: "srv/image-layer", Type: tar.TypeReg, Mode: 0o644, Body: []byte("from the second layer\n")},
		{Name: "opt/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "opt/.wh..wh..opq", Type: tar.TypeReg, Mode: 0o644},
		{Name: "opt/new", Type: tar.TypeReg, Mode: 0o644, Body: []byte("new\n")},
	}))
	bottom := ocitest.LayerFromTar(t, ocitest.Tar(t, []ocitest.TarEntry{
		{Name: "srv/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "srv/app.py.orig", Type: tar.TypeReg, Mode: 0o644, Body: []byte("deleted by the layer above\n")},
		{Name: "opt/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "opt/old", Type: tar.TypeReg, Mode: 0o644, Body: []byte("hidden by the opaque directory above\n")},
	}))
	env := slices.DeleteFunc(slices.Clone(webDemo.Env), func(e string) bool { return strings.HasPrefix(e, "PATH=") })
	cfg := v1.Config{
		Entrypoint:   []string{"python3"},
		Cmd:          webDemo.Args[1:],
		Env:          append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, env...),
		WorkingDir:   "/srv",
		User:         "app",
		ExposedPorts: map[string]struct{}{"8000/tcp": {}},
	}
	f.cfg, f.layers = cfg, append(append(layers, bottom), top)
	f.img = ocitest.ImageOf(t, cfg, f.layers...)
	f.ref = "team/web:1"
	f.reg.Push(t, f.img, f.ref)
	d, err := f.img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	f.digestRef = f.reg.Host + "/team/web@" + d.String()
	f.goodAuth = writeDockerConfig(t, f.reg.Host, f.user, f.password)
	f.badAuth = writeDockerConfig(t, f.reg.Host, f.user, "wrong-password-xyz")
	return f
}

// variant pushes as ref (repo:tag) the image with one more layer on top,
// a file of its own, and returns its reference.
func (f *imageFixture) variant(t *testing.T, ref string) string {
	t.Helper()
	extra := ocitest.LayerFromTar(t, ocitest.Tar(t, []ocitest.TarEntry{{Name: "srv/variant", Type: tar.TypeReg, Mode: 0o644, Body: []byte("a variant of the image\n")}}))
	f.reg.Push(t, ocitest.ImageOf(t, f.cfg, append(slices.Clone(f.layers), extra)...), ref)
	return f.reg.Ref(ref)
}

func writeDockerConfig(t *testing.T, host, user, password string) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{host: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password))}}})
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// layerDirs lists the master's layer store.
func (d *Daemon) layerDirs(t *testing.T) []string {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(d.DataDir, "layers"))
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestImageTemplate: a template from an image in a registry with basic
// auth — a wrong password refused with nothing kept and no password in
// the error; the right one gives a template whose process, user, working
// directory and port come from the image's config, and whose layers were
// applied as an OCI runtime would; its sandbox keeps its memory through
// every tier and a clone; the same image by digest fetches no blob again;
// a corrupt blob is refused and nothing of it kept; and the template
// exported as a docker archive is a template again.
func TestImageTemplate(t *testing.T) {
	d := startDaemon(t)
	f := newImageFixture(t)
	env := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN="}
	ref := f.reg.Ref(f.ref)

	res := cli(t, env, "template", "create", "imgbad", "--image", ref, "--registry-auth", f.badAuth)
	res.fails(t, "a template from a registry with a wrong password", `(?i)unauthori|denied|401`)
	if strings.Contains(res.Stderr+res.Stdout, "wrong-password-xyz") {
		t.Errorf("the password is in the CLI's output: %s", res.Stderr)
	}
	if logs, _ := os.ReadFile(d.LogPath); strings.Contains(string(logs), "wrong-password-xyz") || strings.Contains(string(logs), f.password) {
		t.Error("a registry password is in the daemon's log")
	}
	if got := d.layerDirs(t); len(got) != 0 {
		t.Errorf("a refused pull kept layers: %v", got)
	}
	if _, err := d.C.Template(ctxT(t), "imgbad"); err == nil {
		t.Error("a refused pull registered its template")
	}

	made := cli(t, env, "template", "create", "img", "--image", ref, "--registry-auth", f.goodAuth)
	made.ok(t, "a template from an image", `template img registered`, `from .*@sha256:`)
	// Its progress, as it came: each layer, the unpack, the nodes.
	if !regexp.MustCompile(`(?s)pulling .*layer 1/\d+ sha256:[0-9a-f]{12}: pulled.*unpacking \d+ layer\(s\).*readying template img`).MatchString(made.Stderr) {
		t.Errorf("template create --image showed no progress:\n%s", made.Stderr)
	}
	tp, err := d.C.Template(ctxT(t), "img")
	if err != nil {
		t.Fatal(err)
	}
	if tp.Process.Args[0] != "/usr/bin/python3" || tp.Process.User != "1001:1001" || tp.Process.Cwd != "/srv" || !slices.Equal(tp.Ports, []int{8000}) || !strings.Contains(tp.Image, "@sha256:") {
		t.Errorf("the template from the image's config: %+v %v image %s", tp.Process, tp.Ports, tp.Image)
	}
	sb := d.create(t, "img", "fromimage")
	ep := endpoint(t, sb)
	expectCount(t, ep, 1, "the image's server")
	py := "/usr/bin/python3"
	check := "import os; print(os.stat('/proc/1').st_uid, os.path.exists('/srv/app.py.orig'), sorted(os.listdir('/opt')), open('/srv/image-layer').read().strip())"
	cli(t, env, "sandbox", "exec", sb.ID, "--", py, "-c", check).ok(t, "the image's layers and user", `^1001 False \['new'\] from the second layer`)

	// Every tier keeps its memory, as the demo templates' do.
	d.transition(t, sb.ID, "freeze", api.TierFrozen)
	expectCount(t, ep, 2, "after a freeze")
	d.transition(t, sb.ID, "snapshot", api.TierSnapshot)
	expectCount(t, ep, 3, "after a snapshot")
	res2, err := d.C.Clone(ctxT(t), sb.ID, api.CloneRequest{Count: 1, Reseed: &api.Reseed{Signal: "SIGUSR1"}})
	if err != nil || len(res2.Children) != 1 {
		t.Fatalf("clone of an image's sandbox: %+v %v", res2, err)
	}
	d.track(res2.Children[0].ID)
	expectCount(t, endpoint(t, res2.Children[0]), 4, "a clone (its parent's memory)")
	d.transition(t, sb.ID, "detach", api.TierDetached)
	expectCount(t, ep, 1, "after a detach (a cold start)")

	// By digest: every layer is in the store, so no blob is fetched.
	imgLayers, _ := f.img.Layers()
	layerGets := func() (n int) {
		for _, l := range imgLayers {
			d, _ := l.Digest()
			n += f.reg.BlobGets(d)
		}
		return n
	}
	before := layerGets()
	again := cli(t, env, "template", "create", "img2", "--image", f.digestRef, "--registry-auth", f.goodAuth)
	again.ok(t, "the same image by digest", `template img2 registered`)
	if !strings.Contains(again.Stderr, "already here") || strings.Contains(again.Stderr, ": pulled") {
		t.Errorf("the second pull's progress does not say its layers were there:\n%s", again.Stderr)
	}
	if got := layerGets(); got != before {
		t.Errorf("a second template of the same layers fetched %d layer blob(s)", got-before)
	}

	// A blob that does not match its digest: refused, nothing kept.
	bad := ocitest.ImageOf(t, v1.Config{Cmd: []string{"/usr/bin/python3"}}, ocitest.LayerFromTar(t, ocitest.Tar(t, []ocitest.TarEntry{{Name: "x", Type: tar.TypeReg, Mode: 0o644, Body: []byte("some bytes to corrupt")}})))
	f.reg.Push(t, bad, "team/bad:1")
	bl, _ := bad.Layers()
	bd, _ := bl[0].Digest()
	f.reg.Corrupt(bd, nil)
	layersBefore := d.layerDirs(t)
	cli(t, env, "template", "create", "imgcorrupt", "--image", f.reg.Ref("team/bad:1"), "--registry-auth", f.goodAuth).fails(t, "an image whose blob does not match its digest", `(?i)digest`)
	if got := d.layerDirs(t); !slices.Equal(got, layersBefore) {
		t.Errorf("a corrupt blob left something in the layer store: %v, was %v", got, layersBefore)
	}

	// Exported as a docker archive, it is an image again.
	archive := filepath.Join(t.TempDir(), "img.tar")
	cli(t, env, "template", "export", "img", "-o", archive).ok(t, "export")
	cli(t, env, "template", "create", "reimported", "--image", "docker-archive:"+archive, "--port", "8000").ok(t, "a template from the exported archive", `template reimported registered`)
	expectCount(t, endpoint(t, d.create(t, "reimported", "reimported")), 1, "a sandbox of the re-imported template")
}

// buildDockerfile is a Dockerfile over the fixture's image using every
// instruction a build takes; the web demo's rootfs has no shell, so its
// RUNs are in exec form.
const buildDockerfile = `ARG BASE
FROM ${BASE}
ARG GREETING=hello
ENV APP_GREETING=${GREETING} PYTHONDONTWRITEBYTECODE=1
WORKDIR /srv/data
COPY notes.txt ./
ADD extra/ /srv/extra/
USER root
RUN ["/usr/bin/python3", "-c", "import os; print('step output: building in', os.getcwd()); open('/srv/data/built','w').write(os.environ['APP_GREETING'])"]
USER app
RUN ["/usr/bin/python3", "-c", "import os; print('second run as uid', os.getuid())"]
EXPOSE 8000
ENTRYPOINT ["python3"]
CMD ["/srv/app.py"]
`

// TestTemplateBuild: a Dockerfile with every instruction builds a
// template whose sandbox serves, with what its RUN and COPY steps made
// and without what .dockerignore excludes; a second build is served from
// the cache; a one-line change reruns only that step and those after it;
// a RUN cannot reach the metadata address, and its failure names its
// line, exits non-zero and registers nothing.
func TestTemplateBuild(t *testing.T) {
	f := newImageFixture(t)
	// The master pulls FROM with its own Docker config.
	d := newDaemon(t)
	d.wrap = func(cmd *exec.Cmd) { cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+filepath.Dir(f.goodAuth)) }
	d.Start(t)
	env := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN="}

	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(buildDockerfile), 0o644)
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("copied\n"), 0o644)
	os.MkdirAll(filepath.Join(dir, "extra"), 0o755)
	os.WriteFile(filepath.Join(dir, "extra", "a"), []byte("a\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "extra", "secret.key"), []byte("never in the image\n"), 0o600)
	os.WriteFile(filepath.Join(dir, ".dockerignore"), []byte("**/*.key\n"), 0o644)
	base := "--build-arg=BASE=" + f.reg.Ref(f.ref)

	first := cli(t, env, "template", "build", "built", base, dir)
	first.ok(t, "a build", `Step 1/`, `step output: building in /srv/data`, `second run as uid 1001`, `template built built and registered`)
	sb := d.create(t, "built", "built")
	expectCount(t, endpoint(t, sb), 1, "the built template's server")
	check := "import os; print(open('/srv/data/built').read(), open('/srv/data/notes.txt').read().strip(), sorted(os.listdir('/srv/extra')))"
	cli(t, env, "sandbox", "exec", sb.ID, "--", "/usr/bin/python3", "-c", check).ok(t, "what the steps made", `^hello copied \['a'\]`)
	if tp, err := d.C.Template(ctxT(t), "built"); err != nil || tp.Process.Cwd != "/srv/data" || tp.Process.User != "1001:1001" || tp.Process.Args[0] != "/usr/bin/python3" || !slices.Contains(tp.Process.Env, "APP_GREETING=hello") {
		t.Errorf("the built template's process: %+v, %v", tp.Process, err)
	}

	again := cli(t, env, "template", "build", "built2", base, dir)
	again.ok(t, "the same build again", `template built2 built and registered`)
	if strings.Contains(again.Stdout, "building in /srv/data") || strings.Count(again.Stdout, "CACHED") != 5 {
		t.Errorf("a second build ran steps again:\n%s", again.Stdout)
	}

	// One line changed (the second RUN's): the first RUN is cached, the
	// second runs.
	changed := strings.Replace(buildDockerfile, "second run as uid", "second run (changed) as uid", 1)
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(changed), 0o644)
	// Built warm: its image is taken once its probe answers, and a
	// create restores it.
	third := cli(t, env, "template", "build", "built3", base, "--warm-probe", "/healthz", "--reseed-signal", "SIGUSR1", "--warm-pool", "0", dir)
	third.ok(t, "a build after a one-line change", `second run \(changed\) as uid 1001`)
	if strings.Contains(third.Stdout, "building in /srv/data") {
		t.Errorf("a one-line change reran the steps before it:\n%s", third.Stdout)
	}
	warm := d.create(t, "built3", "built3")
	expectCount(t, endpoint(t, warm), 1, "a sandbox of the warm build")
	if logs := d.logs(t, warm.ID); !strings.Contains(logs, "warm image") {
		t.Errorf("a sandbox of a warm build was not restored from its warm image:\n%s", logs)
	}
	// Warm by a ready command (E2B's setReadyCmd): run inside until it
	// exits 0. This one fails until the server answers, and its GET / is
	// counted in the server's memory before the checkpoint: a sandbox of
	// the image answers its first request with 2.
	ready := `cmd:/usr/bin/python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/', timeout=2)"`
	cli(t, env, "template", "build", "built4", base, "--warm-probe", ready, "--reseed-signal", "SIGUSR1", "--warm-pool", "0", dir).ok(t, "a build warm by a ready command", `template built4 built and registered`)
	expectCount(t, endpoint(t, d.create(t, "built4", "built4")), 2, "a sandbox of a template warmed by a ready command that did GET / once")

	// The metadata address from a RUN: refused by its boundary, the step
	// fails naming its line, and no template is registered.
	bad := "FROM " + f.reg.Ref(f.ref) + "\nUSER root\nRUN [\"/usr/bin/python3\", \"-c\", \"import socket; s = socket.create_connection(('169.254.169.254', 80), 5); s.settimeout(3); s.recv(1); print('reached', 'it')\"]\n"
	os.WriteFile(filepath.Join(dir, "Dockerfile.bad"), []byte(bad), 0o644)
	res := cli(t, env, "template", "build", "badbuild", "-f", filepath.Join(dir, "Dockerfile.bad"), dir)
	res.fails(t, "a RUN that dials the metadata address", `Dockerfile:3`)
	if strings.Contains(res.Stdout, "reached it") {
		t.Error("a RUN reached the metadata address")
	}
	if _, err := d.C.Template(ctxT(t), "badbuild"); err == nil {
		t.Error("a failed build registered its template")
	}
	all, err := d.C.Templates(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range all {
		if strings.HasPrefix(tp.Name, "build-") {
			t.Errorf("a build's step template is left: %s", tp.Name)
		}
	}
}

// buildProbe runs in a build's RUN: it fetches the allowed mirror, and
// tries what a build must never reach — a name the build policy does not
// grant, the metadata address, the host's end of its own link (the node's
// API port there) — and exits 1 if any of those answered.
const buildProbe = `import socket, sys, urllib.request
api = int(sys.argv[1])
print("mirror says", urllib.request.urlopen("http://mirror.test/", timeout=10).read().decode())
host = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
reached = []
for what, addr in [("other.test", ("other.test", 80)), ("metadata", ("169.254.169.254", 80)), ("the node's API", (host, api))]:
    # A connection to an address off the node is taken by the step's own
    # boundary, which resets one it refuses right after the handshake; a
    # server reached answers, closes, or waits for its request.
    try:
        s = socket.create_connection(addr, 5)
    except OSError:
        print("refused:", what)
        continue
    s.settimeout(2)
    try:
        s.recv(1)
        reached.append(what)
    except socket.timeout:
        reached.append(what)
    except OSError:
        print("refused:", what)
if reached:
    print("REACHED", reached)
    sys.exit(1)
`

// TestTemplateBuildPolicy: a build's RUN reaches exactly what the
// operator's policy grants the build principal (a mirror, by name), and
// neither another name, the metadata address nor the node's API.
func TestTemplateBuildPolicy(t *testing.T) {
	resolver, policyPath := twoOutsideNames(t, `
roles:
  - name: builder
    egress: ["mirror.test"]
bindings:
  - {principal: sandstorm-build, roles: [builder]}
`)
	f := newImageFixture(t)
	d := newDaemon(t, "--policy", policyPath, "--resolver", resolver.addr)
	d.wrap = func(cmd *exec.Cmd) { cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+filepath.Dir(f.goodAuth)) }
	d.Start(t)
	env := []string{"SANDSTORM_API=" + d.API, "SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_TOKEN="}

	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "probe.py"), []byte(buildProbe), 0o644)
	_, apiPort, _ := strings.Cut(strings.TrimPrefix(d.API, "https://"), ":")
	df := "FROM " + f.reg.Ref(f.ref) + "\nUSER root\nCOPY probe.py /probe.py\nRUN [\"/usr/bin/python3\", \"/probe.py\", \"" + apiPort + "\"]\n"
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(df), 0o644)
	res := cli(t, env, "template", "build", "policed", dir)
	res.ok(t, "a build whose RUN reaches its mirror only", `mirror says outside ok`, `refused: other.test`, `refused: metadata`, `refused: the node's API`)
}

// TestImageTemplateMoves: an image's sandbox moves live between two
// nodes with its memory, the paired node having got the template's tree
// by its digest from the master (the registry is the master's to reach).
func TestImageTemplateMoves(t *testing.T) {
	n1 := fleetMachine(t, 1)
	m := startDaemon(t)
	pair(t, m, n1)
	t.Cleanup(func() {
		for _, id := range m.trackedIDs() {
			m.C.DeleteSandbox(ctxT(t), id)
		}
	})
	f := newImageFixture(t)
	from := fileSize(n1.logPath)
	if _, err := m.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: "img", Image: &api.ImageSource{Ref: f.reg.Ref(f.ref), Auth: &api.RegistryAuth{Username: f.user, Password: f.password}}}); err != nil {
		t.Fatal(err)
	}
	layersShippedOnce(t, m, n1, f, from)
	sb, err := m.C.CreateSandbox(ctxT(t), api.SandboxRequest{Template: "img", Name: "mover"})
	if err != nil {
		t.Fatal(err)
	}
	m.track(sb.ID)
	count := callN(t, sb, 2)
	to := n1.name
	if sb.Node == n1.name {
		to = listNodes(t, m)[0].Name
	}
	moved, err := m.C.MoveTo(ctxT(t), sb.ID, to)
	if err != nil || moved.Node != to {
		t.Fatalf("move to %s: %+v, %v", to, moved, err)
	}
	expectCount(t, endpoint(t, moved), count+1, "the image's sandbox after its move (its memory)")
	// The copy a move leaves is deleted after its answer: until then a
	// delete is a conflict (409), which a caller retries.
	testenv.WaitFor(t, 30*time.Second, "the moved sandbox deleted", func() bool {
		err := m.C.DeleteSandbox(ctxT(t), sb.ID)
		if err != nil && client.StatusOf(err) != http.StatusConflict {
			t.Fatalf("delete after the move: %v", err)
		}
		return err == nil
	})
}

// layersShippedOnce: the paired node n got template img as its image's
// layers and made its tree of them; a second template of the image with
// one more layer (img2) costs it that layer alone — the node received
// each layer once (its log since from says so) and neither tree whole.
func layersShippedOnce(t *testing.T, m *Daemon, n *machine, f *imageFixture, from int64) {
	t.Helper()
	if _, err := m.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: "img2", Image: &api.ImageSource{Ref: f.variant(t, "team/web:2"), Auth: &api.RegistryAuth{Username: f.user, Password: f.password}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.C.DeleteTemplate(ctxT(t), "img2") })
	img, err := m.C.Template(ctxT(t), "img")
	if err != nil {
		t.Fatal(err)
	}
	img2, err := m.C.Template(ctxT(t), "img2")
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Layers) != 3 || len(img2.Layers) != 4 || !slices.Equal(img2.Layers[:3], img.Layers) {
		t.Fatalf("layers: img %v, img2 %v; want img's three under img2's fourth", img.Layers, img2.Layers)
	}
	b, _ := os.ReadFile(n.logPath)
	logs := string(b[min(from, int64(len(b))):])
	received := regexp.MustCompile(`(?m)^.*image layer received.*$`).FindAllString(logs, -1)
	for _, d := range img2.Layers {
		if k := strings.Count(strings.Join(received, "\n"), d); k != 1 {
			t.Errorf("node %s received layer %s %d times, want once", n.name, d, k)
		}
	}
	if len(received) != len(img2.Layers) {
		t.Errorf("node %s received %d layers, want %d:\n%s", n.name, len(received), len(img2.Layers), strings.Join(received, "\n"))
	}
	if made := strings.Count(logs, "template rootfs made from its layers"); made != 2 {
		t.Errorf("node %s made %d trees from layers, want 2 (img, img2)", n.name, made)
	}
	if mb, _ := os.ReadFile(m.LogPath); regexp.MustCompile(`template rootfs sent to a node.*template=img2? `).Match(mb) {
		t.Error("the master sent an image template's tree whole")
	}
}

// fileSize is the size of the file at p (0 if there is none yet).
func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// TestImageHostile: images a registry serves to hurt the master are
// refused through the API with a clear error, keep nothing, and leave
// the host as it was: a layer writing through a symlink it planted to a
// host directory, one climbing out with "..", a hard link to a host file,
// a whiteout of "..", a gzip bomb, and an index with no entry for this
// machine's platform.
func TestImageHostile(t *testing.T) {
	d := startDaemon(t)
	reg := ocitest.NewRegistry(t, ocitest.Options{})
	victim := t.TempDir()
	os.WriteFile(filepath.Join(victim, "keep"), []byte("host file\n"), 0o644)
	bomb := make([]byte, 64<<20) // zeros: compresses about 1000:1
	cases := []struct {
		what, want string
		layer      []ocitest.TarEntry
	}{
		{"a write through a planted symlink", `(?i)symlink|link|unsafe`, []ocitest.TarEntry{
			{Name: "esc", Type: tar.TypeSymlink, Linkname: victim},
			{Name: "esc/pwned", Type: tar.TypeReg, Mode: 0o644, Body: []byte("x")},
		}},
		{"a climb out", `(?i)\.\.|unsafe`, []ocitest.TarEntry{{Name: "../../../../" + strings.TrimPrefix(victim, "/") + "/pwned", Type: tar.TypeReg, Mode: 0o644, Body: []byte("x")}}},
		{"a hard link to a host file", `(?i)link|unsafe`, []ocitest.TarEntry{{Name: "hl", Type: tar.TypeLink, Linkname: filepath.Join(victim, "keep")}}},
		{"a whiteout of ..", `(?i)whiteout|unsafe`, []ocitest.TarEntry{{Name: "a/.wh...", Type: tar.TypeReg, Mode: 0o644}}},
		{"a gzip bomb", `(?i)ratio|bomb|compress`, []ocitest.TarEntry{{Name: "zeros", Type: tar.TypeReg, Mode: 0o644, Body: bomb}}},
	}
	for i, c := range cases {
		ref := reg.Push(t, ocitest.ImageFromLayers(t, c.layer), fmt.Sprintf("hostile/%d:1", i))
		_, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: fmt.Sprintf("hostile-%d", i), Image: &api.ImageSource{Ref: ref}, Process: api.Process{Args: []string{"/x"}}})
		if st := client.StatusOf(err); err == nil || (st != http.StatusBadRequest && st != http.StatusRequestEntityTooLarge) || !regexp.MustCompile(c.want).MatchString(err.Error()) {
			t.Errorf("%s: %v; want a 400 or 413 matching %s", c.what, err, c.want)
		}
	}
	foreign := v1.Platform{OS: "linux", Architecture: "s390x"}
	if runtime.GOARCH == "s390x" {
		foreign.Architecture = "arm64"
	}
	idx := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: ocitest.ImageFromLayers(t, []ocitest.TarEntry{{Name: "x", Type: tar.TypeReg, Mode: 0o644, Body: []byte("x")}}), Descriptor: v1.Descriptor{Platform: &foreign}})
	ref := reg.PushIndex(t, idx, "hostile/foreign:1")
	if _, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: "foreign", Image: &api.ImageSource{Ref: ref}}); err == nil || !strings.Contains(err.Error(), "linux/"+foreign.Architecture) {
		t.Errorf("an index for %s only: %v; want an error naming the platforms it has", foreign.Architecture, err)
	}
	ents, _ := os.ReadDir(victim)
	if len(ents) != 1 {
		t.Errorf("the host directory changed: %v", ents)
	}
	if got := d.layerDirs(t); len(got) != 0 {
		t.Errorf("refused images left layers: %v", got)
	}
	if ts, _ := d.C.Templates(ctxT(t)); len(ts) != 0 {
		t.Errorf("refused images left templates: %+v", ts)
	}
}
