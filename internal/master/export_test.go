package master

import (
	"archive/tar"
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"sandstorm/api"
	"sandstorm/internal/rootfs"
)

// TestTemplateExport: GET /v1/templates/web/export answers template web
// as a tar that go-containerregistry reads back as its image (docker by
// default, or an OCI layout), running its process with its port, holding
// its files; an unknown template is a 404, a format it does not write a
// 400, a team's key a 403.
func TestTemplateExport(t *testing.T) {
	srv, _ := newAPI(t, newFakeNode())
	for _, format := range []string{"", "docker", "oci"} {
		a := do(t, srv, "GET", "/v1/templates/web/export?format="+format, "")
		if a.status != http.StatusOK || a.header.Get("Content-Type") != "application/x-tar" {
			t.Fatalf("export %q: %d %s %.200q", format, a.status, a.header.Get("Content-Type"), a.body)
		}
		want := `attachment; filename="web.tar"`
		if format == "oci" {
			want = `attachment; filename="web-oci.tar"`
		}
		if got := a.header.Get("Content-Disposition"); got != want {
			t.Errorf("export %q: Content-Disposition %q, want %q", format, got, want)
		}
		img := exportReadBack(t, format, []byte(a.body))
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := cfg.Config.ExposedPorts["8000/tcp"]; !ok || !slices.Equal(cfg.Config.Cmd, []string{"/bin/app"}) {
			t.Errorf("export %q: cmd %q, ports %v", format, cfg.Config.Cmd, cfg.Config.ExposedPorts)
		}
		if files := exportLayerFiles(t, img); files["bin/app"] != "#!/bin/sh\n" {
			t.Errorf("export %q: the layer holds %v, not web's bin/app", format, files)
		}
	}
	key := do(t, srv, "POST", "/v1/api-keys", `{"team": "red"}`).body
	key = key[strings.Index(key, "e2b_") : strings.Index(key, "e2b_")+44]
	for _, c := range []struct {
		path, auth string
		status     int
		code       string
	}{
		{"/v1/templates/nope/export", "Bearer " + token, 404, api.CodeNotFound},
		{"/v1/templates/web/export?format=zip", "Bearer " + token, 400, api.CodeBadRequest},
		{"/v1/templates/web/export", "Bearer " + key, 403, api.CodeForbidden},
	} {
		if a := doAs(t, srv, "GET", c.path, "", c.auth); a.status != c.status || a.err.Code != c.code {
			t.Errorf("GET %s: %d %+v, want %d %s", c.path, a.status, a.err, c.status, c.code)
		}
	}
	if a := doAs(t, srv, "GET", "/v1/templates/web", "", "Bearer "+key); a.status != http.StatusOK {
		t.Errorf("a team still reads the template: %d", a.status)
	}
}

// exportReadBack reads an export's tar as its image.
func exportReadBack(t *testing.T, format string, b []byte) v1.Image {
	t.Helper()
	if format != "oci" {
		p := filepath.Join(t.TempDir(), "web.tar")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		tag, _ := name.NewTag("sandstorm/web:latest")
		img, err := tarball.ImageFromPath(p, &tag)
		if err != nil {
			t.Fatalf("not a docker tarball of sandstorm/web:latest: %v", err)
		}
		return img
	}
	dir := t.TempDir()
	if _, err := rootfs.Extract(bytes.NewReader(b), dir, rootfs.Limits{}); err != nil {
		t.Fatal(err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatalf("not an OCI layout: %v", err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil || len(m.Manifests) != 1 {
		t.Fatalf("index: %v, %v", m, err)
	}
	img, err := p.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// exportLayerFiles is the regular files of img's one layer and their
// contents.
func exportLayerFiles(t *testing.T, img v1.Image) map[string]string {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			files[h.Name] = string(b)
		}
	}
}
