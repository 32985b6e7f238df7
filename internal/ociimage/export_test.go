package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/rootfs"
	"sandstorm/internal/testenv"
)

var exportTestProc = api.Process{Args: []string{"/bin/app", "--port", "8000"}, Env: []string{"PATH=/bin", "MODE=prod"}, Cwd: "/srv"}

var exportTestCreated = time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)

// exportTestTree is a small rootfs with what a layer must keep: modes
// (setuid, a private file), a symlink, a directory owned by another user
// (when the test runs as root) and an empty file.
func exportTestTree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	must(os.MkdirAll(filepath.Join(dir, "srv", "data"), 0o750))
	must(os.WriteFile(filepath.Join(dir, "bin", "app"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	must(os.Chmod(filepath.Join(dir, "bin", "app"), os.ModeSetuid|0o755))
	must(os.WriteFile(filepath.Join(dir, "srv", "secret"), []byte("s3cret"), 0o600))
	must(os.WriteFile(filepath.Join(dir, "srv", "empty"), nil, 0o644))
	must(os.Symlink("../bin/app", filepath.Join(dir, "srv", "run")))
	if os.Geteuid() == 0 {
		must(os.Chown(filepath.Join(dir, "srv", "data"), 1000, 1000))
		must(os.Lchown(filepath.Join(dir, "srv", "run"), 1000, 1000))
	}
	return dir
}

func exportTo(t *testing.T, dir, format string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Export(context.Background(), dir, exportTestProc, []int{8000, 9090}, format, &buf, ExportOptions{Name: "web", Created: exportTestCreated, TempDir: t.TempDir()}); err != nil {
		t.Fatalf("export %s: %v", format, err)
	}
	return buf.Bytes()
}

// exportReadDocker reads a docker tarball back as the library reads one
// for `docker load` (tarball.ImageFromPath, by its tag).
func exportReadDocker(t *testing.T, b []byte) v1.Image {
	t.Helper()
	p := filepath.Join(t.TempDir(), "image.tar")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag("sandstorm/web:latest")
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(p, &tag)
	if err != nil {
		t.Fatalf("the docker tarball does not read back: %v", err)
	}
	return img
}

// exportUnpackOCI extracts the layout's tar (as the CLI does, with
// rootfs.Extract) and returns its directory.
func exportUnpackOCI(t *testing.T, b []byte) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := rootfs.Extract(bytes.NewReader(b), dir, rootfs.Limits{}); err != nil {
		t.Fatalf("the OCI layout's tar does not extract: %v", err)
	}
	return dir
}

func exportReadOCI(t *testing.T, dir string) v1.Image {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatalf("not an OCI layout: %v", err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != ExportRefName {
		t.Fatalf("index.json: want one image named %q, got %+v", ExportRefName, m.Manifests)
	}
	img, err := p.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// TestExport: both formats read back with go-containerregistry give the
// template's process and ports as the image's config, and one layer whose
// content is rootfs.Pack's tarball of the tree, byte for byte (so its
// modes, owners and symlinks are the tree's: checked entry by entry too).
func TestExport(t *testing.T) {
	dir := exportTestTree(t)
	var pack bytes.Buffer
	if err := rootfs.Pack(dir, &pack); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{FormatDocker, FormatOCI} {
		t.Run(format, func(t *testing.T) {
			b := exportTo(t, dir, format)
			var img v1.Image
			if format == FormatDocker {
				img = exportReadDocker(t, b)
			} else {
				img = exportReadOCI(t, exportUnpackOCI(t, b))
			}
			if err := exportValidate(img); err != nil {
				t.Fatalf("the image does not check: %v", err)
			}
			exportCheckConfig(t, img)
			layers, err := img.Layers()
			if err != nil || len(layers) != 1 {
				t.Fatalf("layers: %d, %v; want 1", len(layers), err)
			}
			rc, err := layers[0].Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, pack.Bytes()) {
				t.Errorf("the layer is not rootfs.Pack of the tree (%d bytes, want %d)", len(got), pack.Len())
			}
			exportCheckEntries(t, got)
			if format == FormatOCI {
				exportCheckTimes(t, b)
			}
			if again := exportTo(t, dir, format); !bytes.Equal(again, b) {
				t.Errorf("two exports of the same template differ")
			}
		})
	}
}

// exportCheckTimes: every entry of the layout's tar is dated when the
// image was made, not when it was written, so the tar is the same
// whenever it is.
func exportCheckTimes(t *testing.T, b []byte) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(exportTestCreated) {
			t.Errorf("%s is dated %v, not the image's %v", h.Name, h.ModTime, exportTestCreated)
		}
	}
}

// exportValidate checks every digest and size the image claims against
// what it holds (manifest → config and layer).
func exportValidate(img v1.Image) error {
	m, err := img.Manifest()
	if err != nil {
		return err
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	h, n, err := v1.SHA256(bytes.NewReader(raw))
	if err != nil || h != m.Config.Digest || n != m.Config.Size {
		return errors.New("the config's digest or size is not the manifest's")
	}
	l := m.Layers[0]
	layers, _ := img.Layers()
	rc, err := layers[0].Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	h, n, err = v1.SHA256(rc)
	if err != nil || h != l.Digest || n != l.Size {
		return errors.New("the layer's digest or size is not the manifest's")
	}
	cfg, _ := img.ConfigFile()
	diff, _ := layers[0].DiffID()
	if len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != diff {
		return errors.New("the config's diff_ids are not the layer's")
	}
	return nil
}

func exportCheckConfig(t *testing.T, img v1.Image) {
	t.Helper()
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
	}
	if !cfg.Created.Time.Equal(exportTestCreated) {
		t.Errorf("created %v, want the template's %v", cfg.Created.Time, exportTestCreated)
	}
	c := cfg.Config
	if !slices.Equal(c.Cmd, exportTestProc.Args) || len(c.Entrypoint) != 0 {
		t.Errorf("cmd %q, entrypoint %q: want the template's args as cmd, no entrypoint", c.Cmd, c.Entrypoint)
	}
	if !slices.Equal(c.Env, exportTestProc.Env) || c.WorkingDir != "/srv" {
		t.Errorf("env %q, workdir %q", c.Env, c.WorkingDir)
	}
	if len(c.ExposedPorts) != 2 {
		t.Errorf("exposed ports %v, want 8000/tcp and 9090/tcp", c.ExposedPorts)
	}
	for _, p := range []string{"8000/tcp", "9090/tcp"} {
		if _, ok := c.ExposedPorts[p]; !ok {
			t.Errorf("exposed ports %v lack %s", c.ExposedPorts, p)
		}
	}
}

// exportCheckEntries reads the layer's tar: the modes, owners, link and
// contents of the tree.
func exportCheckEntries(t *testing.T, layer []byte) {
	t.Helper()
	type entry struct {
		typ       byte
		mode      int64
		uid, gid  int
		link, txt string
	}
	owner := 0
	if os.Geteuid() == 0 {
		owner = 1000
	}
	me, myGroup := os.Geteuid(), os.Getegid()
	want := map[string]entry{
		"bin/":       {tar.TypeDir, 0o755, me, myGroup, "", ""},
		"bin/app":    {tar.TypeReg, 0o4755, me, myGroup, "", "#!/bin/sh\necho hi\n"},
		"srv/":       {tar.TypeDir, 0o750, me, myGroup, "", ""},
		"srv/data/":  {tar.TypeDir, 0o750, max(owner, me), max(owner, myGroup), "", ""},
		"srv/empty":  {tar.TypeReg, 0o644, me, myGroup, "", ""},
		"srv/run":    {tar.TypeSymlink, 0o777, max(owner, me), max(owner, myGroup), "../bin/app", ""},
		"srv/secret": {tar.TypeReg, 0o600, me, myGroup, "", "s3cret"},
	}
	tr := tar.NewReader(bytes.NewReader(layer))
	seen := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		got := entry{h.Typeflag, h.Mode & 0o7777, h.Uid, h.Gid, h.Linkname, string(body)}
		w, ok := want[h.Name]
		if !ok {
			t.Errorf("unexpected entry %q", h.Name)
			continue
		}
		seen++
		if got != w {
			t.Errorf("%s: %+v, want %+v", h.Name, got, w)
		}
	}
	if seen != len(want) {
		t.Errorf("%d entries of %d", seen, len(want))
	}
}

// TestExportRefuses: a bad format, a tree an image cannot carry and a
// cancelled export each fail with what to do, write nothing, and leave
// nothing staged.
func TestExportRefuses(t *testing.T) {
	good := exportTestTree(t)
	whiteout := exportTestTree(t)
	if err := os.WriteFile(filepath.Join(whiteout, "srv", ".wh.gone"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		what   string
		ctx    context.Context
		dir    string
		format string
		kind   error
		says   string
	}{
		{"bad format", context.Background(), good, "tar", errdefs.ErrBadInput, "use docker"},
		{"whiteout", context.Background(), whiteout, FormatDocker, errdefs.ErrNotSupported, "/srv/.wh.gone"},
		{"no tree", context.Background(), filepath.Join(good, "nope"), FormatOCI, nil, "no such file"},
		{"cancelled", cancelled, good, FormatOCI, context.Canceled, "canceled"},
	} {
		tmp := t.TempDir()
		var buf bytes.Buffer
		err := Export(c.ctx, c.dir, exportTestProc, nil, c.format, &buf, ExportOptions{Name: "web", TempDir: tmp})
		if err == nil || (c.kind != nil && !errors.Is(err, c.kind)) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v; want %v saying %q", c.what, err, c.kind, c.says)
		}
		if buf.Len() != 0 {
			t.Errorf("%s: %d bytes written before the error", c.what, buf.Len())
		}
		if left, _ := os.ReadDir(tmp); len(left) != 0 {
			t.Errorf("%s: %d entries left in the staging directory", c.what, len(left))
		}
	}
	var buf bytes.Buffer
	if err := Export(context.Background(), good, exportTestProc, nil, FormatDocker, &buf, ExportOptions{Name: "Not A Name", TempDir: t.TempDir()}); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("a name no image can have: %v", err)
	}
}

// TestExportSkopeo: skopeo, which the issue moves images with, reads both
// outputs; umoci unpacks the layout (checking every digest) into the
// tree. Skipped where they are not installed.
func TestExportSkopeo(t *testing.T) {
	skopeo, err := exec.LookPath("skopeo")
	if err != nil {
		testenv.Skip(t, "skopeo is not installed (apt-get install -y skopeo): the outputs are not checked by it")
	}
	dir := exportTestTree(t)
	archive := filepath.Join(t.TempDir(), "web.tar")
	if err := os.WriteFile(archive, exportTo(t, dir, FormatDocker), 0o644); err != nil {
		t.Fatal(err)
	}
	oci := exportUnpackOCI(t, exportTo(t, dir, FormatOCI))
	for _, ref := range []string{"docker-archive:" + archive, "oci:" + oci + ":" + ExportRefName} {
		out, err := exec.Command(skopeo, "inspect", "--config", ref).Output()
		if err != nil {
			t.Fatalf("skopeo inspect --config %s: %v", ref, exportStderr(err))
		}
		var cfg v1.ConfigFile
		if err := json.Unmarshal(out, &cfg); err != nil {
			t.Fatalf("skopeo inspect %s: %v in %s", ref, err, out)
		}
		if cfg.Architecture != runtime.GOARCH || !slices.Equal(cfg.Config.Cmd, exportTestProc.Args) {
			t.Errorf("skopeo reads %s as %s running %q", ref, cfg.Architecture, cfg.Config.Cmd)
		}
	}
	umoci, err := exec.LookPath("umoci")
	if err != nil {
		testenv.Skip(t, "umoci is not installed (apt-get install -y umoci): the layout is not unpacked by it")
	}
	bundle := filepath.Join(t.TempDir(), "bundle")
	if err := exec.Command(umoci, "unpack", "--image", oci+":"+ExportRefName, bundle).Run(); err != nil {
		t.Fatalf("umoci unpack: %v", exportStderr(err))
	}
	if b, err := os.ReadFile(filepath.Join(bundle, "rootfs", "srv", "secret")); err != nil || string(b) != "s3cret" {
		t.Errorf("umoci's rootfs: srv/secret %q, %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(bundle, "rootfs", "srv", "run")); err != nil || l != "../bin/app" {
		t.Errorf("umoci's rootfs: srv/run -> %q, %v", l, err)
	}
}

func exportStderr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return errors.New(err.Error() + ": " + string(ee.Stderr))
	}
	return err
}
