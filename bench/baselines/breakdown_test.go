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

func TestParseRollup(t *testing.T) {
	b := "55d0c0a00000-7ffd9a1f0000 ---p 00000000 00:00 0 [rollup]\nRss: 10240 kB\nPss: 8192 kB\nPss_Dirty: 5000 kB\nPss_Anon: 4096 kB\nPss_File: 3072 kB\nPss_Shmem: 1024 kB\n"
	if got, want := parseRollup([]byte(b)), (rollup{Pss: 8192, Held: 5120}); got != want {
		t.Errorf("%+v, want %+v", got, want)
	}
	if got := parseRollup([]byte("Rss: 1 kB\nPss:\n")); got != (rollup{}) {
		t.Errorf("no Pss value: %+v", got)
	}
}

func TestUsageSince(t *testing.T) {
	before := map[string]classUsage{"sentry": {PssMiB: 1, HeldMiB: 1, Procs: 1}}
	after := map[string]classUsage{"sentry": {PssMiB: 5, HeldMiB: 3, Procs: 3}, "gofer": {PssMiB: 2, HeldMiB: 1, Procs: 2}}
	got := usageSince(after, before)
	if got["sentry"] != (classUsage{PssMiB: 4, HeldMiB: 2, Procs: 2}) || got["gofer"] != after["gofer"] {
		t.Errorf("%+v", got)
	}
}
