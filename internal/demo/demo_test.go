package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sandstorm/internal/demo/demotest"
	"sandstorm/internal/testenv"
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
	// Built once per machine and day, and shared with the end-to-end
	// tests (demotest): into <key>/rootfs, whose parent does not exist
	// yet — Build makes both.
	start := time.Now()
	dir, d, err := demotest.Build(name, func(dir string) (Demo, error) { return Build(name, dir) })
	var missing *MissingPackagesError
	if errors.As(err, &missing) && os.Getenv("CI") == "" {
		// CI installs deps/debian-packages.txt, so there it fails.
		t.Skipf("cannot build demo %q on this machine: %v", name, err)
	}
	if err != nil {
		t.Fatalf("Build(%q): %v", name, err)
	}
	t.Logf("Build(%q) or the shared tree took %v; rootfs %.1f MiB", name, time.Since(start).Round(time.Millisecond), float64(treeSize(t, dir))/(1<<20))
	if built.dirs == nil {
		built.dirs, built.demos = map[string]string{}, map[string]Demo{}
	}
	built.dirs[name], built.demos[name] = dir, d
	return dir, d
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
	if got := Names(); !slices.Equal(got, []string{"app64", "base", "code-interpreter", "nginx", "node", "web"}) {
		t.Errorf("Names() = %v", got)
	}
	if got := Packages("node"); !slices.Equal(got, []string{"nodejs"}) {
		t.Errorf(`Packages("node") = %v`, got)
	}
	// The others are installed from Debian's mirror: the host needs only
	// the installer.
	for _, name := range []string{"web", "app64", "nginx", "base"} {
		if got := Packages(name); !slices.Equal(got, []string{"mmdebstrap"}) {
			t.Errorf(`Packages(%q) = %v`, name, got)
		}
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
	if err := checkInstalled("web", []string{"dpkg"}); err != nil {
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
	// debian:bookworm-slim's filters: of the documentation, only the
	// copyright files (dpkg leaves the packages' symlinks, dangling).
	var docs []string
	filepath.WalkDir(filepath.Join(dir, "usr/share/doc"), func(p string, e os.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() && e.Name() != "copyright" {
			docs = append(docs, p)
		}
		return err
	})
	if len(docs) > 0 {
		t.Errorf("documentation was installed: %v", docs[:min(3, len(docs))])
	}
	if _, err := os.Stat(filepath.Join(dir, "usr/share/doc/python3.11/copyright")); err != nil {
		t.Errorf("python3.11's copyright: %v", err)
	}
	// Pages, that is: update-alternatives links in man1 (sh.1.gz, which
	// the directory made for a JRE's postinst lets it make) dangle.
	var pages []string
	m, _ := filepath.Glob(filepath.Join(dir, "usr/share/man/*/*"))
	for _, p := range m {
		if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
			pages = append(pages, p)
		}
	}
	if len(pages) > 0 {
		t.Errorf("man pages were installed: %v", pages[:min(3, len(pages))])
	}
	// glibc dlopens it to unwind exiting threads (addUnwinder); without
	// it the server aborted now and then on SIGTERM, when a handler thread
	// ended during shutdown (seen in CI).
	if m, _ := filepath.Glob(filepath.Join(dir, "*lib*", "*", "libgcc_s.so.1")); len(m) == 0 {
		t.Error("no libgcc_s.so.1 beside libc: a thread ending at exit would abort the server")
	}
	chrootPython(t, dir, d, "-c", "import http.server")
	// numpy is not part of the web demo.
	cmd := exec.Command("chroot", dir, "/usr/bin/python3", "-c", "import numpy")
	cmd.Env = d.Env
	if err := cmd.Run(); err == nil {
		t.Error("numpy importable in the web rootfs")
	}
	runServer(t, dir, d, serverCheck{})
}

func TestApp64Rootfs(t *testing.T) {
	dir, d := buildOnce(t, "app64")
	out := chrootPython(t, dir, d, "-c", "import numpy, http.server; print(numpy.ones(8).sum())")
	if strings.TrimSpace(out) != "8.0" {
		t.Errorf("numpy output = %q", out)
	}
	runServer(t, dir, d, serverCheck{suffix: " heap_bytes=67108864"})
}

func TestNodeRootfs(t *testing.T) {
	dir, d := buildOnce(t, "node")
	if d.Name != "node" || !slices.Equal(d.Ports, []int{8000}) || !slices.Equal(d.Args, []string{"/usr/bin/node", "/srv/app.js"}) {
		t.Errorf("Demo = %+v", d)
	}
	for _, p := range []string{"usr/bin/node", "srv/app.js", "etc/passwd"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); err != nil {
			t.Errorf("missing /%s: %v", p, err)
		}
	}
	// Only the executable of the nodejs package: no npm, no headers.
	for _, p := range []string{"usr/lib/node_modules", "usr/include", "usr/share/doc"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); err == nil {
			t.Errorf("/%s was copied", p)
		}
	}
	srv := runServer(t, dir, d, serverCheck{})
	// HEAD looks without counting; other methods are refused.
	if code, _, _ := srv.do(t, http.MethodHead, "/"); code != 200 {
		t.Errorf("HEAD / = %d", code)
	}
	if code, _, _ := srv.do(t, http.MethodPost, "/"); code != 405 {
		t.Errorf("POST / = %d, want 405", code)
	}
	counts, reused := hammer(t, srv.base, 16, 25)
	// Every GET / got its own number, none lost or repeated: 2 came
	// before (runServer's), so the numbers are 3..402 exactly.
	slices.Sort(counts)
	for i, n := range counts {
		if n != i+3 {
			t.Fatalf("concurrent counts: #%d is %d, want %d (sorted: %v)", i, n, i+3, counts)
		}
	}
	if reused == 0 {
		t.Error("no request reused a keep-alive connection")
	}
	t.Logf("node: 400 concurrent GET /, %d on new connections, %d on reused ones", len(counts)-reused, reused)
}

func TestNginxRootfs(t *testing.T) {
	dir, d := buildOnce(t, "nginx")
	if d.Name != "nginx" || !slices.Equal(d.Ports, []int{8000}) || !slices.Equal(d.Args, []string{"/usr/sbin/nginx", "-e", "stderr", "-c", "/etc/nginx/nginx.conf"}) {
		t.Errorf("Demo = %+v", d)
	}
	conf, err := os.ReadFile(filepath.Join(dir, "etc/nginx/nginx.conf"))
	if err != nil {
		t.Fatal(err)
	}
	// The configuration as shipped parses, and what it names exists (-t
	// opens the files and creates the temp directories). -t also binds the
	// listen address, 0.0.0.0:8000, so it runs in a network namespace of
	// its own, off the host's ports.
	test := exec.Command("unshare", append(append([]string{"--net", "chroot", dir}, d.Args...), "-t")...)
	test.Env = d.Env
	if out, err := test.CombinedOutput(); err != nil || !strings.Contains(string(out), "test is successful") {
		t.Fatalf("nginx -t: %v\n%s", err, out)
	}
	// nginx ignores PORT: run it on a copy of its configuration listening
	// on the test's port instead, named by a second -c (the last wins).
	args := func(port int) []string {
		test := strings.Replace(string(conf), "listen 8000 ", fmt.Sprintf("listen 127.0.0.1:%d ", port), 1)
		if test == string(conf) {
			t.Fatal(`nginx.conf has no "listen 8000 " line`)
		}
		name := fmt.Sprintf("/tmp/nginx-test-%d.conf", port)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(test), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(filepath.Join(dir, name)) })
		return append(slices.Clone(d.Args), "-c", name)
	}
	srv := runServer(t, dir, d, serverCheck{args: args, perConnection: true})
	// Requests on one keep-alive connection share its number.
	keep := &http.Client{Timeout: 30 * time.Second}
	defer keep.CloseIdleConnections()
	var first string
	for i := range 2 {
		resp, err := keep.Get(srv.base + "/")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET / on a kept connection: %d %q %v", resp.StatusCode, b, err)
		}
		if i == 0 {
			first = string(b)
		} else if string(b) != first {
			t.Errorf("one connection, two numbers: %q then %q", first, b)
		}
	}
	counts, reused := hammer(t, srv.base, 16, 25)
	if reused == 0 {
		t.Error("no request reused a keep-alive connection")
	}
	t.Logf("nginx: 400 concurrent GET / on %d distinct connection numbers, %d on reused connections", len(slices.Compact(slices.Sorted(slices.Values(counts)))), reused)
}

// serverCheck says how runServer runs and checks a demo server.
type serverCheck struct {
	// suffix is what the demo appends to the "count=N pid=P" line.
	suffix string
	// args returns the command line for a server on port (nil: d.Args,
	// with PORT=port in the environment).
	args func(port int) []string
	// perConnection: N numbers connections (nginx's $connection), not
	// requests, so runServer opens a new connection per GET /.
	perConnection bool
}

// testServer is a demo server runServer started.
type testServer struct {
	base   string // http://127.0.0.1:port
	client *http.Client
}

func (s *testServer) do(t *testing.T, method, path string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequest(method, s.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// runServer starts the demo's server under chroot on a free loopback port,
// checks /healthz, then that GET / counts on (1 then 2 for a per-request
// count) with a stable pid, and that other paths are 404. The server is
// stopped with SIGTERM when the test ends, and must exit by itself, leaving
// no process behind (the pid it reported included).
func runServer(t *testing.T, dir string, d Demo, c serverCheck) *testServer {
	t.Helper()
	port := testenv.FreePort(t)
	args := d.Args
	if c.args != nil {
		args = c.args(port)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "chroot", append([]string{dir}, args...)...)
	cmd.Env = append(slices.Clone(d.Env), fmt.Sprintf("PORT=%d", port))
	var logs testenv.SyncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	// chroot execs the server, so this signals the server itself; every
	// demo exits on SIGTERM (nginx after stopping its worker).
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second // then SIGKILL
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var reported []int // pids the server put in its answers
	t.Cleanup(func() {
		cancel()
		// Wait reports the cancellation itself as an error; the exit
		// status is what tells a clean exit from WaitDelay's SIGKILL.
		if err := <-exited; cmd.ProcessState == nil || !cmd.ProcessState.Success() {
			t.Errorf("server did not exit cleanly on SIGTERM: %v (%v)\n%s", err, cmd.ProcessState, logs.String())
		}
		for _, pid := range reported {
			if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("pid %d outlived the server (kill 0: %v)", pid, err)
			}
		}
	})

	srv := &testServer{
		base:   fmt.Sprintf("http://127.0.0.1:%d", port),
		client: &http.Client{Timeout: 30 * time.Second},
	}
	t.Cleanup(srv.client.CloseIdleConnections)

	// Wait for the server (a readiness loop, not a timing assertion).
	deadline := time.Now().Add(2 * time.Minute)
	for {
		code, body, err := srv.do(t, http.MethodGet, "/healthz")
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

	get := srv.client
	if c.perConnection {
		get = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	}
	var pid string
	prev := 0
	for i := 1; i <= 2; i++ {
		resp, err := get.Get(srv.base + "/")
		if err != nil {
			t.Fatalf("GET / #%d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		body := string(b)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET / #%d: %d %q %v", i, resp.StatusCode, body, err)
		}
		var n, p int
		if _, err := fmt.Sscanf(body, "count=%d pid=%d", &n, &p); err != nil {
			t.Fatalf("GET / #%d body %q: %v", i, body, err)
		}
		reported = append(reported, p)
		// Per request: 1 then 2. Per connection: past the numbers the
		// readiness loop's connections took, then one more.
		if c.perConnection && i == 1 {
			if n < 1 {
				t.Fatalf("GET / #1 body %q: want count>=1", body)
			}
		} else if n != prev+1 {
			t.Fatalf("GET / #%d body %q: want count=%d", i, body, prev+1)
		}
		if want := fmt.Sprintf("count=%d pid=%d%s\n", n, p, c.suffix); body != want {
			t.Errorf("GET / #%d = %q, want %q", i, body, want)
		}
		if pid != "" && strconv.Itoa(p) != pid {
			t.Errorf("pid changed: %s -> %d", pid, p)
		}
		pid, prev = strconv.Itoa(p), n
	}
	if code, _, _ := srv.do(t, http.MethodGet, "/nope"); code != 404 {
		t.Errorf("GET /nope = %d, want 404", code)
	}
	if c.suffix != "" {
		code, body, err := srv.do(t, http.MethodGet, "/heap")
		if err != nil || code != 200 || body != "sum=8388608 bytes=67108864\n" {
			t.Errorf("GET /heap = %d %q %v", code, body, err)
		}
	}
	return srv
}

// hammer sends workers×each concurrent GET / over keep-alive connections
// (one per worker at most) and returns the counts answered and how many
// requests went on a reused connection.
func hammer(t *testing.T, base string, workers, each int) (counts []int, reused int) {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	defer tr.CloseIdleConnections()
	client := &http.Client{Timeout: 30 * time.Second, Transport: tr}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range each {
				var gotReused bool
				trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { gotReused = i.Reused }}
				req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, base+"/", nil)
				if err != nil {
					errs <- err
					return
				}
				resp, err := client.Do(req)
				if err != nil {
					errs <- err
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				var n int
				if err == nil && resp.StatusCode == 200 {
					_, err = fmt.Sscanf(string(b), "count=%d ", &n)
				} else if err == nil {
					err = fmt.Errorf("status %d %q", resp.StatusCode, b)
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				counts = append(counts, n)
				if gotReused {
					reused++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent GET /: %v", err)
	}
	if len(counts) != workers*each {
		t.Fatalf("%d answers, want %d", len(counts), workers*each)
	}
	return counts, reused
}
