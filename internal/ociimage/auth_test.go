package ociimage

import (
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/ociimage/ocitest"
)

const (
	user     = "alice"
	password = "s3cret-Pa55word"
	wrong    = "wr0ng-Pa55word-xyz"
)

func writeAuthFile(t *testing.T, body string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// echoCredentials makes a registry's refusals quote the request's
// credentials, as a careless one might.
func echoCredentials(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, req)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		if rec.Code != http.StatusUnauthorized {
			w.WriteHeader(rec.Code)
			w.Write(rec.Body.Bytes())
			return
		}
		_, p, _ := req.BasicAuth()
		w.WriteHeader(rec.Code)
		w.Write([]byte(`{"errors":[{"code":"UNAUTHORIZED","message":"bad ` + req.Header.Get("Authorization") + ` password ` + p + `"}]}`))
	})
}

func TestBasicAuth(t *testing.T) {
	for _, echo := range []bool{false, true} {
		opts := ocitest.Options{User: user, Password: password}
		if echo {
			opts.Wrap = echoCredentials
		}
		reg := ocitest.NewRegistry(t, opts)
		ref := reg.Push(t, testImage(t), "private:1")
		src, err := ParseSource(ref)
		if err != nil {
			t.Fatal(err)
		}

		for _, file := range []string{
			`{"auths": {"` + reg.Host + `": {"auth": "` + b64(user+":"+password) + `"}}}`,
			`{"auths": {"https://` + reg.Host + `/v1/": {"username": "` + user + `", "password": "` + password + `"}}}`,
		} {
			kc, err := Keychain(writeAuthFile(t, file))
			if err != nil {
				t.Fatal(err)
			}
			img, _, err := Resolve(ctxT(t), src, ResolveOptions{Keychain: kc})
			if err != nil {
				t.Fatalf("right credentials (%s): %v", file, err)
			}
			checkTree(t, pullFlat(t, &Store{Dir: t.TempDir()}, img))
		}

		kc, err := Keychain(writeAuthFile(t, `{"auths": {"`+reg.Host+`": {"auth": "`+b64(user+":"+wrong)+`"}}}`))
		if err != nil {
			t.Fatal(err)
		}
		for what, kc := range map[string]authn.Keychain{"wrong password": kc, "no credentials": nil} {
			_, _, err = Resolve(ctxT(t), src, ResolveOptions{Keychain: kc})
			if !errors.Is(err, errdefs.ErrUnauthorized) || !strings.Contains(err.Error(), "refused the credentials") {
				t.Fatalf("%s (echo %v): %v, want ErrUnauthorized saying so", what, echo, err)
			}
			for _, secret := range []string{wrong, b64(user + ":" + wrong), password} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("%s (echo %v): the error quotes a secret: %v", what, echo, err)
				}
			}
		}
	}
}

func TestKeychainFile(t *testing.T) {
	res, _ := name.NewRegistry("registry.example:5000")
	for _, file := range []string{
		`{"auths": {"registry.example:5000": {"auth": "` + b64("u:p:with:colons") + `"}}}`,
		`{"auths": {"http://registry.example:5000": {"username": "u", "password": "p:with:colons"}}}`,
	} {
		kc, err := Keychain(writeAuthFile(t, file))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		a, err := kc.Resolve(res)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := a.Authorization()
		if err != nil || cfg.Username != "u" || cfg.Password != "p:with:colons" {
			t.Fatalf("%s: %+v, %v", file, cfg, err)
		}
		other, _ := name.NewRegistry("other.example")
		if a, _ := kc.Resolve(other); a != authn.Anonymous {
			t.Fatalf("a registry the file does not name: %v, want anonymous", a)
		}
	}

	hub, _ := name.NewRegistry("docker.io")
	kc, err := Keychain(writeAuthFile(t, `{"auths": {"https://index.docker.io/v1/": {"auth": "`+b64("hubuser:hubpass")+`"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := kc.Resolve(hub); a == authn.Anonymous {
		t.Fatal("Docker Hub's key in Docker's own spelling was not found")
	}

	for what, body := range map[string]string{
		"bad base64":  `{"auths": {"r": {"auth": "!!not-base64-SECRETVALUE"}}}`,
		"no colon":    `{"auths": {"r": {"auth": "` + b64("SECRETVALUE") + `"}}}`,
		"not json":    `{"auths": SECRETVALUE`,
		"wrong types": `{"auths": {"r": {"auth": 12345}}, "x": "SECRETVALUE"}`,
	} {
		_, err := Keychain(writeAuthFile(t, body))
		if !errors.Is(err, errdefs.ErrBadInput) || strings.Contains(err.Error(), "SECRETVALUE") || strings.Contains(err.Error(), b64("SECRETVALUE")) {
			t.Errorf("%s: %v, want ErrBadInput not quoting the file", what, err)
		}
	}
	if _, err := Keychain(filepath.Join(t.TempDir(), "absent.json")); !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("absent file: %v", err)
	}
}

func TestDefaultKeychainReadsDockerConfig(t *testing.T) {
	reg := ocitest.NewRegistry(t, ocitest.Options{User: user, Password: password})
	ref := reg.Push(t, testImage(t), "private:1")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"auths": {"`+reg.Host+`": {"auth": "`+b64(user+":"+password)+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HOME", t.TempDir())
	t.Setenv("DOCKER_CONFIG", dir)
	kc, err := Keychain("")
	if err != nil {
		t.Fatal(err)
	}
	resolve(t, ref, ResolveOptions{Keychain: kc})
}
