package rootfs

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// FuzzExtract feeds arbitrary bytes to Extract and checks that nothing is
// ever created outside the destination, that a failed extraction leaves the
// destination empty, and that no device node or fifo appears.
func FuzzExtract(f *testing.F) {
	f.Add(mkTar(f,
		ent{name: "d/", typ: tar.TypeDir},
		ent{name: "d/f", typ: tar.TypeReg, body: "hello"},
		ent{name: "d/l", typ: tar.TypeSymlink, link: "f"},
		ent{name: "d/h", typ: tar.TypeLink, link: "d/f"},
	))
	f.Add(mkTar(f, ent{name: "../x", typ: tar.TypeReg, body: "x"}))
	f.Add(mkTar(f,
		ent{name: "a", typ: tar.TypeSymlink, link: ".."},
		ent{name: "a/x", typ: tar.TypeReg, body: "x"},
	))
	f.Add(mkTar(f,
		ent{name: "a", typ: tar.TypeSymlink, link: "/"},
		ent{name: "a/x", typ: tar.TypeReg, body: "x"},
	))
	f.Add(mkTar(f,
		ent{name: "l", typ: tar.TypeSymlink, link: "../sibling"},
		ent{name: "h", typ: tar.TypeLink, link: "l"},
	))
	f.Add(gz(f, mkTar(f, ent{name: "z", typ: tar.TypeReg, body: "zz"})))
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, data []byte) {
		root := t.TempDir()
		inner := filepath.Join(root, "inner")
		if err := os.Mkdir(inner, 0o755); err != nil {
			t.Fatal(err)
		}
		st, err := Extract(bytes.NewReader(data), inner, Limits{MaxBytes: 1 << 20, MaxFiles: 1000})

		ents, rerr := os.ReadDir(root)
		if rerr != nil {
			t.Fatal(rerr)
		}
		if len(ents) != 1 || ents[0].Name() != "inner" || !ents[0].IsDir() {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Fatalf("root contains %v, want only the inner directory", names)
		}
		if fi, err := os.Lstat(inner); err != nil || !fi.IsDir() {
			t.Fatalf("inner replaced: %v %v", fi, err)
		}
		n := 0
		werr := filepath.WalkDir(inner, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p == inner {
				return nil
			}
			n++
			switch typ := d.Type(); {
			case typ.IsDir(), typ.IsRegular(), typ&fs.ModeSymlink != 0:
			default:
				t.Errorf("%s has forbidden type %v", p, typ)
			}
			return nil
		})
		if werr != nil {
			t.Fatal(werr)
		}
		if err != nil && n != 0 {
			t.Fatalf("failed extraction (%v) left %d entries", err, n)
		}
		if err == nil && n != st.Files {
			t.Fatalf("stats report %d files, tree has %d", st.Files, n)
		}
	})
}
