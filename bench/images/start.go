package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/demo"
)

// answerTimeout bounds one create → first answer.
const answerTimeout = 60 * time.Second

// httpClient is the polling client: no keep-alive, a new connection per
// request, as bench/tiers polls.
func httpClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
}

// measureStart registers the web image as a template, cold and warm (a
// probe of /healthz, which the demo does not count, and SIGUSR1 to
// reseed), then times create → first answer of each beside podman run
// of the same image with runsc, alternating.
func (r *runner) measureStart(ctx context.Context) error {
	img := &api.ImageSource{Ref: r.webRef}
	if _, err := r.c.CreateTemplate(ctx, api.TemplateRequest{Name: "img-web", Image: img}); err != nil {
		return fmt.Errorf("template from %s: %w", r.webRef, err)
	}
	warm := &api.Warm{Probe: api.Probe{Path: "/healthz"}, Reseed: api.Reseed{Signal: "SIGUSR1"}}
	wi := r.res.AddSeries("warm-image/api", "POST /v1/templates of the image with warm {probe /healthz, reseed SIGUSR1}: pull (layers cached), start, probe, checkpoint (one sample)", "")
	t0 := time.Now()
	if _, err := r.c.CreateTemplate(ctx, api.TemplateRequest{Name: "img-web-warm", Image: img, Warm: warm}); err != nil {
		return fmt.Errorf("warm template from %s: %w", r.webRef, err)
	}
	wi.AddDuration(time.Since(t0))
	cold := r.res.AddSeries("start-cold/sandstormd", "POST /v1/sandboxes of the image template sent → first HTTP 200 from its gateway endpoint (polled on the gateway's dial schedule)", "")
	warmS := r.res.AddSeries("start-warm/sandstormd", "the same for the warm image template: a restore of its warm image and a reseed", "")
	pod := r.res.AddSeries("start/podman+runsc", "podman run -d -p 127.0.0.1:PORT:8000 of the same image (already pulled), runtime runsc, started → first HTTP 200 from the published port, polled the same way", "")
	podCmd := r.res.AddSeries("start/podman-run-command", "the podman run -d command alone", "")
	if reason := r.podmanSkip(); reason != "" {
		pod.Skipped, podCmd.Skipped = reason, reason
	}
	hc := httpClient()
	for i := range r.cfg.n {
		if err := ctx.Err(); err != nil {
			return err
		}
		r.startOurs(ctx, hc, cold, "img-web", fmt.Sprintf("cold-%d", i))
		r.startOurs(ctx, hc, warmS, "img-web-warm", fmt.Sprintf("warm-%d", i))
		if pod.Skipped == "" {
			r.startPodman(ctx, hc, pod, podCmd, fmt.Sprintf("web-%d", i))
		}
		fmt.Fprintf(os.Stderr, "start: %d of %d\n", i+1, r.cfg.n)
	}
	for _, t := range []string{"img-web", "img-web-warm"} {
		if err := r.c.DeleteTemplate(ctx, t); err != nil {
			r.res.Note("delete template %s: %v", t, err)
		}
	}
	return nil
}

// startOurs is one create → first answer of template, the sandbox
// deleted afterwards (untimed).
func (r *runner) startOurs(ctx context.Context, hc *http.Client, s *bench.Series, template, name string) {
	t0 := time.Now()
	sb, err := r.c.CreateSandbox(ctx, api.SandboxRequest{Template: template, Name: name})
	if err != nil {
		s.Fail("create: %v", err)
		return
	}
	defer func() {
		if err := r.c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID); err != nil {
			s.Note("delete %s: %v", sb.ID, err)
		}
	}()
	url, ok := sb.Endpoints[strconv.Itoa(demo.Port)]
	if !ok {
		s.Fail("sandbox %s has no endpoint for port %d: %v", sb.ID, demo.Port, sb.Endpoints)
		return
	}
	if err := bench.FirstAnswer(ctx, hc, url, t0.Add(answerTimeout)); err != nil {
		s.Fail("%v", err)
		return
	}
	s.AddDuration(time.Since(t0))
}

// startPodman is one podman run → first answer on a published port, the
// container removed afterwards (untimed).
func (r *runner) startPodman(ctx context.Context, hc *http.Client, s, cmd *bench.Series, name string) {
	port, err := freePort()
	if err != nil {
		s.Fail("%v", err)
		return
	}
	t0 := time.Now()
	d, err := r.pod.run(ctx, "run", "-d", "--name", name, "-p", fmt.Sprintf("127.0.0.1:%d:%d", port, demo.Port), r.webRef)
	defer func() {
		if _, err := r.pod.run(context.WithoutCancel(ctx), "rm", "--force", "--time", "0", name); err != nil {
			s.Note("remove %s: %v", name, err)
		}
	}()
	if err != nil {
		s.Fail("%v", err)
		return
	}
	if err := bench.FirstAnswer(ctx, hc, fmt.Sprintf("http://127.0.0.1:%d/", port), t0.Add(answerTimeout)); err != nil {
		s.Fail("%v", err)
		return
	}
	s.AddDuration(time.Since(t0))
	cmd.AddDuration(d)
}

// freePort is a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
