package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
)

// sizeName is a series' size part: "100MiB".
func sizeName(mib int) string { return fmt.Sprintf("%dMiB", mib) }

// measurePull times, per size, a template made from the image with a
// cold layer store, and skopeo copy + umoci unpack of the same image into
// new directories, one after the other n times.
func (r *runner) measurePull(ctx context.Context) error {
	for _, mib := range r.cfg.sizes {
		ref, sz := r.sized[mib], sizeName(mib)
		ours := r.res.AddSeries("pull/"+sz+"/sandstormd", "POST /v1/templates {image: {ref}} round trip with the layer store emptied before (<data-dir>/layers removed) and a new template name: fetch, verify, unpack of every layer and the template's rootfs made from them", "")
		total := r.res.AddSeries("pull/"+sz+"/skopeo+umoci", "skopeo copy docker://REF oci:DIR:tag, then umoci unpack --image DIR:tag BUNDLE, into new directories (the sum of the two below)", "")
		sk := r.res.AddSeries("pull/"+sz+"/skopeo", "skopeo copy --src-tls-verify=false docker://REF oci:DIR:tag alone", "")
		um := r.res.AddSeries("pull/"+sz+"/umoci", "umoci unpack --image DIR:tag BUNDLE alone", "")
		switch {
		case !r.cfg.baseline:
			total.Skipped = "--baseline=false"
		case r.skopeoErr != nil:
			total.Skipped = "skopeo + umoci cannot run here: " + r.skopeoErr.Error()
		}
		for i := range r.cfg.n {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := r.pullOurs(ctx, ours, ref, fmt.Sprintf("pull-%d-%d", mib, i)); err != nil {
				ours.Fail("%v", err)
			}
			if total.Skipped == "" {
				if err := r.pullTheirs(ctx, total, sk, um, ref); err != nil {
					total.Fail("%v", err)
				}
			}
			fmt.Fprintf(os.Stderr, "pull %s: %d of %d\n", sz, i+1, r.cfg.n)
		}
	}
	return nil
}

// pullOurs is one template create from ref with a cold layer store; the
// template is deleted afterwards (untimed).
func (r *runner) pullOurs(ctx context.Context, s *bench.Series, ref, name string) error {
	if err := os.RemoveAll(filepath.Join(r.data, "layers")); err != nil {
		return err
	}
	t0 := time.Now()
	_, err := r.c.CreateTemplate(ctx, api.TemplateRequest{Name: name, Image: &api.ImageSource{Ref: ref}})
	d := time.Since(t0)
	if err != nil {
		return fmt.Errorf("template create --image %s: %w", ref, err)
	}
	s.AddDuration(d)
	if err := r.c.DeleteTemplate(ctx, name); err != nil {
		s.Note("delete %s: %v", name, err)
	}
	return nil
}

// pullTheirs is skopeo copy + umoci unpack of ref into new directories,
// removed afterwards (untimed).
func (r *runner) pullTheirs(ctx context.Context, total, sk, um *bench.Series, ref string) error {
	dir, err := os.MkdirTemp(r.work, "skopeo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	layout, bundle := filepath.Join(dir, "oci"), filepath.Join(dir, "bundle")
	d1, err := timed(ctx, "skopeo", "copy", "--quiet", "--src-tls-verify=false", "docker://"+ref, "oci:"+layout+":bench")
	if err != nil {
		return err
	}
	d2, err := timed(ctx, "umoci", "unpack", "--image", layout+":bench", bundle)
	if err != nil {
		return err
	}
	sk.AddDuration(d1)
	um.AddDuration(d2)
	total.AddDuration(d1 + d2)
	return nil
}

// timed runs a command and returns how long it took; its output only
// when it fails.
func timed(ctx context.Context, name string, args ...string) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(t0)
	if err != nil {
		return d, fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, lastLines(string(out), 6))
	}
	return d, nil
}
