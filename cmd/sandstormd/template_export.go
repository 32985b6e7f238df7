package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"sandstorm/internal/client"
	"sandstorm/internal/ociimage"
	"sandstorm/internal/rootfs"
)

// templateExportCmd is "template export".
func templateExportCmd() *cobra.Command {
	var out, format string
	export := &cobra.Command{
		Use:   "export NAME [-o FILE|DIR|-] [--format docker|oci]",
		Short: "Write a template's rootfs and process as an image: a docker tarball or an OCI layout",
		Long: `Write template NAME as a container image, so it moves to another cluster or
into Docker: one layer, the template's rootfs (owners, modes and symlinks
kept), and a config for linux on the master's architecture whose Cmd is the
template's process (its args; env, working directory and ports as Env,
WorkingDir and ExposedPorts). What a node adds at run time is not in it:
envd, the boundary, the network.

  --format docker (default)  a tarball docker load and podman load read,
                             tagged sandstorm/NAME:latest; -o FILE (default
                             NAME.tar) or -o - for stdout
  --format oci               an OCI image layout extracted into -o DIR (new
                             or empty; default NAME-oci), its image named
                             "latest"; -o - writes the layout as a tar to
                             stdout (an oci-archive)

The master packs and compresses the rootfs before the first byte arrives:
a large one takes a while. A file or directory is complete when the
command succeeds; on any error nothing is left behind.`,
		Example: `  sandstormd template export web -o web.tar && docker load -i web.tar
  sandstormd template export web -o - | podman load
  sandstormd template export web --format oci -o web-oci
  skopeo copy oci:web-oci:latest docker://registry.example.com/web:latest
  skopeo copy oci:web-oci:latest docker-daemon:sandstorm/web:latest`,
		Args: cobra.MatchAll(cobra.ExactArgs(1), func(_ *cobra.Command, args []string) error {
			if !ociimage.ValidFormat(format) {
				return fmt.Errorf("--format %q: use docker (a tarball for docker load) or oci (an OCI image layout)", format)
			}
			if out == "-" && term.IsTerminal(int(os.Stdout.Fd())) {
				return errors.New("-o - writes the image to stdout, which is a terminal: pipe it (| docker load) or give -o FILE")
			}
			return nil
		}),
		RunE: withClient(func(cmd *cobra.Command, c *client.Client, args []string) error {
			name, dst := args[0], out
			if dst == "" {
				dst = name + ".tar"
				if format == ociimage.FormatOCI {
					dst = name + "-oci"
				}
			}
			// Interrupted, it cleans up after itself like any other error.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			p := &exportProgress{tty: term.IsTerminal(int(os.Stderr.Fd()))}
			get := func(w io.Writer) error {
				// Said once the destination is known to take it.
				fmt.Fprintf(os.Stderr, "exporting template %s (%s): the master packs and compresses its rootfs first…\n", name, format)
				p.w, p.start = w, time.Now()
				return c.ExportTemplate(ctx, name, format, p)
			}
			var err error
			switch {
			case dst == "-":
				err = get(os.Stdout)
			case format == ociimage.FormatOCI:
				err = exportToDir(dst, get)
			default:
				err = exportToFile(dst, get)
			}
			p.done()
			if err != nil {
				return err
			}
			exportSaid(name, format, dst, p.n)
			return nil
		}),
	}
	export.Flags().StringVarP(&out, "output", "o", "", "where to write it: a file (docker), a new or empty directory (oci), or - for stdout (default NAME.tar, or NAME-oci)")
	export.Flags().StringVar(&format, "format", ociimage.FormatDocker, "docker (a tarball for docker load / podman load) or oci (an OCI image layout)")
	return export
}

// exportSaid tells, on stderr (stdout may be the image), what was written
// and what to do with it.
func exportSaid(name, format, dst string, n int64) {
	size := fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	switch {
	case dst == "-":
		fmt.Fprintf(os.Stderr, "wrote template %s as an image to stdout (%s)\n", name, size)
	case format == ociimage.FormatOCI:
		fmt.Fprintf(os.Stderr, "wrote template %s as the OCI layout %s (%s); e.g. skopeo copy oci:%s:%s docker://REGISTRY/%s:latest\n", name, dst, size, dst, ociimage.ExportRefName, name)
	default:
		fmt.Fprintf(os.Stderr, "wrote template %s as %s (%s, %s); load it with: docker load -i %s\n", name, dst, size, ociimage.ExportRef(name), dst)
	}
}

// exportToFile writes what get sends to path, whole or not at all: into
// a temporary file beside it, renamed over path once complete.
func exportToFile(path string, get func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename, a no-op
	if err := get(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// exportToDir extracts the OCI layout get sends into dir, new or empty,
// with rootfs.Extract's rules (nothing written outside dir, no links
// followed); on any error dir is left as it was found (a new one
// removed).
func exportToDir(dir string, get func(io.Writer) error) error {
	made := false
	switch fi, err := os.Stat(dir); {
	case errors.Is(err, os.ErrNotExist):
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
		made = true
	case err != nil:
		return err
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory: --format oci extracts the layout into a new or empty directory (or give -o - for a tar)", dir)
	default:
		if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
			return fmt.Errorf("%s is not empty: --format oci extracts the layout into a new or empty directory", dir)
		}
	}
	pr, pw := io.Pipe()
	got := make(chan error, 1)
	go func() {
		err := get(pw)
		pw.CloseWithError(err)
		got <- err
	}()
	// The layer is one file as large as the gzipped rootfs: no bound on
	// bytes but the disk's.
	_, xerr := rootfs.Extract(pr, dir, rootfs.Limits{MaxBytes: 1 << 50})
	if xerr == nil {
		// Whatever follows the tar's end is read, so the download ends
		// and says whether it was whole.
		_, xerr = io.Copy(io.Discard, pr)
	}
	pr.CloseWithError(xerr) // a refused layout stops the download
	err := <-got
	if err == nil || errors.Is(err, io.ErrClosedPipe) || xerr != nil && !errors.Is(xerr, err) {
		// The extraction's own failure (a download that failed shows
		// through it as the pipe's error, and is said then).
		err = xerr
	}
	if err != nil {
		if made {
			os.RemoveAll(dir)
		} else {
			exportEmpty(dir)
		}
		return err
	}
	return nil
}

// exportEmpty removes what is in dir, not dir itself.
func exportEmpty(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

// exportProgress counts what arrives and, on a terminal, says so on
// stderr at most five times a second.
type exportProgress struct {
	w          io.Writer
	n          int64
	tty        bool
	start      time.Time
	last       time.Time
	shownAlive bool
}

func (p *exportProgress) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += int64(n)
	if p.tty && time.Since(p.last) >= 200*time.Millisecond {
		p.last = time.Now()
		p.shownAlive = true
		fmt.Fprintf(os.Stderr, "\r%.1f MiB received (%.0fs)", float64(p.n)/(1<<20), time.Since(p.start).Seconds())
	}
	return n, err
}

// done ends the progress line.
func (p *exportProgress) done() {
	if p.shownAlive {
		fmt.Fprintln(os.Stderr)
	}
}
