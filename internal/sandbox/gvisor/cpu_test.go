package gvisor

import (
	"testing"
	"time"
)

func TestCPUCgroupFile(t *testing.T) {
	cases := []struct {
		name, text, want string
		v2, fails        bool
	}{
		{name: "v1, cpuacct apart", text: "4:memory:/abc\n2:cpuacct:/abc\n1:cpu:/abc\n0::/\n", want: "/sys/fs/cgroup/cpuacct/abc/cpuacct.usage"},
		{name: "v1, cpu and cpuacct together", text: "3:cpu,cpuacct:/abc\n0::/\n", want: "/sys/fs/cgroup/cpu,cpuacct/abc/cpuacct.usage"},
		{name: "v1, root cgroup refused", text: "2:cpuacct:/\n0::/\n", fails: true},
		{name: "no cgroup of its own", text: "0::/\n", fails: true},
	}
	for _, c := range cases {
		got, v2, err := cpuCgroupFile(c.text)
		if c.fails {
			if err == nil {
				t.Errorf("%s: got %q, want an error", c.name, got)
			}
			continue
		}
		if err != nil || got != c.want || v2 != c.v2 {
			t.Errorf("%s: got %q v2=%v err=%v, want %q v2=%v", c.name, got, v2, err, c.want, c.v2)
		}
	}
}

func TestParseCPUUsage(t *testing.T) {
	if d, err := parseCPUUsage([]byte("123456789\n"), false); err != nil || d != 123456789*time.Nanosecond {
		t.Errorf("v1: %v %v", d, err)
	}
	if d, err := parseCPUUsage([]byte("usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n"), true); err != nil || d != 2500*time.Microsecond {
		t.Errorf("v2: %v %v", d, err)
	}
	if _, err := parseCPUUsage([]byte("user_usec 2000\n"), true); err == nil {
		t.Error("v2 without usage_usec: want an error")
	}
	if _, err := parseCPUUsage([]byte("x"), false); err == nil {
		t.Error("v1 garbage: want an error")
	}
}
