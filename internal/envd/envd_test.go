package envd

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"slices"

	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"sandstorm/internal/testenv"
	fspb "sandstorm/third_party/envd/filesystem"
	"sandstorm/third_party/envd/filesystem/filesystemconnect"
	pb "sandstorm/third_party/envd/process"
	"sandstorm/third_party/envd/process/processconnect"
)

// These tests run envd on loopback with the generated Connect clients —
// the same services the SDK calls — starting real processes and writing
// real files (in the test's own directory). Some need root: envd runs
// commands as other users, as it does inside a sandbox.

type env struct {
	url  string
	proc processconnect.ProcessClient
	fs   filesystemconnect.FilesystemClient
	dir  string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := httptest.NewServer(New(Config{Env: map[string]string{"FROM_CONFIG": "yes"}}).Handler())
	t.Cleanup(srv.Close)
	return &env{
		url:  srv.URL,
		proc: processconnect.NewProcessClient(srv.Client(), srv.URL),
		// The SDK's JSON codec on one client, the binary one on the other:
		// envd must take both.
		fs:  filesystemconnect.NewFilesystemClient(srv.Client(), srv.URL, connect.WithProtoJSON()),
		dir: t.TempDir(),
	}
}

// result is what a command's stream said.
type result struct {
	pid            uint32
	stdout, stderr string
	end            *pb.ProcessEvent_EndEvent
}

func collect(t *testing.T, next func() bool, msg func() *pb.ProcessEvent, errf func() error) result {
	t.Helper()
	var r result
	for next() {
		switch ev := msg().Event.(type) {
		case *pb.ProcessEvent_Start:
			r.pid = ev.Start.Pid
		case *pb.ProcessEvent_Data:
			r.stdout += string(ev.Data.GetStdout()) + string(ev.Data.GetPty())
			r.stderr += string(ev.Data.GetStderr())
		case *pb.ProcessEvent_End:
			r.end = ev.End
		}
	}
	if err := errf(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	return r
}

func (e *env) run(t *testing.T, ctx context.Context, req *pb.StartRequest, user string) result {
	t.Helper()
	r := connect.NewRequest(req)
	if user != "" {
		r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	st, err := e.proc.Start(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	return collect(t, st.Receive, func() *pb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
}

func sh(script string) *pb.ProcessConfig {
	return &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}
}

func TestCommandOutputAndExitStatus(t *testing.T) {
	e := newEnv(t)
	cwd := e.dir
	cfg := sh(`echo out; echo err >&2; echo "$FOO $FROM_CONFIG"; pwd; exit 3`)
	cfg.Envs = map[string]string{"FOO": "bar"}
	cfg.Cwd = &cwd
	r := e.run(t, context.Background(), &pb.StartRequest{Process: cfg}, "")
	if r.pid == 0 || r.end == nil {
		t.Fatalf("want a start and an end event: %+v", r)
	}
	if want := "out\nbar yes\n" + cwd + "\n"; r.stdout != want || r.stderr != "err\n" {
		t.Errorf("stdout %q stderr %q, want %q and %q", r.stdout, r.stderr, want, "err\n")
	}
	if r.end.ExitCode != 3 || !r.end.Exited || r.end.Status != "exit status 3" {
		t.Errorf("end %+v, want exit 3", r.end)
	}
	// A command that cannot start is an error of the call, not an end.
	if err := startErr(e, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "no-such-command-here"}})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("unknown command: %v, want invalid_argument", err)
	}
}

func TestStdinAndUser(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI runs as root; this test must run there")
		}
		t.Skip("runs a command as nobody: needs root")
	}
	e := newEnv(t)
	yes := true
	st, err := e.proc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{Process: sh("cat; id -u"), Stdin: &yes}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() {
		t.Fatal(st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := e.proc.SendInput(context.Background(), connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("hello\n")}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.proc.CloseStdin(context.Background(), connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	r := collect(t, st.Receive, func() *pb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
	if r.stdout != "hello\n0\n" || r.end.GetExitCode() != 0 {
		t.Errorf("stdout %q end %+v, want the input echoed and uid 0", r.stdout, r.end)
	}
	r = e.run(t, context.Background(), &pb.StartRequest{Process: sh("id -u; echo $HOME $USER")}, "nobody")
	if !strings.HasPrefix(r.stdout, "65534\n") || !strings.Contains(r.stdout, "nobody") {
		t.Errorf("as nobody: %q", r.stdout)
	}
	r2 := connect.NewRequest(&pb.StartRequest{Process: sh("true")})
	r2.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("no-such-user:")))
	if err := startErr(e, r2); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("a command as an unknown user: %v, want unauthenticated", err)
	}
}

// startErr is the error a Start call fails with (a server stream's error
// arrives with its first receive).
func startErr(e *env, r *connect.Request[pb.StartRequest]) error {
	st, err := e.proc.Start(context.Background(), r)
	if err != nil {
		return err
	}
	defer st.Close()
	for st.Receive() {
	}
	return st.Err()
}

// TestBackgroundListConnectKill: a command outlives the stream that
// started it; List shows it, Connect attaches to it by tag, a signal ends
// it, and the attached stream sees the end.
func TestBackgroundListConnectKill(t *testing.T) {
	e := newEnv(t)
	tag := "server"
	ctx, cancel := context.WithCancel(context.Background())
	st, err := e.proc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: sh("echo up; exec sleep 60"), Tag: &tag}))
	if err != nil {
		t.Fatal(err)
	}
	st.Receive() // start
	pid := st.Msg().GetEvent().GetStart().GetPid()
	cancel()
	st.Close()
	testenv.WaitFor(t, 5*time.Second, "the command listed", func() bool {
		l, err := e.proc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
		return err == nil && len(l.Msg.Processes) == 1 && l.Msg.Processes[0].Pid == pid && l.Msg.Processes[0].GetTag() == tag
	})
	cs, err := e.proc.Connect(context.Background(), connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}}))
	if err != nil {
		t.Fatal(err)
	}
	if !cs.Receive() || cs.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("connect: first event %v (%v), want the start of %d", cs.Msg(), cs.Err(), pid)
	}
	if _, err := e.proc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	r := collect(t, cs.Receive, func() *pb.ProcessEvent { return cs.Msg().GetEvent() }, cs.Err)
	if r.end == nil || r.end.Exited || r.end.Status != "signal: killed" {
		t.Errorf("end %+v, want killed", r.end)
	}
	if _, err := e.proc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("signal to an ended command: %v, want not_found", err)
	}
}

func TestPty(t *testing.T) {
	e := newEnv(t)
	st, err := e.proc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh"}, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}}}))
	if err != nil {
		t.Fatal(err)
	}
	st.Receive()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: st.Msg().GetEvent().GetStart().GetPid()}}
	if _, err := e.proc.Update(context.Background(), connect.NewRequest(&pb.UpdateRequest{Process: sel, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 100, Rows: 30}}})); err != nil {
		t.Fatal(err)
	}
	in := &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte("stty size; exit 7\n")}}
	if _, err := e.proc.SendInput(context.Background(), connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: in})); err != nil {
		t.Fatal(err)
	}
	r := collect(t, st.Receive, func() *pb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
	if !strings.Contains(r.stdout, "30 100") || r.end.GetExitCode() != 7 {
		t.Errorf("pty output %q end %+v, want the new size and exit 7", r.stdout, r.end)
	}
}

func TestFilesystem(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := filepath.Join(e.dir, "a", "b")
	if _, err := e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: d})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: d})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("second MakeDir: %v, want already_exists (the SDK's makeDir answers false on it)", err)
	}
	f := filepath.Join(d, "f.txt")
	upload(t, e.url, f, "octet", []byte("hello"))
	up := upload(t, e.url, filepath.Join(e.dir, "m.txt"), "multipart", []byte("multi"))
	if len(up) != 1 || up[0]["type"] != "file" || up[0]["name"] != "m.txt" {
		t.Errorf("upload answer %v", up)
	}
	if got := download(t, e.url, f, http.StatusOK); got != "hello" {
		t.Errorf("download %q", got)
	}
	st, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: f}))
	if err != nil || st.Msg.Entry.Size != 5 || st.Msg.Entry.Type != fspb.FileType_FILE_TYPE_FILE || st.Msg.Entry.Permissions != "-rw-r--r--" {
		t.Errorf("stat: %v %v", st, err)
	}
	l, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: e.dir, Depth: 1}))
	if err != nil || len(l.Msg.Entries) != 2 {
		t.Errorf("list depth 1: %v %v, want a and m.txt", l, err)
	}
	l, _ = e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: e.dir, Depth: 3}))
	if len(l.Msg.Entries) != 4 {
		t.Errorf("list depth 3: %d entries, want a, a/b, a/b/f.txt, m.txt", len(l.Msg.Entries))
	}
	moved := filepath.Join(e.dir, "new", "g.txt")
	if mv, err := e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: f, Destination: moved})); err != nil || mv.Msg.Entry.Path != moved {
		t.Fatalf("move: %v %v", mv, err)
	}
	if _, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: f})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("stat of the moved-away file: %v, want not_found", err)
	}
	if _, err := e.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: filepath.Join(e.dir, "new")})); err != nil {
		t.Fatal(err)
	}
	download(t, e.url, moved, http.StatusNotFound)
	download(t, e.url, e.dir, http.StatusBadRequest)
	// A symlink is described, not followed; its target is absolute, as
	// E2B's envd gives it, also when the link's is relative.
	os.Symlink("/etc", filepath.Join(e.dir, "link"))
	if st, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: filepath.Join(e.dir, "link")})); err != nil || st.Msg.Entry.Type != fspb.FileType_FILE_TYPE_SYMLINK || st.Msg.Entry.GetSymlinkTarget() != "/etc" {
		t.Errorf("stat of a symlink: %v %v", st, err)
	}
	os.Symlink("m.txt", filepath.Join(e.dir, "rel"))
	if st, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: filepath.Join(e.dir, "rel")})); err != nil || st.Msg.Entry.GetSymlinkTarget() != filepath.Join(e.dir, "m.txt") {
		t.Errorf("stat of a relative symlink: %v %v, want target %s", st, err, filepath.Join(e.dir, "m.txt"))
	}
	// Removing what is not there is not an error (os.RemoveAll's rule,
	// E2B's envd's).
	if _, err := e.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: filepath.Join(e.dir, "never-was")})); err != nil {
		t.Errorf("remove of a missing path: %v", err)
	}
}

// TestUploadManyAtTheirPaths: files.write([...]) sends one part per
// file, named by its destination — absolute, or relative to the home —
// and no ?path=; each lands at its path (parents made) and the answer
// lists them in order.
func TestUploadManyAtTheirPaths(t *testing.T) {
	e := newEnv(t)
	abs := filepath.Join(e.dir, "0", "deep", "f0.txt")
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for name, data := range map[string]string{abs: "zero"} {
		w, _ := mw.CreateFormFile("file", name)
		w.Write([]byte(data))
	}
	w, _ := mw.CreateFormFile("file", "rel/f1.txt")
	w.Write([]byte("one"))
	mw.Close()
	resp, err := http.Post(e.url+"/files", mw.FormDataContentType(), &body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || len(out) != 2 {
		t.Fatalf("upload of two parts: %d %v %v", resp.StatusCode, out, err)
	}
	if out[0]["path"] != abs || out[1]["name"] != "f1.txt" || !strings.HasSuffix(out[1]["path"], "/rel/f1.txt") {
		t.Errorf("answer %v", out)
	}
	if got := download(t, e.url, abs, http.StatusOK); got != "zero" {
		t.Errorf("%s holds %q", abs, got)
	}
}

func TestWatchDir(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, err := e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: e.dir, Recursive: true, IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if !ws.Receive() || ws.Msg().GetStart() == nil {
		t.Fatalf("first event %v (%v), want start", ws.Msg(), ws.Err())
	}
	os.WriteFile(filepath.Join(e.dir, "new.txt"), []byte("x"), 0o644)
	for ws.Receive() {
		if ev := ws.Msg().GetFilesystem(); ev != nil {
			if ev.Name != "new.txt" || ev.Type != fspb.EventType_EVENT_TYPE_CREATE || ev.GetEntry().GetName() != "new.txt" {
				t.Errorf("event %v, want the create of new.txt with its entry", ev)
			}
			return
		}
	}
	t.Fatalf("no event: %v", ws.Err())
}

func TestResolve(t *testing.T) {
	a := account{name: "user", home: "/home/user"}
	for in, want := range map[string]string{
		"f.txt": "/home/user/f.txt", "~": "/home/user", "~/x/../y": "/home/user/y",
		"/etc/passwd": "/etc/passwd", "../../etc": "/etc", "/a/../../b": "/b",
	} {
		if got, err := a.resolve(in); err != nil || got != want {
			t.Errorf("resolve(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a\x00b"} {
		if _, err := a.resolve(bad); err == nil {
			t.Errorf("resolve(%q) accepted", bad)
		}
	}
}

func upload(t *testing.T, base, path, how string, data []byte) []map[string]string {
	t.Helper()
	var body bytes.Buffer
	ct := "application/octet-stream"
	if how == "multipart" {
		mw := multipart.NewWriter(&body)
		w, _ := mw.CreateFormFile("file", filepath.Base(path))
		w.Write(data)
		mw.Close()
		ct = mw.FormDataContentType()
	} else {
		body.Write(data)
	}
	resp, err := http.Post(base+"/files?path="+path, ct, &body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload %s: %d %s", path, resp.StatusCode, b)
	}
	var out []map[string]string
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("upload answer %q: %v", b, err)
	}
	return out
}

func download(t *testing.T, base, path string, want int) string {
	t.Helper()
	resp, err := http.Get(base + "/files?path=" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("download %s: %d %s, want %d", path, resp.StatusCode, b, want)
	}
	if want != http.StatusOK {
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(b, &e); err != nil || e.Code != want || e.Message == "" {
			t.Errorf("error body %q: want {code: %d, message}", b, want)
		}
	}
	return string(b)
}

// TestInstantExitHasItsEnd: a command that ends at once still streams its
// output and its end to the stream that started it (the stream is
// subscribed before the command starts).
func TestInstantExitHasItsEnd(t *testing.T) {
	e := newEnv(t)
	for i := range 50 {
		r := e.run(t, context.Background(), &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo x; exit 3"}}}, "")
		if r.end == nil || r.end.ExitCode != 3 || r.stdout != "x\n" {
			t.Fatalf("run %d: stdout %q end %+v, want x and exit 3", i, r.stdout, r.end)
		}
	}
}

// TestUploadMetadataAndGzip: X-Metadata-* headers become the file's
// metadata (listed by Stat), replaced by the next upload; a gzip upload
// is stored decompressed; bad metadata is refused.
func TestUploadMetadataAndGzip(t *testing.T) {
	e := newEnv(t)
	p := filepath.Join(e.dir, "m.txt")
	var answer []uploaded
	post := func(body io.Reader, headers map[string]string) int {
		req, _ := http.NewRequest("POST", e.url+"/files?path="+p, body)
		req.Header.Set("Content-Type", "application/octet-stream")
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		answer = nil
		json.NewDecoder(resp.Body).Decode(&answer)
		return resp.StatusCode
	}
	if st := post(strings.NewReader("x"), map[string]string{"X-Metadata-Owner": "team-a", "X-Metadata-Run": "7"}); st != http.StatusOK {
		t.Fatalf("upload with metadata: %d", st)
	}
	if len(answer) != 1 || answer[0].Metadata["owner"] != "team-a" || answer[0].Metadata["run"] != "7" {
		t.Errorf("the upload's answer does not give its metadata: %+v", answer)
	}
	st, err := e.fs.Stat(context.Background(), connect.NewRequest(&fspb.StatRequest{Path: p}))
	if err != nil || st.Msg.Entry.Metadata["owner"] != "team-a" || st.Msg.Entry.Metadata["run"] != "7" {
		t.Fatalf("metadata %v (%v)", st.Msg.GetEntry().GetMetadata(), err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("unzipped"))
	zw.Close()
	if st := post(&gz, map[string]string{"Content-Encoding": "gzip"}); st != http.StatusOK {
		t.Fatalf("gzip upload: %d", st)
	}
	if got := download(t, e.url, p, http.StatusOK); got != "unzipped" {
		t.Errorf("gzip upload stored %q", got)
	}
	st, _ = e.fs.Stat(context.Background(), connect.NewRequest(&fspb.StatRequest{Path: p}))
	if len(st.Msg.Entry.Metadata) != 0 {
		t.Errorf("an upload without metadata kept %v", st.Msg.Entry.Metadata)
	}
	if st := post(strings.NewReader("x"), map[string]string{"X-Metadata-Bad": "caf\u00e9"}); st != http.StatusBadRequest {
		t.Errorf("non-ASCII metadata: %d", st)
	}
	if st := post(strings.NewReader("x"), map[string]string{"Content-Encoding": "br"}); st != http.StatusBadRequest {
		t.Errorf("an unknown encoding: %d", st)
	}
}

// TestLeanEnv: envd's environment has one P, and what it had before comes
// back for what envd starts — a value, or none at all.
func TestLeanEnv(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string // GOMAXPROCS after RestoreEnv; "-" for unset
	}{
		{[]string{"PATH=/bin"}, "-"},
		{[]string{"PATH=/bin", "GOMAXPROCS=4"}, "4"},
		{[]string{"GOMAXPROCS="}, ""},
	} {
		lean := LeanEnv(tc.env)
		if got := LeanEnv(lean); !slices.Equal(got, lean) {
			t.Errorf("LeanEnv twice: %q, want %q", got, lean)
		}
		procs := ""
		for _, kv := range lean {
			if v, ok := strings.CutPrefix(kv, "GOMAXPROCS="); ok {
				procs += v + ";"
			}
		}
		if procs != "1;" {
			t.Errorf("LeanEnv(%q) = %q: GOMAXPROCS %q, want 1 once", tc.env, lean, procs)
		}
		os.Unsetenv("GOMAXPROCS")
		os.Unsetenv(savedProcs)
		for _, kv := range lean {
			k, v, _ := strings.Cut(kv, "=")
			t.Setenv(k, v)
		}
		RestoreEnv()
		got, ok := os.LookupEnv("GOMAXPROCS")
		if !ok {
			got = "-"
		}
		if got != tc.want {
			t.Errorf("%q: GOMAXPROCS after RestoreEnv %q, want %q", tc.env, got, tc.want)
		}
		if _, ok := os.LookupEnv(savedProcs); ok {
			t.Errorf("%q: %s left after RestoreEnv", tc.env, savedProcs)
		}
	}
}

// TestWatchSeesAnUploadAsE2BDoes: an upload is written beside its target
// and renamed over it, yet a watcher is told what E2B's envd, which
// writes in place, tells: a new file's CREATE and WRITE, an overwrite's
// WRITE alone, never the temporary name (the SDK's watch test waits for
// the WRITE of the target's name).
func TestWatchSeesAnUploadAsE2BDoes(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, err := e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: e.dir, IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if !ws.Receive() || ws.Msg().GetStart() == nil {
		t.Fatalf("first event %v (%v), want start", ws.Msg(), ws.Err())
	}
	// told is what the watcher says until the marker file appears.
	told := func(marker string) []string {
		var out []string
		for ws.Receive() {
			ev := ws.Msg().GetFilesystem()
			if ev == nil {
				continue
			}
			if ev.Name == marker {
				return out
			}
			s := strings.TrimPrefix(ev.Type.String(), "EVENT_TYPE_") + " " + ev.Name
			if ev.Type == fspb.EventType_EVENT_TYPE_WRITE && ev.GetEntry().GetPath() != filepath.Join(e.dir, ev.Name) {
				s += " (entry " + ev.GetEntry().GetPath() + ")"
			}
			if len(out) == 0 || out[len(out)-1] != s {
				out = append(out, s)
			}
		}
		t.Fatalf("the watch ended: %v", ws.Err())
		return nil
	}
	f := filepath.Join(e.dir, "f.txt")
	upload(t, e.url, f, "octet", []byte("one"))
	os.WriteFile(filepath.Join(e.dir, "mark1"), nil, 0o644)
	if got := strings.Join(told("mark1"), ", "); got != "CREATE f.txt, WRITE f.txt" {
		t.Errorf("a new file's upload is told as %q, want CREATE then WRITE of f.txt", got)
	}
	upload(t, e.url, f, "multipart", []byte("two"))
	os.WriteFile(filepath.Join(e.dir, "mark2"), nil, 0o644)
	if got := strings.Join(told("mark2"), ", "); got != "WRITE f.txt" {
		t.Errorf("an overwrite is told as %q, want WRITE f.txt", got)
	}
}

func TestUploadTarget(t *testing.T) {
	for p, want := range map[string]string{
		"/h/.f.txt.upload-123":         "/h/f.txt",
		"/h/.f.txt.upload-new-123":     "/h/f.txt new",
		"/h/..x.upload-9":              "/h/.x",
		"/h/.f.txt.upload-":            "",
		"/h/.f.txt.upload-new-":        "",
		"/h/.f.txt.upload-12a":         "",
		"/h/f.txt.upload-1":            "",
		"/h/.upload-1":                 "",
		"/h/.a.upload-1.upload-new-22": "/h/a.upload-1 new",
	} {
		target, isNew, ok := uploadTarget(p)
		got := target
		if isNew {
			got += " new"
		}
		if ok != (want != "") || got != want {
			t.Errorf("uploadTarget(%q) = %q %v, want %q", p, got, ok, want)
		}
	}
}
