package execcli

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"connectrpc.com/connect"

	"sandstorm/internal/client"
	fspb "sandstorm/third_party/envd/filesystem"
)

// sandbox cp of a directory: its tree is walked on the side it is on, and
// each file is streamed on its own (envd's /files), each directory made
// (MakeDir or mkdir). Symlinks are not followed nor copied — a link in a
// sandbox may name anything of it, and one copied out could point
// anywhere here — and are reported on warn.

// CopyIn copies the local file or directory src to dst in e's sandbox.
func CopyIn(ctx context.Context, e *client.Envd, src, dst string, warn io.Writer) error {
	st, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		return e.Upload(ctx, dst, f)
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := path.Join(dst, filepath.ToSlash(rel))
		switch {
		case d.IsDir():
			_, err := e.Filesystem.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: to}))
			if connect.CodeOf(err) == connect.CodeAlreadyExists {
				return nil
			}
			return err
		case d.Type().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			return e.Upload(ctx, to, f)
		default:
			fmt.Fprintf(warn, "skipped %s: not a regular file or directory\n", p)
			return nil
		}
	})
}

// CopyOut copies src in e's sandbox (a file or a directory) to the local
// dst.
func CopyOut(ctx context.Context, e *client.Envd, src, dst string, warn io.Writer) error {
	st, err := e.Filesystem.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: src}))
	if err != nil {
		return err
	}
	if st.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_DIRECTORY {
		if lst, err := os.Stat(dst); err == nil && lst.IsDir() {
			dst = filepath.Join(dst, path.Base(src))
		}
		return download(ctx, e, src, dst)
	}
	root := st.Msg.GetEntry().GetPath()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	l, err := e.Filesystem.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: root, Depth: 1 << 10}))
	if err != nil {
		return err
	}
	for _, ent := range l.Msg.GetEntries() {
		rel := strings.TrimPrefix(strings.TrimPrefix(ent.GetPath(), root), "/")
		if rel == "" || rel == ".." || strings.HasPrefix(rel, "../") || strings.Contains(rel, "/../") {
			continue // envd lists below root only; never write outside dst
		}
		to := filepath.Join(dst, filepath.FromSlash(rel))
		switch ent.GetType() {
		case fspb.FileType_FILE_TYPE_DIRECTORY:
			if err := os.MkdirAll(to, 0o755); err != nil {
				return err
			}
		case fspb.FileType_FILE_TYPE_FILE:
			if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
				return err
			}
			if err := download(ctx, e, ent.GetPath(), to); err != nil {
				return err
			}
		default:
			fmt.Fprintf(warn, "skipped %s: a symlink\n", ent.GetPath())
		}
	}
	return nil
}

func download(ctx context.Context, e *client.Envd, src, dst string) error {
	rc, err := e.Download(ctx, src)
	if err != nil {
		return err
	}
	defer rc.Close()
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
