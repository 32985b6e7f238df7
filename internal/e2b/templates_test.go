package e2b

import (
	"archive/tar"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/apikey"
	"sandstorm/internal/fleet/fleettest"
	"sandstorm/internal/imagetemplate"
	"sandstorm/internal/ociimage"
	"sandstorm/internal/ociimage/ocitest"
	"sandstorm/internal/store"
	"sandstorm/internal/templates"
)

// templateEnv is env with a template service, and the base template an
// E2B-style one (envd its init, as "user").
func templateEnv(t *testing.T) *env {
	t.Helper()
	fe := fleettest.New(t, fleettest.NewNode())
	data := t.TempDir()
	root := filepath.Join(data, "base")
	for _, f := range []struct{ name, body string }{
		{"bin/sh", "#!"}, {"bin/true", "#!"},
		{"etc/passwd", "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"},
		{"etc/group", "root:x:0:\nuser:x:1000:\n"},
	} {
		os.MkdirAll(filepath.Join(root, filepath.Dir(f.name)), 0o755)
		if err := os.WriteFile(filepath.Join(root, f.name), []byte(f.body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.MkdirAll(filepath.Join(root, "home/user"), 0o755)
	if err := fe.Store.PutTemplate(context.Background(), store.Template{Name: "base", Rootfs: root, Digest: "sha256:x",
		Process: api.Process{Args: []string{"/bin/sh"}, Envd: &api.Envd{User: "user", Workdir: "/home/user"}}}); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(data, "layers"), 0o700)
	tpl := &templates.Service{Store: fe.Store, Fleet: fe.Fleet, DataDir: data, Log: fe.Log,
		Images: &imagetemplate.Puller{Layers: &ociimage.Store{Dir: filepath.Join(data, "layers")}}}
	svc := New(Config{Store: fe.Store, Fleet: fe.Fleet, Domain: "sandbox.test", TokenKey: []byte("k"), Log: fe.Log, Templates: tpl})
	tpl.Sandboxes = svc.sbx
	apiH, up := svc.API(), svc.Uploads()
	e := &env{svc: svc, st: fe.Store}
	e.api = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/e2b/uploads/") {
			// The master serves these without a key (master.Config.E2BUploads).
			http.StripPrefix("/e2b", up).ServeHTTP(w, r)
			return
		}
		c := apikey.Caller{Operator: true}
		if team := r.Header.Get("X-Team"); team != "" {
			c = apikey.Caller{Team: team}
		}
		apiH.ServeHTTP(w, r.WithContext(apikey.With(r.Context(), c)))
	}))
	t.Cleanup(e.api.Close)
	return e
}

// TestTemplateBuild: a team's build through E2B's calls — its files
// uploaded by hash to a signed URL, its steps built, its status and logs,
// its tags — and the template its own: Sandbox.create takes it by name
// and tag, another team finds none of it.
func TestTemplateBuild(t *testing.T) {
	e := templateEnv(t)
	var req struct{ TemplateID, BuildID string }
	json.Unmarshal([]byte(e.expect(t, 202, "request a build", "red", "POST", "/v3/templates", `{"name":"app:v1","tags":["x"]}`).body), &req)
	if len(req.TemplateID) != 20 || req.BuildID == "" {
		t.Fatalf("request answered %+v", req)
	}
	var link struct {
		Present bool
		URL     string
	}
	json.Unmarshal([]byte(e.expect(t, 200, "upload link", "red", "GET", "/templates/"+req.TemplateID+"/files/"+hashA, "").body), &link)
	if link.Present || !strings.Contains(link.URL, "/e2b/uploads/red/"+hashA+"?") {
		t.Fatalf("upload link %+v", link)
	}
	e.expect(t, 404, "another team's upload link", "blue", "GET", "/templates/"+req.TemplateID+"/files/"+hashA, "")
	tarball := ocitest.Tar(t, []ocitest.TarEntry{{Name: "folder/test.txt", Type: tar.TypeReg, Mode: 0o644, Body: []byte("hello")}})
	put := func(u string) int {
		r, _ := http.NewRequest("PUT", u, strings.NewReader(string(tarball)))
		code, _ := send(t, r, nil)
		return code
	}
	if code := put(strings.Replace(link.URL, "signature=", "signature=0", 1)); code != 403 {
		t.Errorf("a forged signature: %d, want 403", code)
	}
	if code := put(strings.Replace(link.URL, "/red/", "/blue/", 1)); code != 403 {
		t.Errorf("another team's path with red's signature: %d, want 403", code)
	}
	if code := put(link.URL); code != 200 {
		t.Fatalf("upload: %d", code)
	}
	json.Unmarshal([]byte(e.expect(t, 200, "upload link again", "red", "GET", "/templates/app/files/"+hashA, "").body), &link)
	if !link.Present {
		t.Errorf("uploaded files not present")
	}
	e.expect(t, 404, "another team's build", "blue", "POST", "/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, `{"fromTemplate":"base"}`)
	steps := `{"fromTemplate":"base","steps":[{"type":"COPY","args":["folder","folder","",""],"filesHash":"` + hashA + `"},{"type":"ENV","args":["A","1"]},{"type":"WORKDIR","args":["/srv"]}],"startCmd":"echo hi","readyCmd":"sleep 1"}`
	e.expect(t, 202, "start the build", "red", "POST", "/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, steps)
	e.expect(t, 409, "start it twice", "red", "POST", "/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, steps)
	e.svc.builds.mu.Lock()
	b := e.svc.builds.byID[req.BuildID]
	e.svc.builds.mu.Unlock()
	select {
	case <-b.done:
	case <-time.After(time.Minute):
		t.Fatal("the build did not end")
	}
	var st struct {
		Status     string
		LogEntries []logEntry
		Reason     *reason
	}
	json.Unmarshal([]byte(e.expect(t, 200, "status", "red", "GET", "/templates/"+req.TemplateID+"/builds/"+req.BuildID+"/status?logsOffset=0", "").body), &st)
	if st.Status != "ready" || st.Reason != nil || len(st.LogEntries) == 0 {
		t.Fatalf("status %+v", st)
	}
	e.expect(t, 404, "another team's status", "blue", "GET", "/templates/"+req.TemplateID+"/builds/"+req.BuildID+"/status", "")
	name := templateName(req.BuildID)
	tt, err := e.st.GetTemplate(context.Background(), name)
	if err != nil || tt.Team != "red" || tt.Warm == nil || tt.Process.Envd == nil || tt.Process.Envd.User != "user" || tt.Process.Envd.Workdir != "/srv" {
		t.Fatalf("registered %+v, %v", tt, err)
	}
	if b, err := os.ReadFile(filepath.Join(tt.Rootfs, "home/user/folder/test.txt")); err != nil || string(b) != "hello" {
		t.Errorf("the copied file: %q, %v", b, err)
	}
	for _, ref := range []string{"app", "app:v1", "app:x", req.TemplateID} {
		if sb := e.create(t, "red", `{"templateID":"`+ref+`"}`); sb.TemplateID != name {
			t.Errorf("create from %s: template %s, want %s", ref, sb.TemplateID, name)
		}
	}
	for _, ref := range []string{"app", name, req.TemplateID} {
		e.expect(t, 404, "another team's template "+ref, "blue", "POST", "/sandboxes", `{"templateID":"`+ref+`"}`)
	}
	e.expect(t, 404, "a tag it has not", "red", "POST", "/sandboxes", `{"templateID":"app:nope"}`)
	// Aliases: its own, the operator's (public), not another team's.
	e.expect(t, 200, "own alias", "red", "GET", "/templates/aliases/app", "")
	e.expect(t, 200, "the operator's", "blue", "GET", "/templates/aliases/base", "")
	e.expect(t, 404, "another team's alias", "blue", "GET", "/templates/aliases/app", "")
	// Tags.
	e.expect(t, 201, "assign", "red", "POST", "/templates/tags", `{"target":"app:v1","tags":["prod"]}`)
	e.expect(t, 400, "a tag with no name", "red", "POST", "/templates/tags", `{"target":"app:v1","tags":[":bad"]}`)
	e.expect(t, 400, "a target with no tag", "red", "POST", "/templates/tags", `{"target":"app:","tags":["ok"]}`)
	e.expect(t, 404, "another team's tags", "blue", "POST", "/templates/tags", `{"target":"app:v1","tags":["prod"]}`)
	var tags []tagInfo
	json.Unmarshal([]byte(e.expect(t, 200, "list tags", "red", "GET", "/templates/app/tags", "").body), &tags)
	if len(tags) != 4 || tags[0].Tag != "default" || tags[2].Tag != "v1" || tags[1].BuildID != req.BuildID {
		t.Errorf("tags %+v", tags)
	}
	e.expect(t, 404, "another team's tag list", "blue", "GET", "/templates/"+req.TemplateID+"/tags", "")
	e.expect(t, 204, "remove a tag", "red", "DELETE", "/templates/tags", `{"name":"app","tags":["prod"]}`)
	e.expect(t, 404, "remove it again", "red", "DELETE", "/templates/tags", `{"name":"app","tags":["prod"]}`)
}

// TestTemplateBuildFails: a step that fails ends the build in error, with
// the step, and registers nothing.
func TestTemplateBuildFails(t *testing.T) {
	e := templateEnv(t)
	var req struct{ TemplateID, BuildID string }
	json.Unmarshal([]byte(e.expect(t, 202, "request a build", "red", "POST", "/v3/templates", `{"name":"bad"}`).body), &req)
	// Its files were never uploaded.
	e.expect(t, 202, "start", "red", "POST", "/v2/templates/bad/builds/"+req.BuildID, `{"fromTemplate":"base","steps":[{"type":"ENV","args":["A","1"]},{"type":"COPY","args":["x","y"],"filesHash":"`+hashA+`"}]}`)
	e.svc.builds.mu.Lock()
	b := e.svc.builds.byID[req.BuildID]
	e.svc.builds.mu.Unlock()
	<-b.done
	var st struct {
		Status string
		Reason *reason
	}
	json.Unmarshal([]byte(e.expect(t, 200, "status", "red", "GET", "/templates/bad/builds/"+req.BuildID+"/status", "").body), &st)
	if st.Status != "error" || st.Reason == nil || st.Reason.Step != "2" || !strings.Contains(st.Reason.Message, "not uploaded") {
		t.Fatalf("status %+v reason %+v", st, st.Reason)
	}
	if _, err := e.st.GetTemplate(context.Background(), templateName(req.BuildID)); err == nil {
		t.Error("a failed build registered its template")
	}
	e.expect(t, 404, "its name has no build", "red", "POST", "/sandboxes", `{"templateID":"bad"}`)
	e.expect(t, 400, "a build from nothing", "red", "POST", "/v3/templates", `{"name":"Bad Name"}`)
	e.expect(t, 409, "credentials for a registry", "red", "POST", "/v2/templates/bad/builds/"+req.BuildID, `{"fromImage":"x","fromImageRegistry":{"type":"registry","username":"u","password":"p"}}`)
}
