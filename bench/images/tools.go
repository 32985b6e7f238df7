package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"sandstorm/internal/demo"
)

// webConfig is the image config of the web demo: its process, env,
// working directory and port, as an image would carry them.
func webConfig(d demo.Demo) v1.Config {
	ports := map[string]struct{}{}
	for _, p := range d.Ports {
		ports[strconv.Itoa(p)+"/tcp"] = struct{}{}
	}
	return v1.Config{Cmd: slices.Clone(d.Args), Env: slices.Clone(d.Env), WorkingDir: "/srv", ExposedPorts: ports}
}

// pushImages builds the web demo's rootfs as an image (web:1) and one
// image per size (data-<N>:1: that rootfs with random data layers on
// top), and pushes them to the registry.
func (r *runner) pushImages(ctx context.Context) error {
	cfg := webConfig(r.demo)
	base, baseSize, err := rootfsLayer(r.webRootfs)
	if err != nil {
		return err
	}
	web, err := imageOf(cfg, base)
	if err != nil {
		return err
	}
	if r.webRef, err = r.reg.Push(ctx, web, "web:1"); err != nil {
		return err
	}
	images := map[string]any{"web": map[string]any{"ref": r.webRef, "tar_bytes": baseSize}}
	r.sized = map[int]string{}
	for _, mib := range r.cfg.sizes {
		img, err := sizedImage(cfg, base, baseSize, mib, r.cfg.layerMiB)
		if err != nil {
			return err
		}
		ref, err := r.reg.Push(ctx, img, fmt.Sprintf("data-%d:1", mib))
		if err != nil {
			return err
		}
		tarBytes, blobBytes, err := uncompressedSize(img)
		if err != nil {
			return err
		}
		layers, _ := img.Layers()
		dg, _ := img.Digest()
		images[strconv.Itoa(mib)+"MiB"] = map[string]any{"ref": ref, "digest": dg.String(), "layers": len(layers), "tar_bytes": tarBytes, "blob_bytes": blobBytes}
		r.sized[mib] = ref
		fmt.Fprintf(os.Stderr, "pushed %s: %d layers, %.1f MiB of tar streams, %.1f MiB of blobs\n", ref, len(layers), float64(tarBytes)/(1<<20), float64(blobBytes)/(1<<20))
	}
	r.res.Params["images"] = images
	return nil
}

// setupTools finds skopeo and umoci, and gives podman a directory of its
// own with the web image pulled into it; what cannot run is said in the
// results and its series are skipped with the reason.
func (r *runner) setupTools(ctx context.Context) {
	versions := map[string]string{}
	for _, t := range []string{"skopeo", "umoci"} {
		out, err := exec.CommandContext(ctx, t, "--version").Output()
		if err != nil {
			r.skopeoErr = fmt.Errorf("%s: %v (apt-get install -y skopeo umoci)", t, err)
			continue
		}
		versions[t] = strings.TrimSpace(string(out))
	}
	r.pod, r.podErr = newPodman(r.runsc, filepath.Join(r.work, "podman"))
	if r.pod != nil {
		versions["podman"] = r.pod.version(ctx)
		if _, err := r.pod.run(ctx, "pull", "--tls-verify=false", r.webRef); err != nil {
			r.podErr = err
		}
	}
	if r.podErr != nil {
		r.res.Note("podman cannot run here, its series are not measured: %v", r.podErr)
	}
	if r.skopeoErr != nil {
		r.res.Note("skopeo + umoci cannot run here, their series are not measured: %v", r.skopeoErr)
	}
	r.res.Params["tools"] = versions
}

// teardownTools removes podman's containers, images and directory, and
// ends any process podman left running (a runsc sandbox or conmon whose
// command line names podman's directory), by its id, each said in the
// results.
func (r *runner) teardownTools(ctx context.Context) {
	if r.torn {
		return
	}
	r.torn = true
	if r.pod != nil {
		if err := r.pod.reset(ctx); err != nil {
			r.res.Note("podman's teardown: %v", err)
		}
	}
	for _, pid := range strays(filepath.Join(r.work, "podman") + "/") {
		if pid == os.Getpid() {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			r.res.Note("ended process %d a tool left running: %.120s", pid, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}
