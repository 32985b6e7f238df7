package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// built caches one rootfs per demo for the whole test binary: building is
// the slow part and every test only reads the result.
var built struct {
	sync.Mutex
	dirs  map[string]string
	demos map[string]Demo
}

func buildOnce(t *testing.T, name string) (string, Demo) {
	t.Helper()
	built.Lock()
	defer built.Unlock()
	if dir, ok := built.dirs[name]; ok {
		return dir, built.demos[name]
	}
	base, err := os.MkdirTemp("", "demo-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "rootfs") // absent: Build creates it
	start := time.Now()
	d, err := Build(name, dir)
	if err != nil {
		os.RemoveAll(base)
		t.Fatalf("Build(%q): %v", name, err)
	}
	t.Logf("Build(%q) took %v; rootfs %.1f MiB", name, time.Since(start).Round(time.Millisecond), float64(treeSize(t, dir))/(1<<20))
	if built.dirs == nil {
		built.dirs, built.demos = map[string]string{}, map[string]Demo{}
	}
	built.dirs[name], built.demos[name] = dir, d
	return dir, d
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, dir := range built.dirs {
		os.RemoveAll(filepath.Dir(dir))
	}
	os.Exit(code)
}

func treeSize(t *testing.T, dir string) int64 {
	var n int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// chrootPython runs python3 inside the rootfs with the demo's environment.
func chrootPython(t *testing.T, dir string, d Demo, args ...string) string {
	t.Helper()
	cmd := exec.Command("chroot", append([]string{dir, "/usr/bin/python3"}, args...)...)
	cmd.Env = d.Env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("chroot %s python3 %v: %v\n%s", dir, args, err, out)
	}
	return string(out)
}

func TestNamesAndPackages(t *testing.T) {
	if got := Names(); !slices.Equal(got, []string{"app64", "web"}) {
		t.Errorf("Names() = %v", got)
	}
	web := Packages("web")
	if !slices.Contains(web, "python3.11-minimal") || slices.Contains(web, "python3-numpy") {
		t.Errorf(`Packages("web") = %v`, web)
	}
	if !slices.Contains(Packages("app64"), "python3-numpy") {
		t.Errorf(`Packages("app64") = %v`, Packages("app64"))
	}
	if Packages("nope") != nil {
		t.Error(`Packages("nope") != nil`)
	}
}

func TestBuildRejects(t *testing.T) {
	if _, err := Build("nope", t.TempDir()); err == nil || !strings.Contains(err.Error(), "unknown demo") {
		t.Errorf("unknown name: err = %v", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Build("web", dir); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("non-empty dir: err = %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("Build touched a non-empty dir: %d entries", len(ents))
	}
	file := filepath.Join(dir, "x")
	if _, err := Build("web", file); err == nil {
		t.Error("Build into a regular file succeeded")
	}
}

func TestMissingPackage(t *testing.T) {
	err := checkInstalled("web", []string{"python3.11-minimal", "sandstorm-no-such-package"})
	var mp *MissingPackagesError
	if !errors.As(err, &mp) {
		t.Fatalf("err = %v, want *MissingPackagesError", err)
	}
	if !slices.Equal(mp.Packages, []string{"sandstorm-no-such-package"}) {
		t.Errorf("missing = %v", mp.Packages)
	}
	if !strings.Contains(err.Error(), "apt-get install -y sandstorm-no-such-package") {
		t.Errorf("error lacks the fix: %v", err)
	}
	if err := checkInstalled("web", Packages("app64")); err != nil {
		t.Errorf("host packages: %v", err)
	}
}

func TestWebRootfs(t *testing.T) {
	dir, d := buildOnce(t, "web")
	if d.Name != "web" || !slices.Equal(d.Ports, []int{8000}) || !slices.Equal(d.Args, []string{"/usr/bin/python3", "/srv/app.py"}) {
		t.Errorf("Demo = %+v", d)
	}
	for _, p := range []string{"proc", "dev", "sys", "tmp", "etc/passwd", "etc/group", "etc/hosts", "srv/app.py"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); err != nil {
			t.Errorf("missing /%s: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "usr/share/doc")); err == nil {
		t.Error("/usr/share/doc was copied")
	}
	chrootPython(t, dir, d, "-c", "import http.server")
	// numpy is not part of the web demo.
	cmd := exec.Command("chroot", dir, "/usr/bin/python3", "-c", "import numpy")
	cmd.Env = d.Env
	if err := cmd.Run(); err == nil {
		t.Error("numpy importable in the web rootfs")
	}
	runServer(t, dir, d, "")
}

func TestApp64Rootfs(t *testing.T) {
	dir, d := buildOnce(t, "app64")
	out := chrootPython(t, dir, d, "-c", "import numpy, http.server; print(numpy.ones(8).sum())")
	if strings.TrimSpace(out) != "8.0" {
		t.Errorf("numpy output = %q", out)
	}
	runServer(t, dir, d, " heap_bytes=67108864")
}

// runServer starts /srv/app.py under chroot on a free loopback port (via
// PORT), checks /healthz, then that GET / counts 1 then 2 with a stable pid.
// suffix is what the demo appends to the "count=N pid=P" line.
func runServer(t *testing.T, dir string, d Demo, suffix string) string {
	t.Helper()
	port := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "chroot", append([]string{dir}, d.Args...)...)
	cmd.Env = append(slices.Clone(d.Env), fmt.Sprintf("PORT=%d", port))
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cancel()
		<-exited
	})

	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	client := &http.Client{Timeout: 30 * time.Second}
	get := func(path string) (int, string, error) {
		resp, err := client.Get(base + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}

	// Wait for the server (a readiness loop, not a timing assertion).
	deadline := time.Now().Add(2 * time.Minute)
	for {
		code, body, err := get("/healthz")
		if err == nil {
			if code != 200 || body != "ok" {
				t.Fatalf("/healthz = %d %q", code, body)
			}
			break
		}
		select {
		case werr := <-exited:
			exited <- werr
			t.Fatalf("server exited: %v\n%s", werr, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server never answered: %v\n%s", err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	var pid string
	var last string
	for n := 1; n <= 2; n++ {
		code, body, err := get("/")
		if err != nil || code != 200 {
			t.Fatalf("GET / #%d: %d %q %v", n, code, body, err)
		}
		var gotN int
		var gotPid string
		if _, err := fmt.Sscanf(body, "count=%d pid=%s", &gotN, &gotPid); err != nil || gotN != n {
			t.Fatalf("GET / #%d body %q: want count=%d", n, body, n)
		}
		want := fmt.Sprintf("count=%d pid=%s%s\n", n, gotPid, suffix)
		if body != want {
			t.Errorf("GET / #%d = %q, want %q", n, body, want)
		}
		if pid != "" && gotPid != pid {
			t.Errorf("pid changed: %s -> %s", pid, gotPid)
		}
		pid, last = gotPid, body
	}
	if code, _, _ := get("/nope"); code != 404 {
		t.Errorf("GET /nope = %d, want 404", code)
	}
	if suffix != "" {
		code, body, err := get("/heap")
		if err != nil || code != 200 || body != "sum=8388608 bytes=67108864\n" {
			t.Errorf("GET /heap = %d %q %v", code, body, err)
		}
	}
	return last
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
