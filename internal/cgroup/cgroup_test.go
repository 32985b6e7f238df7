package cgroup

import (
	"errors"
	"os"
	"testing"
)

func TestFind(t *testing.T) {
	none := func(string) bool { return false }
	all := func(string) bool { return true }
	onlyUnified := func(p string) bool { return p == "/sys/fs/cgroup/sandbox/a/cpu.stat" }
	cases := []struct {
		name, text, controller, v2File string
		exists                         func(string) bool
		dir                            string
		v2                             bool
		root, fails                    bool
	}{
		{name: "v1 memory", text: "4:memory:/abc\n0::/\n", controller: "memory", v2File: "memory.reclaim", exists: none, dir: "/sys/fs/cgroup/memory/abc"},
		{name: "v1 cpuacct apart", text: "4:memory:/abc\n2:cpuacct:/abc\n1:cpu:/abc\n0::/\n", controller: "cpuacct", v2File: "cpu.stat", exists: none, dir: "/sys/fs/cgroup/cpuacct/abc"},
		{name: "v1 co-mounted", text: "3:cpu,cpuacct:/x/y\n0::/\n", controller: "cpuacct", v2File: "cpu.stat", exists: none, dir: "/sys/fs/cgroup/cpu,cpuacct/x/y"},
		{name: "v1 root refused", text: "4:memory:/\n0::/abc\n", controller: "memory", v2File: "memory.reclaim", exists: all, root: true},
		{name: "hybrid v2", text: "0::/sandbox/a\n", controller: "memory", v2File: "memory.reclaim", exists: all, dir: "/sys/fs/cgroup/unified/sandbox/a", v2: true},
		{name: "v2 only", text: "0::/sandbox/a\n", controller: "cpuacct", v2File: "cpu.stat", exists: onlyUnified, dir: "/sys/fs/cgroup/sandbox/a", v2: true},
		{name: "v2 without the controller", text: "0::/sandbox/a\n", controller: "memory", v2File: "memory.reclaim", exists: none, fails: true},
		{name: "v2 root refused", text: "0::/\n", controller: "memory", v2File: "memory.reclaim", exists: all, root: true},
		{name: "nothing", text: "", controller: "memory", v2File: "memory.reclaim", exists: all, fails: true},
	}
	for _, c := range cases {
		dir, v2, err := Find(c.text, c.controller, c.v2File, c.exists)
		switch {
		case c.root:
			if !errors.Is(err, ErrRoot) {
				t.Errorf("%s: got %q, %v; want ErrRoot", c.name, dir, err)
			}
		case c.fails:
			if err == nil || errors.Is(err, ErrRoot) {
				t.Errorf("%s: got %q, %v; want an error other than ErrRoot", c.name, dir, err)
			}
		case err != nil || dir != c.dir || v2 != c.v2:
			t.Errorf("%s: got %q v2=%v err=%v; want %q v2=%v", c.name, dir, v2, err, c.dir, c.v2)
		}
	}
}

// TestOfThisProcess reads this process's own cgroup on the machine: a
// test runner may sit in the root cgroup (ErrRoot) or in one of its own,
// but never in none, and a directory found must exist.
func TestOfThisProcess(t *testing.T) {
	dir, _, err := Of(os.Getpid(), "memory", "memory.current")
	switch {
	case errors.Is(err, ErrRoot):
		// The refusal is the right answer there.
	case err != nil:
		t.Fatal(err)
	default:
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("found %s, which does not exist: %v", dir, err)
		}
	}
	if _, _, err := Of(1<<30, "memory", "memory.current"); err == nil {
		t.Error("a pid that does not exist: want an error")
	}
}
