package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/rootfs"
)

// buildDockerfile is the build both sides run over the web image: the
// instructions a real one uses, and two RUN steps. The web rootfs has
// python but no shell, so the RUNs are in exec form.
const buildDockerfile = `ARG BASE
FROM ${BASE}
ARG GREETING=hello
ENV APP_GREETING=${GREETING} PYTHONDONTWRITEBYTECODE=1
WORKDIR /srv/data
COPY notes.txt ./
ADD extra/ /srv/extra/
RUN ["/usr/bin/python3", "-c", "import os; print('step output: building in', os.getcwd()); open('/srv/data/built','w').write(os.environ['APP_GREETING'])"]
RUN ["/usr/bin/python3", "-c", "import os; print('second run as uid', os.getuid())"]
EXPOSE 8000
CMD ["/usr/bin/python3", "/srv/app.py"]
`

// runMarker is what the first RUN prints (the instruction's own text,
// which the build's output echoes, lacks the directory): a build whose
// output has it ran the step, and a cached build must not.
const runMarker = "building in /srv/data"

// writeContext writes the build context: the Dockerfile and the files
// its COPY and ADD take.
func writeContext(dir string) error {
	files := map[string]string{"Dockerfile": buildDockerfile, "notes.txt": "copied\n", "extra/a": "a\n", "extra/b": "b\n"}
	for p, body := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// measureBuild times the build cold (no step cache; the base image's
// layers are local on both sides) and fully cached, ours and podman's,
// alternating.
func (r *runner) measureBuild(ctx context.Context) error {
	dir := filepath.Join(r.work, "build-context")
	if err := writeContext(dir); err != nil {
		return err
	}
	desc := func(what string) string {
		return what + "; FROM the web image in the loopback registry, two RUN steps in runsc"
	}
	oursCold := r.res.AddSeries("build-cold/sandstormd", desc("POST /v1/templates/NAME/build (template build -f Dockerfile DIR) with the step cache emptied before (<data-dir>/build-cache removed), to the template registered"), "")
	oursWarm := r.res.AddSeries("build-cached/sandstormd", desc("the same build again under a new name, every step cached"), "")
	podCold := r.res.AddSeries("build-cold/podman", desc("podman build --no-cache, runtime runsc, base image already pulled"), "")
	podWarm := r.res.AddSeries("build-cached/podman", desc("podman build of the same again, every step cached"), "")
	if reason := r.podmanSkip(); reason != "" {
		podCold.Skipped, podWarm.Skipped = reason, reason
	}
	args := []string{"build", "--tls-verify=false", "--build-arg", "BASE=" + r.webRef, "-f", filepath.Join(dir, "Dockerfile")}
	for i := range r.cfg.n {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := os.RemoveAll(filepath.Join(r.data, "build-cache")); err != nil {
			return err
		}
		r.buildOurs(ctx, oursCold, fmt.Sprintf("bcold-%d", i), dir, true)
		r.buildOurs(ctx, oursWarm, fmt.Sprintf("bwarm-%d", i), dir, false)
		if podCold.Skipped == "" {
			r.podmanStep(ctx, podCold, append(args, "--no-cache", "-t", fmt.Sprintf("localhost/bcold:%d", i), dir)...)
			r.podmanStep(ctx, podWarm, append(args, "-t", fmt.Sprintf("localhost/bwarm:%d", i), dir)...)
		}
		fmt.Fprintf(os.Stderr, "build: %d of %d\n", i+1, r.cfg.n)
	}
	return nil
}

// buildOurs is one build of the context at dir as template name, deleted
// afterwards (untimed); cold says whether its RUN steps must run.
func (r *runner) buildOurs(ctx context.Context, s *bench.Series, name, dir string, cold bool) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(rootfs.Pack(dir, pw)) }()
	var out strings.Builder
	req := api.BuildRequest{Dockerfile: buildDockerfile, BuildArgs: map[string]string{"BASE": r.webRef}}
	t0 := time.Now()
	_, err := r.c.BuildTemplate(ctx, name, req, pr, func(l string) { out.WriteString(l) })
	d := time.Since(t0)
	pr.Close()
	if err != nil {
		s.Fail("template build %s: %v: %s", name, err, lastLines(out.String(), 4))
		return
	}
	s.AddDuration(d)
	if ran := strings.Contains(out.String(), runMarker); ran != cold {
		s.Note("build %s: RUN steps ran: %v, want %v", name, ran, cold)
	}
	if err := r.c.DeleteTemplate(ctx, name); err != nil {
		s.Note("delete %s: %v", name, err)
	}
}

// podmanStep is one timed podman command as a sample of s.
func (r *runner) podmanStep(ctx context.Context, s *bench.Series, args ...string) {
	d, err := r.pod.run(ctx, args...)
	if err != nil {
		s.Fail("%v", err)
		return
	}
	s.AddDuration(d)
}

// podmanSkip is why podman's series are not measured ("" when they are).
func (r *runner) podmanSkip() string {
	switch {
	case !r.cfg.baseline:
		return "--baseline=false"
	case r.podErr != nil:
		return "podman cannot run here: " + r.podErr.Error()
	}
	return ""
}
