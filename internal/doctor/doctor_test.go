package doctor

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandstorm/internal/testenv"
)

func TestRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test must run as root")
	}
	runsc, err := testenv.Runsc()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got := Run(context.Background(), Config{DataDir: filepath.Join(t.TempDir(), "not", "yet"), Runsc: runsc})
	t.Logf("Run took %v", time.Since(start))
	names := Names()
	if len(got) != len(names) {
		t.Fatalf("Run returned %d checks, want %d", len(got), len(names))
	}
	byName := map[string]Check{}
	for i, c := range got {
		if c.Name != names[i] {
			t.Errorf("check %d is %q, want %q", i, c.Name, names[i])
		}
		if c.Detail == "" {
			t.Errorf("check %s has no detail", c.Name)
		}
		if !c.OK && c.Fix == "" {
			t.Errorf("failed check %s says nothing about a fix: %+v", c.Name, c)
		}
		byName[c.Name] = c
	}
	// This machine is root with the pinned runsc built; the rest are
	// facts about the machine the test cannot demand.
	for _, name := range []string{"root", "runsc", "runsc-run", "cgroup-v2", "netns", "disk"} {
		if c := byName[name]; !c.OK {
			t.Errorf("%s: %+v", name, c)
		}
	}
	for _, name := range []string{"runsc", "runsc-run"} {
		if c := byName[name]; c.Absent {
			t.Errorf("%s: %+v", name, c)
		}
	}
	if d := byName["runsc"].Detail; !strings.Contains(d, "the pinned version") || !strings.Contains(d, "platform systrap") {
		t.Errorf("runsc detail does not name the pinned version and the platform: %q", d)
	}
	if d := byName["disk"].Detail; !strings.Contains(d, "does not exist yet") {
		t.Errorf("disk detail does not say the data dir is missing: %q", d)
	}

	var buf bytes.Buffer
	Print(&buf, got)
	out := buf.String()
	t.Logf("\n%s", out)
	for _, name := range names {
		if !strings.Contains(out, name) {
			t.Errorf("Print output lacks %q", name)
		}
	}
	// No probe was left behind.
	if entries, _ := os.ReadDir("/var/run/netns"); len(entries) > 0 {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "sandstorm-doctor-") {
				t.Errorf("netns probe %s left behind", e.Name())
			}
		}
	}
}

func TestPrintFormat(t *testing.T) {
	var buf bytes.Buffer
	Print(&buf, []Check{
		{Name: "root", OK: true, Detail: "running as root"},
		{Name: "nftables", OK: false, Detail: "nft is not on PATH", Fix: "apt-get install -y nftables"},
		{Name: "swap", OK: true, Absent: true, Detail: "no swap", Fix: "mkswap"},
	})
	want := "✓ root      running as root\n" +
		"✗ nftables  nft is not on PATH\n" +
		"            fix: apt-get install -y nftables\n" +
		"– swap      no swap\n" +
		"            fix: mkswap\n"
	if got := buf.String(); got != want {
		t.Errorf("Print =\n%s\nwant\n%s", got, want)
	}
}

func TestRunOneBoundsAndRecovers(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	c := runOne(context.Background(), "slow", 50*time.Millisecond, Config{}, func(ctx context.Context, _ Config) Check {
		<-release // ignores ctx entirely
		return Check{OK: true}
	})
	if c.OK || c.Name != "slow" || !strings.Contains(c.Detail, "no answer") {
		t.Errorf("slow check: %+v", c)
	}
	c = runOne(context.Background(), "boom", time.Second, Config{}, func(ctx context.Context, _ Config) Check {
		panic("boom")
	})
	if c.OK || c.Name != "boom" || !strings.Contains(c.Detail, "boom") {
		t.Errorf("panicking check: %+v", c)
	}
}

func TestParseMeminfo(t *testing.T) {
	m, err := parseMeminfo(strings.NewReader("MemTotal:       24683620 kB\nMemAvailable:   24303128 kB\nHugePages_Total:       0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if m["MemTotal"] != 24683620 || m["MemAvailable"] != 24303128 || m["HugePages_Total"] != 0 {
		t.Errorf("parseMeminfo = %v", m)
	}
}

func TestNearestExisting(t *testing.T) {
	dir := t.TempDir()
	got, err := nearestExisting(filepath.Join(dir, "a", "b"))
	if err != nil || got != dir {
		t.Errorf("nearestExisting = %q, %v; want %q", got, err, dir)
	}
}

// TestEnvdCheck: a static envd is ✓, a dynamically linked one ✗ with a
// fix, a missing one "absent" (commands and files are off).
func TestEnvdCheck(t *testing.T) {
	static := filepath.Join(t.TempDir(), "sandstorm-envd")
	build := exec.Command("go", "build", "-o", static, "sandstorm/cmd/sandstorm-envd")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build envd: %v %s", err, out)
	}
	if c := checkEnvd(context.Background(), Config{Envd: static}); !c.OK || c.Absent {
		t.Errorf("a static envd: %+v", c)
	}
	if c := checkEnvd(context.Background(), Config{Envd: "/bin/ls"}); c.OK || c.Fix == "" {
		t.Errorf("a dynamically linked binary: %+v", c)
	}
	if c := checkEnvd(context.Background(), Config{Envd: filepath.Join(t.TempDir(), "nope")}); !c.OK || !c.Absent {
		t.Errorf("no envd: %+v", c)
	}
}
