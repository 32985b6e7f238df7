package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// exportTar is a tar of an OCI layout's two small files.
func exportTar(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for name, body := range map[string]string{"oci-layout": `{"imageLayoutVersion": "1.0.0"}`, "index.json": `{}`} {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	return b.Bytes()
}

// TestExportToDir: a layout is extracted into a new or an empty
// directory; a failed download, or a tar that would write outside it,
// leaves a new directory gone and an empty one empty; a directory with
// something in it is refused before anything is asked.
func TestExportToDir(t *testing.T) {
	good := exportTar(t)
	send := func(b []byte, err error) func(io.Writer) error {
		return func(w io.Writer) error {
			if _, werr := w.Write(b); werr != nil {
				return werr
			}
			return err
		}
	}
	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	tw.WriteHeader(&tar.Header{Name: "../escape", Mode: 0o644, Typeflag: tar.TypeReg})
	tw.Close()
	cut := errors.New("the answer was cut")
	for _, c := range []struct {
		what  string
		exist bool
		get   func(io.Writer) error
		says  string
	}{
		{"new", false, send(good, nil), ""},
		{"empty", true, send(good, nil), ""},
		{"cut short", false, send(good[:700], cut), "the answer was cut"},
		{"cut after the tar", true, send(good, cut), "the answer was cut"},
		{"escaping entry", true, send(evil.Bytes(), nil), "unsafe"},
	} {
		dir := filepath.Join(t.TempDir(), "web-oci")
		if c.exist {
			os.Mkdir(dir, 0o755)
		}
		err := exportToDir(dir, c.get)
		ents, statErr := os.ReadDir(dir)
		switch {
		case c.says == "" && (err != nil || len(ents) != 2):
			t.Errorf("%s: %v, %d entries", c.what, err, len(ents))
		case c.says != "" && (err == nil || !strings.Contains(err.Error(), c.says)):
			t.Errorf("%s: %v, want an error saying %q", c.what, err, c.says)
		case c.says != "" && c.exist && (statErr != nil || len(ents) != 0):
			t.Errorf("%s: the directory holds %d entries (%v) after the error", c.what, len(ents), statErr)
		case c.says != "" && !c.exist && !errors.Is(statErr, os.ErrNotExist):
			t.Errorf("%s: the directory made for it is left behind (%v)", c.what, statErr)
		}
	}
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "x"), nil, 0o644)
	asked := false
	if err := exportToDir(full, func(io.Writer) error { asked = true; return nil }); err == nil || !strings.Contains(err.Error(), "not empty") || asked {
		t.Errorf("a directory with something in it: %v (asked: %v)", err, asked)
	}
}

// TestExportToFile: the file appears whole or not at all, and nothing
// else is left beside it.
func TestExportToFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "web.tar")
	if err := exportToFile(p, func(w io.Writer) error { _, err := w.Write([]byte("image")); return err }); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "image" {
		t.Errorf("web.tar: %q, %v", b, err)
	}
	q := filepath.Join(dir, "cut.tar")
	if err := exportToFile(q, func(w io.Writer) error { w.Write([]byte("ima")); return errors.New("cut") }); err == nil {
		t.Error("a failed download succeeds")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d entries beside web.tar after a failed export", len(ents)-1)
	}
}
