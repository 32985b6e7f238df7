package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
)

// TestBadInput sends the API every kind of bad request the issue lists and
// checks each gets its exact status and a JSON {code, message}, that
// rejected tarballs write nothing, and that afterwards the daemon still
// serves and has lost nothing.
func TestBadInput(t *testing.T) {
	const maxUpload = 256 << 20 // the web rootfs is about 130 MiB (Debian 12 from mmdebstrap)
	d := startDaemon(t, "--max-upload", strconv.Itoa(maxUpload))
	d.registerWeb(t, "web")
	victim := d.create(t, "web", "victim")
	tok := d.Token
	const jsonCT = "application/json"

	t.Run("auth", func(t *testing.T) {
		for _, rq := range []struct{ method, path, body string }{
			{"GET", "/v1/sandboxes", ""},
			{"GET", "/v1/sandboxes/" + victim.ID, ""},
			{"POST", "/v1/sandboxes", `{"template":"web"}`},
			{"POST", "/v1/sandboxes/" + victim.ID + "/snapshot", ""},
			{"DELETE", "/v1/sandboxes/" + victim.ID, ""},
			{"GET", "/v1/templates", ""},
			{"POST", "/v1/templates", `{"name":"x"}`},
			{"DELETE", "/v1/templates/web", ""},
			{"GET", "/v1/node", ""},
		} {
			for _, auth := range []string{"", "Bearer wrong-token", "Bearer " + tok + "x", "Bearer " + tok[:len(tok)-1], tok, "Basic " + tok} {
				h := http.Header{}
				if auth != "" {
					h.Set("Authorization", auth)
				}
				r, err := call(rq.method, d.API+rq.path, h, strings.NewReader(rq.body), time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%s %s with Authorization %q: %d", rq.method, rq.path, redact(auth, tok), r.Status)
				expectErrorReply(t, r, http.StatusUnauthorized, api.CodeUnauthorized)
			}
		}
		// Nothing the unauthorised calls asked for happened.
		if sb := d.get(t, victim.ID); sb.Tier != api.TierHot {
			t.Fatalf("victim is %s after unauthorised calls, want hot", sb.Tier)
		}
		if sbs, _ := d.C.Sandboxes(ctxT(t)); len(sbs) != 1 {
			t.Fatalf("%d sandboxes after unauthorised calls, want 1", len(sbs))
		}
	})

	t.Run("json", func(t *testing.T) {
		for _, c := range []struct {
			name, path, body string
			status           int
			code             string
		}{
			{"malformed sandbox", "/v1/sandboxes", `{"template": "web"`, 400, api.CodeBadRequest},
			{"malformed template", "/v1/templates", `{name: web}`, 400, api.CodeBadRequest},
			{"not an object", "/v1/sandboxes", `["web"]`, 400, api.CodeBadRequest},
			{"unknown field sandbox", "/v1/sandboxes", `{"template":"web","bogus":1}`, 400, api.CodeBadRequest},
			{"unknown field template", "/v1/templates", `{"name":"x","rootfs_dir":"` + webRootfs + `","process":{"args":["/usr/bin/python3"]},"ports":[8000],"privileged":true}`, 400, api.CodeBadRequest},
			{"two values", "/v1/sandboxes", `{"template":"web"} {"template":"web"}`, 400, api.CodeBadRequest},
			{"empty body", "/v1/sandboxes", ``, 400, api.CodeBadRequest},
			{"no template", "/v1/sandboxes", `{}`, 400, api.CodeBadRequest},
			{"over 1 MiB sandbox", "/v1/sandboxes", `{"template":"web","name":"` + strings.Repeat("a", 1<<20+10) + `"}`, 413, api.CodeTooLarge},
			{"over 1 MiB template", "/v1/templates", `{"name":"big","rootfs_dir":"` + webRootfs + `","process":{"args":["/usr/bin/python3"],"env":["X=` + strings.Repeat("a", 1<<20+10) + `"]},"ports":[8000]}`, 413, api.CodeTooLarge},
		} {
			r := d.raw(t, "POST", c.path, tok, jsonCT, strings.NewReader(c.body))
			t.Logf("%s: %d", c.name, r.Status)
			expectErrorReply(t, r, c.status, c.code)
		}
		if sbs, _ := d.C.Sandboxes(ctxT(t)); len(sbs) != 1 {
			t.Fatalf("%d sandboxes after rejected creates, want 1", len(sbs))
		}
	})

	t.Run("not_found", func(t *testing.T) {
		for _, c := range []struct{ method, path, body string }{
			{"POST", "/v1/sandboxes", `{"template":"no-such-template"}`},
			{"GET", "/v1/sandboxes/no-such-sandbox", ""},
			{"GET", "/v1/sandboxes/0123456789ab", ""},
			{"DELETE", "/v1/sandboxes/no-such-sandbox", ""},
			{"POST", "/v1/sandboxes/no-such-sandbox/freeze", ""},
			{"POST", "/v1/sandboxes/no-such-sandbox/snapshot", ""},
			{"POST", "/v1/sandboxes/no-such-sandbox/detach", ""},
			{"POST", "/v1/sandboxes/no-such-sandbox/wake", ""},
			{"GET", "/v1/sandboxes/no-such-sandbox/logs", ""},
			{"POST", "/v1/sandboxes/" + victim.ID + "/explode", ""},
			{"POST", "/v1/sandboxes/victim/hibernate", ""},
			{"GET", "/v1/templates/no-such-template", ""},
			{"DELETE", "/v1/templates/no-such-template", ""},
			{"GET", "/v1/nothing-here", ""},
		} {
			r := d.raw(t, c.method, c.path, tok, jsonCT, strings.NewReader(c.body))
			t.Logf("%s %s: %d", c.method, c.path, r.Status)
			expectErrorReply(t, r, http.StatusNotFound, api.CodeNotFound)
		}
		if sb := d.get(t, victim.ID); sb.Tier != api.TierHot {
			t.Fatalf("victim is %s after an unknown verb, want hot", sb.Tier)
		}
	})

	t.Run("conflict", func(t *testing.T) {
		// A name taken is 409 "exists" (errdefs.ErrExists), a state that
		// does not allow it 409 "conflict".
		_, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: "web", RootfsDir: webRootfs,
			Process: api.Process{Args: webDemo.Args}, Ports: []int{8000}})
		expectAPIError(t, err, http.StatusConflict, api.CodeExists)
		_, err = d.upload(t, "web", tarOf(t, tarEntry{hdr: tar.Header{Name: "usr/bin/python3", Typeflag: tar.TypeReg, Mode: 0o755}, body: "x"}))
		expectAPIError(t, err, http.StatusConflict, api.CodeExists)

		_, err = d.C.CreateSandbox(ctxT(t), api.SandboxRequest{Template: "web", Name: "victim"})
		expectAPIError(t, err, http.StatusConflict, api.CodeExists)
		if !errors.Is(err, errdefs.ErrExists) {
			t.Errorf("the client's error is not errdefs.ErrExists across the wire: %v", err)
		}

		err = d.C.DeleteTemplate(ctxT(t), "web")
		expectAPIError(t, err, http.StatusConflict, api.CodeConflict)

		d.transition(t, victim.ID, "snapshot", api.TierSnapshot)
		_, err = d.C.Transition(ctxT(t), victim.ID, "freeze")
		expectAPIError(t, err, http.StatusConflict, api.CodeConflict)
		if sb := d.get(t, victim.ID); sb.Tier != api.TierSnapshot || sb.Transition != "" {
			t.Fatalf("after the refused freeze: tier %q transition %q, want snapshot", sb.Tier, sb.Transition)
		}
		d.transition(t, victim.ID, "wake", api.TierHot)
		if sbs, _ := d.C.Sandboxes(ctxT(t)); len(sbs) != 1 {
			t.Fatalf("%d sandboxes after the duplicate create, want 1", len(sbs))
		}
	})

	t.Run("names", func(t *testing.T) {
		bad := []string{"Web", "a_b", "-lead", "has space", "dot.name", "../x", "x/y", "é", strings.Repeat("a", 64)}
		for _, name := range bad {
			_, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: name, RootfsDir: webRootfs,
				Process: api.Process{Args: webDemo.Args}, Ports: []int{8000}})
			t.Logf("template name %q: %v", name, err)
			expectAPIError(t, err, http.StatusBadRequest, api.CodeBadRequest)
		}
		for _, name := range bad {
			r := d.raw(t, "POST", "/v1/sandboxes", tok, jsonCT, strings.NewReader(fmt.Sprintf(`{"template":"web","name":%q}`, name)))
			t.Logf("sandbox name %q: %d", name, r.Status)
			expectErrorReply(t, r, http.StatusBadRequest, api.CodeBadRequest)
		}
		_, err := d.C.CreateTemplate(ctxT(t), api.TemplateRequest{Name: "", RootfsDir: webRootfs, Process: api.Process{Args: webDemo.Args}})
		expectAPIError(t, err, http.StatusBadRequest, api.CodeBadRequest)
		if sbs, _ := d.C.Sandboxes(ctxT(t)); len(sbs) != 1 {
			t.Fatalf("%d sandboxes after rejected names, want 1", len(sbs))
		}
	})

	t.Run("template_fields", func(t *testing.T) {
		args := webDemo.Args
		for _, c := range []struct {
			name string
			req  api.TemplateRequest
		}{
			{"rootfs_dir missing", api.TemplateRequest{RootfsDir: "/nonexistent/sandstorm-e2e-" + randHex(6), Process: api.Process{Args: args}}},
			{"rootfs_dir relative", api.TemplateRequest{RootfsDir: "demo/web", Process: api.Process{Args: args}}},
			{"rootfs_dir dot-relative", api.TemplateRequest{RootfsDir: "./" + filepath.Base(webRootfs), Process: api.Process{Args: args}}},
			{"rootfs_dir absent", api.TemplateRequest{Process: api.Process{Args: args}}},
			{"rootfs_dir a file", api.TemplateRequest{RootfsDir: filepath.Join(webRootfs, "srv", "app.py"), Process: api.Process{Args: args}}},
			{"args[0] not in rootfs", api.TemplateRequest{RootfsDir: webRootfs, Process: api.Process{Args: []string{"/usr/bin/no-such-binary"}}}},
			{"args[0] relative", api.TemplateRequest{RootfsDir: webRootfs, Process: api.Process{Args: []string{"python3", "/srv/app.py"}}}},
			{"args empty", api.TemplateRequest{RootfsDir: webRootfs}},
			{"env not K=V", api.TemplateRequest{RootfsDir: webRootfs, Process: api.Process{Args: args, Env: []string{"NOEQUALS"}}}},
			{"port 0", api.TemplateRequest{RootfsDir: webRootfs, Process: api.Process{Args: args}, Ports: []int{0}}},
			{"port 70000", api.TemplateRequest{RootfsDir: webRootfs, Process: api.Process{Args: args}, Ports: []int{70000}}},
			{"port twice", api.TemplateRequest{RootfsDir: webRootfs, Process: api.Process{Args: args}, Ports: []int{8000, 8000}}},
			{"negative memory", api.TemplateRequest{RootfsDir: webRootfs, Process: api.Process{Args: args}, MemoryMiB: -1}},
		} {
			c.req.Name = "bad-fields"
			if c.req.Ports == nil {
				c.req.Ports = []int{8000}
			}
			_, err := d.C.CreateTemplate(ctxT(t), c.req)
			t.Logf("%s: %v", c.name, err)
			expectAPIError(t, err, http.StatusBadRequest, api.CodeBadRequest)
		}
		expectNoTemplate(t, d, "bad-fields")
	})

	t.Run("tarballs", func(t *testing.T) {
		// A directory on the host that an escaping entry would write into.
		target, err := os.MkdirTemp("", "sandstorm-e2e-target-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(target)
		tag := randHex(6)
		absName := "/etc/sandstorm-e2e-" + tag
		t.Cleanup(func() { os.Remove(absName) })
		dotdotOut := filepath.Join(d.DataDir, "escape-"+tag) // rootfs/../../../escape-TAG
		ok := []tarEntry{
			{hdr: tar.Header{Name: "srv/", Typeflag: tar.TypeDir, Mode: 0o755}},
			{hdr: tar.Header{Name: "srv/ok.txt", Typeflag: tar.TypeReg, Mode: 0o644}, body: "fine\n"},
			{hdr: tar.Header{Name: "usr/bin/python3", Typeflag: tar.TypeReg, Mode: 0o755}, body: "#!/bin/false\n"},
		}
		for _, c := range []struct {
			name    string
			entries []tarEntry
			outside []string // host paths that must not appear
		}{
			{"dotdot", []tarEntry{{hdr: tar.Header{Name: "../x", Typeflag: tar.TypeReg, Mode: 0o644}, body: "out\n"}}, nil},
			{"dotdot-deep", []tarEntry{{hdr: tar.Header{Name: "srv/../../../../escape-" + tag, Typeflag: tar.TypeReg, Mode: 0o644}, body: "out\n"}}, []string{dotdotOut}},
			{"absolute", []tarEntry{{hdr: tar.Header{Name: absName, Typeflag: tar.TypeReg, Mode: 0o644}, body: "out\n"}}, []string{absName}},
			{"symlink-write-through", []tarEntry{
				{hdr: tar.Header{Name: "esc", Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}},
				{hdr: tar.Header{Name: "esc/pwned", Typeflag: tar.TypeReg, Mode: 0o644}, body: "out\n"},
			}, []string{filepath.Join(target, "pwned")}},
			{"symlink-relative-escape", []tarEntry{
				{hdr: tar.Header{Name: "srv/up", Typeflag: tar.TypeSymlink, Linkname: "../../../../../../../../../.." + target, Mode: 0o777}},
				{hdr: tar.Header{Name: "srv/up/pwned", Typeflag: tar.TypeReg, Mode: 0o644}, body: "out\n"},
			}, []string{filepath.Join(target, "pwned")}},
			{"hardlink-outside", []tarEntry{
				{hdr: tar.Header{Name: "srv/passwd", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}},
			}, nil},
			{"char-device", []tarEntry{{hdr: tar.Header{Name: "dev/mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1, Mode: 0o666}}}, nil},
			{"block-device", []tarEntry{{hdr: tar.Header{Name: "dev/vda", Typeflag: tar.TypeBlock, Devmajor: 253, Devminor: 0, Mode: 0o666}}}, nil},
			{"fifo", []tarEntry{{hdr: tar.Header{Name: "srv/fifo", Typeflag: tar.TypeFifo, Mode: 0o666}}}, nil},
		} {
			name := "tar-" + c.name
			_, err := d.upload(t, name, tarOf(t, append(slices.Clone(ok), c.entries...)...))
			t.Logf("%s: %v", c.name, err)
			e := expectAPIError(t, err, http.StatusBadRequest, api.CodeBadRequest)
			// The message says which entry was refused.
			named := false
			for _, en := range c.entries {
				named = named || strings.Contains(e.Body.Message, en.hdr.Name)
			}
			if !named {
				t.Errorf("%s: the 400 message does not name the refused entry: %q", c.name, e.Body.Message)
			}
			expectNoTemplate(t, d, name)
			for _, p := range c.outside {
				if exists(p) {
					t.Errorf("%s: rejected upload wrote %s on the host", c.name, p)
				}
			}
			if ents, _ := os.ReadDir(target); len(ents) > 0 {
				t.Errorf("%s: rejected upload wrote into %s: %v", c.name, target, ents)
			}
		}
		// Nothing escaped into the data dir or its templates dir either.
		for _, p := range []string{filepath.Join(d.DataDir, "x"), filepath.Join(d.DataDir, "templates", "x"), dotdotOut} {
			if exists(p) {
				t.Errorf("a rejected upload wrote %s", p)
			}
		}
	})

	t.Run("upload_too_large", func(t *testing.T) {
		for _, c := range []struct {
			name  string
			files int
			size  int64
		}{
			{"one file over the limit", 1, maxUpload + 1<<20},
			{"many files adding up over the limit", 26, 10 << 20},
		} {
			body := zeroTar(c.files, c.size)
			_, err := d.upload(t, "tar-big", body)
			body.CloseWithError(io.ErrClosedPipe)
			t.Logf("%s: %v", c.name, err)
			expectAPIError(t, err, http.StatusRequestEntityTooLarge, api.CodeTooLarge)
			expectNoTemplate(t, d, "tar-big")
		}
	})

	t.Run("multipart_order", func(t *testing.T) {
		// The rootfs part before the template part is refused.
		var body bytes.Buffer
		body.WriteString("--XYZ\r\nContent-Disposition: form-data; name=\"rootfs\"; filename=\"r.tar\"\r\n\r\n")
		body.Write(tarOf(t, tarEntry{hdr: tar.Header{Name: "usr/bin/python3", Typeflag: tar.TypeReg, Mode: 0o755}, body: "x"}).Bytes())
		body.WriteString("\r\n--XYZ--\r\n")
		r := d.raw(t, "POST", "/v1/templates", tok, "multipart/form-data; boundary=XYZ", &body)
		expectErrorReply(t, r, http.StatusBadRequest, api.CodeBadRequest)
	})

	t.Run("good_upload", func(t *testing.T) {
		tp, err := d.upload(t, "tarweb", tarDir(t, webRootfs))
		if err != nil {
			t.Fatalf("upload of the web rootfs as a tarball: %v", err)
		}
		if !strings.HasPrefix(tp.Rootfs, filepath.Join(d.DataDir, "templates", "tarweb")+"/") {
			t.Errorf("uploaded template rootfs %q is not under %s/templates/tarweb", tp.Rootfs, d.DataDir)
		}
		sb := d.create(t, "tarweb", "from-tar")
		expectCount(t, endpoint(t, sb), 1, "sandbox from the uploaded template")
		d.deleteSandbox(t, sb.ID)
	})

	t.Run("nothing_lost", func(t *testing.T) {
		expectCount(t, endpoint(t, victim), 1, "victim after all the bad input")
		d.Restart(t)
		ts, err := d.C.Templates(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, tp := range ts {
			names = append(names, tp.Name)
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"tarweb", "web"}) {
			t.Fatalf("templates after restart: %v, want [tarweb web]", names)
		}
		if sb := d.get(t, victim.ID); sb.Tier != api.TierHot {
			t.Fatalf("victim after restart: %s, want hot", sb.Tier)
		}
		expectCount(t, endpoint(t, victim), 2, "victim after restart")
		ents, _ := os.ReadDir(filepath.Join(d.DataDir, "templates"))
		var dirs []string
		for _, e := range ents {
			dirs = append(dirs, e.Name())
		}
		if !slices.Equal(dirs, []string{"tarweb"}) {
			t.Errorf("%s/templates holds %v, want only [tarweb]", d.DataDir, dirs)
		}
		// An uploaded template owns its rootfs: deleting it removes it.
		if err := d.C.DeleteTemplate(ctxT(t), "tarweb"); err != nil {
			t.Fatal(err)
		}
		if p := filepath.Join(d.DataDir, "templates", "tarweb"); exists(p) {
			t.Errorf("deleted uploaded template left %s", p)
		}
	})
}

func redact(s, tok string) string { return strings.ReplaceAll(s, tok, "<token>") }

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// expectNoTemplate checks a rejected template is neither registered nor on
// disk.
func expectNoTemplate(t *testing.T, d *Daemon, name string) {
	t.Helper()
	err := d.C.Do(ctxT(t), "GET", "/v1/templates/"+name, nil, nil)
	expectAPIError(t, err, http.StatusNotFound, api.CodeNotFound)
	if p := filepath.Join(d.DataDir, "templates", name); exists(p) {
		t.Errorf("rejected template %s left %s", name, p)
	}
}

// upload registers a web-demo template named name from a tarball.
func (d *Daemon) upload(t *testing.T, name string, tarball io.Reader) (api.Template, error) {
	return d.C.UploadTemplate(ctxT(t), api.TemplateRequest{
		Name: name, Process: api.Process{Args: webDemo.Args, Env: webDemo.Env}, Ports: webDemo.Ports,
	}, tarball)
}

type tarEntry struct {
	hdr  tar.Header
	body string
}

// tarOf builds a tarball in memory.
func tarOf(t *testing.T, entries ...tarEntry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		h.Size = int64(len(e.body))
		h.ModTime = time.Now()
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

// tarDir streams dir as a tarball (regular files, directories, symlinks).
func tarDir(t *testing.T, dir string) io.Reader {
	t.Helper()
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := filepath.WalkDir(dir, func(path string, de fs.DirEntry, err error) error {
			if err != nil || path == dir {
				return err
			}
			fi, err := de.Info()
			if err != nil {
				return err
			}
			link := ""
			if fi.Mode()&fs.ModeSymlink != 0 {
				if link, err = os.Readlink(path); err != nil {
					return err
				}
			}
			h, err := tar.FileInfoHeader(fi, link)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, path)
			h.Name = filepath.ToSlash(rel)
			if fi.IsDir() {
				h.Name += "/"
			}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if fi.Mode().IsRegular() {
				f, err := os.Open(path)
				if err != nil {
					return err
				}
				defer f.Close()
				_, err = io.Copy(tw, f)
				return err
			}
			return nil
		})
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr
}

// zeroTar streams a tarball of `files` regular files of `size` zero bytes.
func zeroTar(files int, size int64) *io.PipeReader {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		var err error
		for i := 0; i < files && err == nil; i++ {
			err = tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("big%d", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: size})
			if err == nil {
				_, err = io.CopyN(tw, zeros{}, size)
			}
		}
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
