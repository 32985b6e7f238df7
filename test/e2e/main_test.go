package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandstorm/internal/demo"
	"sandstorm/internal/demo/demotest"
	"sandstorm/internal/testenv"
)

// Built once for the whole run by TestMain.
var (
	// sandstormdBin is the daemon and CLI binary under test.
	sandstormdBin string
	// workDir holds the binary, the demo rootfs, daemon logs and data dirs.
	workDir string
	// webRootfs and app64Rootfs are the demo rootfs directories, and
	// webDemo/app64Demo how to run them.
	webRootfs, app64Rootfs, nodeRootfs, nginxRootfs string
	webDemo, app64Demo, nodeDemo, nginxDemo         demo.Demo
	// runscBin is the pinned runsc (bin/runsc of the repository), linked
	// next to sandstormdBin, where sandstormd looks for it by default.
	runscBin string
	// samNodeBin is sam-node; agentRootfs a rootfs holding test/agent,
	// built static, and nothing else but /etc basics.
	samNodeBin, agentRootfs string
	// samControlPlaneBin and samRouterBin: the mesh's control plane and
	// router.
	samControlPlaneBin, samRouterBin string
	// samOneBin: the control plane, router and console in one process.
	samOneBin string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e: these tests start sandstormd, which needs root (network namespaces, mounts, runsc); run them as root")
		return 1
	}
	for _, tool := range []string{"nft", "ip", "curl", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %s is not on PATH: %v\n", tool, err)
			return 1
		}
	}
	var err error
	// Short, comma- and colon-free paths: they end up in overlay options.
	workDir, err = os.MkdirTemp("", "sandstorm-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(workDir)

	start := time.Now()
	sandstormdBin = filepath.Join(workDir, "sandstormd")
	build := exec.Command("go", "build", "-o", sandstormdBin, "sandstorm/cmd/sandstormd")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: go build sandstorm/cmd/sandstormd:", err)
		return 1
	}
	pinned, err := testenv.Runsc()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	runscBin = filepath.Join(workDir, "runsc")
	if err := os.Symlink(pinned, runscBin); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	samNodeBin = filepath.Join(workDir, "sam-node")
	samControlPlaneBin = filepath.Join(workDir, "sam-control-plane")
	samRouterBin = filepath.Join(workDir, "sam-router")
	samOneBin = filepath.Join(workDir, "sam-one")
	agentRootfs = filepath.Join(workDir, "agentfs")
	for _, b := range []struct{ out, pkg string }{
		{samNodeBin, "sandstorm/cmd/sam-node"},
		{samControlPlaneBin, "sandstorm/cmd/sam-control-plane"},
		{samRouterBin, "sandstorm/cmd/sam-router"},
		{samOneBin, "sandstorm/cmd/sam-one"},
		// Beside sandstormd, where it finds envd by default.
		{filepath.Join(workDir, "sandstorm-envd"), "sandstorm/cmd/sandstorm-envd"},
		{filepath.Join(agentRootfs, "agent"), "sandstorm/test/agent"},
	} {
		build := exec.Command("go", "build", "-o", b.out, b.pkg)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: go build %s: %v\n", b.pkg, err)
			return 1
		}
	}
	for _, d := range []string{"etc", "tmp", "proc", "dev", "sys"} {
		os.MkdirAll(filepath.Join(agentRootfs, d), 0o755)
	}
	os.WriteFile(filepath.Join(agentRootfs, "etc", "hosts"), []byte("127.0.0.1 localhost\n"), 0o644)
	os.WriteFile(filepath.Join(agentRootfs, "etc", "passwd"), []byte("root:x:0:0:root:/:/agent\n"), 0o644)
	if webRootfs, webDemo, err = buildDemo("web"); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: build demo web:", err)
		return 1
	}
	for _, b := range []struct {
		name   string
		rootfs *string
		demo   *demo.Demo
	}{{"app64", &app64Rootfs, &app64Demo}, {"node", &nodeRootfs, &nodeDemo}, {"nginx", &nginxRootfs, &nginxDemo}} {
		if *b.rootfs, *b.demo, err = buildDemo(b.name); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: build demo %s: %v\n", b.name, err)
			return 1
		}
	}
	fmt.Fprintf(os.Stderr, "e2e: built sandstormd and the demo rootfs in %s (%.1fs)\n", workDir, time.Since(start).Seconds())
	hadTable := exec.Command("nft", "list", "table", "inet", "sandstorm").Run() == nil
	code := m.Run()
	leaveAsFound(hadTable)
	return code
}

// leaveAsFound deletes the nftables table the suite's daemons made on
// this machine's own network, if there was none before the suite: a
// stopped sandstormd keeps it by design, so sandboxes still running stay
// confined (internal/netns). Only when no sandstormd and no runsc runs
// any more, whoever started them: then nothing is left for it to
// confine, and a developer's machine is left as it was found.
func leaveAsFound(hadTable bool) {
	if hadTable || anyRunning("sandstormd", "runsc") {
		return
	}
	if out, err := exec.Command("nft", "delete", "table", "inet", "sandstorm").CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
		fmt.Fprintf(os.Stderr, "e2e: delete table inet sandstorm: %v: %s\n", err, out)
	}
}

// anyRunning says whether a process of any of these names (its executable's
// base name, even deleted) runs on this machine.
func anyRunning(names ...string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/exe")
	for _, p := range procs {
		exe, err := os.Readlink(p)
		if err != nil {
			continue
		}
		base := strings.TrimSuffix(filepath.Base(exe), " (deleted)")
		for _, n := range names {
			if base == n {
				return true
			}
		}
	}
	return false
}

// buildDemo is demo name's rootfs, shared read-only with every other test
// of this machine that needs it (demotest: built once per machine and
// day, by whichever test comes first).
func buildDemo(name string) (string, demo.Demo, error) {
	return demotest.Build(name, func(dir string) (demo.Demo, error) { return demo.Build(name, dir) })
}
