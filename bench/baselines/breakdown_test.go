package main

import "testing"

func TestProcessClass(t *testing.T) {
	for _, c := range []struct {
		comm string
		argv []string
		want string
	}{
		{"exe", []string{"runsc-sandbox", "--root=/x", "boot", "--bundle=/b"}, "gVisor sentry"},
		{"exe", []string{"runsc-gofer", "--root=/x", "gofer", "--bundle=/b"}, "gVisor gofer"},
		{"runsc", []string{"/usr/bin/runsc", "--root", "/x", "boot", "--bundle", "/b"}, "gVisor sentry"},
		{"exe", nil, "gVisor systrap stubs"},
		{"kworker/0:1", nil, ""},
		{"containerd-shim", []string{"/usr/bin/containerd-shim-runc-v2", "-namespace", "moby"}, "containerd shim"},
		{"dockerd", []string{"/usr/sbin/dockerd", "-H", "unix:///x"}, "dockerd"},
		{"conmon", []string{"/usr/bin/conmon", "--api-version", "1"}, "conmon"},
		{"python3", []string{"/usr/bin/python3", "/srv/app.py"}, "the program (python3)"},
		{"sandstormd", []string{"/tmp/w/sandstormd", "serve", "--master"}, "sandstormd"},
		{"bash", []string{"bash"}, ""},
	} {
		if got := processClass(c.comm, c.argv); got != c.want {
			t.Errorf("%s %q: %q, want %q", c.comm, c.argv, got, c.want)
		}
	}
}

func TestParsePss(t *testing.T) {
	rollup := "55d0c0a00000-7ffd9a1f0000 ---p 00000000 00:00 0 [rollup]\nRss: 10240 kB\nPss: 8192 kB\nPss_Anon: 4096 kB\n"
	if got := parsePss([]byte(rollup)); got != 8192 {
		t.Errorf("Pss %d KiB, want 8192", got)
	}
	if got := parsePss([]byte("Rss: 1 kB\n")); got != 0 {
		t.Errorf("no Pss line: %d", got)
	}
}
