package e2b

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
)

const hashA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

func TestTranslate(t *testing.T) {
	req := buildStart{Steps: []step{
		{Type: "COPY", Args: []string{"folder/*", "folder", "", ""}, FilesHash: hashA},
		{Type: "RUN", Args: []string{"cat folder/test.txt\necho $HOME"}},
		{Type: "RUN", Args: []string{"whoami", "root"}},
		{Type: "ENV", Args: []string{"A", `x "y" $z`, "B", "2"}},
		{Type: "WORKDIR", Args: []string{"/app"}},
		{Type: "USER", Args: []string{"root"}},
		{Type: "COPY", Args: []string{"a.txt", "/b", "user", "0755"}, FilesHash: hashA, Force: true},
	}}
	p, err := translate(req, from{image: "127.0.0.1:5000/library/ubuntu:22.04"})
	if err != nil {
		t.Fatal(err)
	}
	want := `FROM 127.0.0.1:5000/library/ubuntu:22.04
USER 0:0
RUN ["/bin/sh","-c",` + jsonQuote(provision) + `]
USER user
WORKDIR /home/user
COPY --chown=user ["` + hashA + `/folder/*","folder/"]
RUN ["/bin/sh","-c","cat folder/test.txt\necho $HOME"]
USER root
RUN ["/bin/sh","-c","whoami"]
USER user
ENV A="x \"y\" \$z" B="2"
WORKDIR "/app"
USER root
COPY --chown=user --chmod=0755 ["` + hashA + `/a.txt","/b"]
`
	if got := p.dockerfile.String(); got != want {
		t.Errorf("Dockerfile:\n%s\nwant:\n%s", got, want)
	}
	if p.user != "root" || p.dir != "/app" || !p.force || len(p.hashes) != 1 {
		t.Errorf("ends as %q in %q, force %v, hashes %v", p.user, p.dir, p.force, p.hashes)
	}
	// Each line is its step's: the image's are "base".
	for line, name := range map[int]string{1: "base", 5: "base", 6: "1", 7: "2", 8: "3", 10: "3", 11: "4", 14: "7"} {
		if p.lines[line] != name {
			t.Errorf("line %d is step %q, want %q", line, p.lines[line], name)
		}
	}
	// A failure is told in E2B's words, with its step.
	r := p.reasonOf(errors.New("Dockerfile:9: RUN [...]: USER root: user not found"))
	if r.Step != "3" || r.Message != "failed to run command 'whoami': command failed: unauthenticated: invalid username: 'root'" {
		t.Errorf("reason: %+v", r)
	}
	if r := p.reasonOf(errors.New("Dockerfile:7: RUN [...]: exit status 1")); r.Step != "2" || !strings.HasPrefix(r.Message, "failed to run command 'cat folder/test.txt") {
		t.Errorf("reason: %+v", r)
	}
	// From a template: its own account and directory first.
	p, err = translate(buildStart{}, from{template: "base", user: "user", dir: "/home/user"})
	if err != nil || p.dockerfile.String() != "FROM base\nUSER user\nWORKDIR \"/home/user\"\n" {
		t.Errorf("from a template: %q, %v", p.dockerfile.String(), err)
	}
}

func jsonQuote(s string) string { return strings.TrimSuffix(strings.TrimPrefix(jsonArgs(s), "["), "]") }

func TestTranslateRefuses(t *testing.T) {
	for what, s := range map[string]step{
		"unknown type":    {Type: "ADD", Args: []string{"x", "y"}},
		"user with ;":     {Type: "USER", Args: []string{"; exit 1"}},
		"RUN as bad user": {Type: "RUN", Args: []string{"id", "a b"}},
		"COPY ..":         {Type: "COPY", Args: []string{"../etc", "x"}, FilesHash: hashA},
		"COPY absolute":   {Type: "COPY", Args: []string{"/etc", "x"}, FilesHash: hashA},
		"COPY bad hash":   {Type: "COPY", Args: []string{"x", "y"}, FilesHash: "../../x"},
		"COPY bad mode":   {Type: "COPY", Args: []string{"x", "y", "", "99"}, FilesHash: hashA},
		"ENV odd":         {Type: "ENV", Args: []string{"A"}},
		"ENV bad name":    {Type: "ENV", Args: []string{"A-B", "1"}},
		"ENV newline":     {Type: "ENV", Args: []string{"A", "1\nRUN evil"}},
		"WORKDIR newline": {Type: "WORKDIR", Args: []string{"/a\nRUN evil"}},
		"RUN empty":       {Type: "RUN", Args: []string{" "}},
	} {
		if _, err := translate(buildStart{Steps: []step{s}}, from{template: "base"}); !errors.Is(err, errdefs.ErrBadInput) {
			t.Errorf("%s: %v, want ErrBadInput", what, err)
		}
	}
}

func TestWarmOf(t *testing.T) {
	envd := api.Probe{Port: api.EnvdPort, Path: "/health"}
	sh := func(c string) api.Probe { return api.Probe{Command: []string{"/bin/sh", "-c", c}} }
	for ready, want := range map[string]api.Probe{
		`[ -n "$(ss -Htuln sport = :8080)" ]`:                                                   {Port: 8080},
		`curl -s -o /dev/null -w "%{http_code}" 'http://localhost:3000/health' | grep -q "200"`: {Port: 3000, Path: "/health"},
		`curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1:8000 | grep -q "200"`:          {Port: 8000, Path: "/"},
		`curl -s -o /dev/null -w "%{http_code}" 'http://example.com:80/' | grep -q "200"`:       sh(`curl -s -o /dev/null -w "%{http_code}" 'http://example.com:80/' | grep -q "200"`),
		`sleep 10`:                             sh(`sleep 10`),
		`[ -f '/tmp/ready' ]`:                  sh(`[ -f '/tmp/ready' ]`),
		``:                                     envd,
		`[ -n "$(ss -Htuln sport = :99999)" ]`: envd,
	} {
		w := warmOf(ready)
		if !reflect.DeepEqual(w.Probe, want) || len(w.Reseed.Command) == 0 || w.Pool != 0 {
			t.Errorf("warmOf(%q) = %+v, want probe %+v", ready, w, want)
		}
	}
}
