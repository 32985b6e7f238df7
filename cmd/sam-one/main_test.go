package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"sandstorm/internal/cli"
)

// TestUsage: serve's --help names every flag and its defaults; an
// unknown flag or an argument is a usage error (exit 2).
func TestUsage(t *testing.T) {
	run := func(args ...string) (int, string) {
		root := rootCmd()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(args)
		code := cli.Main(context.Background(), "sam-one", root, &out)
		return code, out.String()
	}
	code, help := run("serve", "--help")
	if code != 0 {
		t.Fatalf("serve --help: exit %d", code)
	}
	for _, want := range []string{"--data-dir", "--listen", "--router-listen", "--router-name", "--store", "--name", "--log-level",
		"/var/lib/sam-one", "127.0.0.1:7600", "/ip4/0.0.0.0/tcp/7700", "admin-token"} {
		if !strings.Contains(help, want) {
			t.Errorf("serve --help does not say %q:\n%s", want, help)
		}
	}
	if code, out := run("serve", "--no-such-flag"); code != 2 {
		t.Errorf("an unknown flag: exit %d, want 2: %s", code, out)
	}
	if code, out := run("serve", "extra"); code != 2 {
		t.Errorf("an argument: exit %d, want 2: %s", code, out)
	}
}
