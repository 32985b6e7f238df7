package ociimage

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/ociimage/ocitest"
)

func TestConfig(t *testing.T) {
	img := ocitest.ImageOf(t, v1.Config{
		Entrypoint:   []string{"python3", "-u"},
		Cmd:          []string{"app.py"},
		Env:          []string{"PATH=/opt/py/bin:/usr/bin", "LANG=C.UTF-8"},
		WorkingDir:   "/srv",
		User:         "app:staff",
		ExposedPorts: map[string]struct{}{"8080/tcp": {}, "53/udp": {}, "443": {}, "9000-9002/tcp": {}},
	})
	c, err := Config(img)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Args, []string{"python3", "-u", "app.py"}) || c.WorkingDir != "/srv" || c.User != "app:staff" ||
		!slices.Equal(c.Ports, []int{443, 8080, 9000, 9001, 9002}) || c.Path() != "/opt/py/bin:/usr/bin" || len(c.Env) != 2 {
		t.Fatalf("Config = %+v", c)
	}

	c, err = Config(ocitest.ImageOf(t, v1.Config{Cmd: []string{"sh"}}))
	if err != nil || c.WorkingDir != "/" || c.Path() != DefaultPath || c.Ports != nil || c.User != "" {
		t.Fatalf("an image that says little: %+v, %v", c, err)
	}

	for what, cfg := range map[string]v1.Config{
		"relative workdir": {WorkingDir: "srv"},
		"bad env":          {Env: []string{"NOEQUALS"}},
		"bad port":         {ExposedPorts: map[string]struct{}{"http/tcp": {}}},
		"port 0":           {ExposedPorts: map[string]struct{}{"0": {}}},
		"huge range":       {ExposedPorts: map[string]struct{}{"1-65535": {}}},
		"bad proto":        {ExposedPorts: map[string]struct{}{"80/quic": {}}},
	} {
		if _, err := Config(ocitest.ImageOf(t, cfg)); !errors.Is(err, errdefs.ErrBadInput) {
			t.Errorf("%s: %v, want ErrBadInput", what, err)
		}
	}
}

// mkTree writes files (mode 0755 if the name ends in "*") and symlinks
// ("name -> target") under root.
func mkTree(t *testing.T, root string, specs ...string) {
	t.Helper()
	for _, s := range specs {
		if name, target, ok := strings.Cut(s, " -> "); ok {
			os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755)
			if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
				t.Fatal(err)
			}
			continue
		}
		name, body, _ := strings.Cut(s, "=")
		mode := os.FileMode(0o644)
		if n, ok := strings.CutSuffix(name, "*"); ok {
			name, mode = n, 0o755
		}
		p := filepath.Join(root, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
}

func TestResolveExecutable(t *testing.T) {
	host := t.TempDir()
	// What a link followed on the host would find.
	mkTree(t, host, "outside/tool*=#!", "outside/passwd=evil:x:666:666::/evil:/bin/sh\n")
	outside := filepath.Join(host, "outside")
	root := filepath.Join(host, "root")
	mkTree(t, root,
		"usr/bin/python3*=elf",
		"usr/bin/notexec=text",
		"bin -> usr/bin",
		"usr/local/bin/py -> ../../bin/python3", // relative, inside
		"usr/local/bin/abs -> /usr/bin/python3", // absolute: from root
		"usr/local/bin/tool -> "+filepath.Join(outside, "tool"),
		"usr/local/bin/up -> ../../../../../../../../"+outside+"/tool",
		"escape -> "+outside,
		"loop -> loop",
		"srv/app/server*=elf",
	)
	for in, want := range map[[2]string]string{
		{"python3", "/usr/local/bin:/usr/bin"}: "/usr/bin/python3",
		{"python3", "/bin"}:                    "/bin/python3", // the name found, not its target
		{"py", "/usr/local/bin"}:               "/usr/local/bin/py",
		{"abs", "relative:/usr/local/bin"}:     "/usr/local/bin/abs",
		{"/usr/bin/../bin/python3", ""}:        "/usr/bin/python3",
	} {
		got, err := ResolveExecutable(root, in[0], in[1])
		if err != nil || got != want {
			t.Errorf("ResolveExecutable(%q, PATH=%q) = %q, %v; want %q", in[0], in[1], got, err, want)
		}
	}
	for in, says := range map[[2]string]string{
		{"tool", "/usr/local/bin"}:     "not an executable file on the image's PATH",
		{"up", "/usr/local/bin"}:       "not an executable file",
		{"tool", "/escape"}:            "not an executable file",
		{"notexec", "/usr/bin"}:        "not an executable file",
		{"/escape/tool", ""}:           "no such file",
		{"/usr/local/bin/tool", ""}:    "no such file",
		{"/loop/x", ""}:                "too many levels of symbolic links",
		{"/usr/bin/notexec", ""}:       "not executable",
		{"/usr/bin", ""}:               "not a regular file",
		{"./server", "/usr/bin"}:       "relative",
		{"", "/usr/bin"}:               "empty",
		{"python3/x", "/usr/bin"}:      "relative",
		{"/usr/bin/python3/x", "/bin"}: "not a directory",
	} {
		got, err := ResolveExecutable(root, in[0], in[1])
		if !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), says) {
			t.Errorf("ResolveExecutable(%q, PATH=%q) = %q, %v; want ErrBadInput saying %q", in[0], in[1], got, err, says)
		}
	}

	c := ImageConfig{Args: []string{"./server"}, WorkingDir: "/srv/app", Env: []string{"PATH=/nowhere"}}
	if got, err := c.Executable(root); err != nil || got != "/srv/app/server" {
		t.Errorf("Executable of ./server in /srv/app = %q, %v", got, err)
	}
	c = ImageConfig{Args: []string{"python3"}, WorkingDir: "/"}
	if got, err := c.Executable(root); err != nil || got != "/usr/bin/python3" {
		t.Errorf("Executable on the default PATH = %q, %v", got, err)
	}
	if _, err := (ImageConfig{}).Executable(root); !errors.Is(err, errdefs.ErrBadInput) {
		t.Errorf("no args: %v", err)
	}
}

func TestLookupUser(t *testing.T) {
	host := t.TempDir()
	mkTree(t, host, "outside/passwd=evil:x:666:666::/evil:/bin/sh\n", "outside/group=evilgrp:x:667:\n")
	outside := filepath.Join(host, "outside")

	root := filepath.Join(host, "root")
	mkTree(t, root,
		"lib/passwd=root:x:0:0:root:/root:/bin/sh\n# comment\napp:x:1000:1001::/home/app:/bin/sh\nnohome:x:7:7:::\nbroken:x:abc:1::/:/bin/sh\n",
		"etc/passwd -> ../lib/passwd", // a link inside the tree is followed in it
		"etc/group=root:x:0:\nstaff:x:50:app\n",
	)
	for user, want := range map[string][3]any{
		"":          {uint32(0), uint32(0), "/root"},
		"root":      {uint32(0), uint32(0), "/root"},
		"app":       {uint32(1000), uint32(1001), "/home/app"},
		"1000":      {uint32(1000), uint32(1001), "/home/app"},
		"app:staff": {uint32(1000), uint32(50), "/home/app"},
		"app:60":    {uint32(1000), uint32(60), "/home/app"},
		"4242":      {uint32(4242), uint32(0), "/"},
		"4242:4343": {uint32(4242), uint32(4343), "/"},
		"nohome":    {uint32(7), uint32(7), "/"},
	} {
		uid, gid, home, err := LookupUser(root, user)
		if err != nil || uid != want[0] || gid != want[1] || home != want[2] {
			t.Errorf("LookupUser(%q) = %d, %d, %q, %v; want %v", user, uid, gid, home, err, want)
		}
	}
	for user, says := range map[string]string{
		"nobody":      "not in the image's /etc/passwd",
		"app:nogroup": "not in the image's /etc/group",
		":staff":      "names no user",
		"broken":      "no valid uid",
		"4294967295":  "not in the image's /etc/passwd",
	} {
		if _, _, _, err := LookupUser(root, user); !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), says) {
			t.Errorf("LookupUser(%q): %v, want ErrBadInput saying %q", user, err, says)
		}
	}

	// Links out of the tree: absolute, relative climbing, and a directory
	// link. Each is resolved inside the tree, where nothing is found; a
	// host lookup would find "evil".
	for _, link := range []string{
		"etc/passwd -> " + filepath.Join(outside, "passwd"),
		"etc/passwd -> ../../../../../../../.." + outside + "/passwd",
		"etc -> " + outside,
	} {
		r := filepath.Join(t.TempDir(), "root")
		mkTree(t, r, link)
		if _, _, _, err := LookupUser(r, "evil"); !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), "not in the image's /etc/passwd") {
			t.Errorf("with %s: LookupUser(evil): %v, want not found", link, err)
		}
		if _, _, _, err := LookupUser(r, "0:evilgrp"); !errors.Is(err, errdefs.ErrBadInput) {
			t.Errorf("with %s: group evilgrp: %v, want not found", link, err)
		}
	}

	// A passwd that is not a regular file is not read (a fifo would block).
	r := filepath.Join(t.TempDir(), "root")
	os.MkdirAll(filepath.Join(r, "etc/passwd"), 0o755)
	if _, _, _, err := LookupUser(r, "app"); !errors.Is(err, errdefs.ErrBadInput) || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("etc/passwd a directory: %v", err)
	}
}
