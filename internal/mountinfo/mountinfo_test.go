package mountinfo

import (
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	const table = `22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
35 22 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw
90 1 0:44 / /tmp/a\040b/rootfs rw - overlay overlay rw,lowerdir=/x
91 90 0:45 / /tmp/a\040b/rootfs/dev rw - tmpfs tmpfs rw
short line
`
	ms := Parse(strings.NewReader(table))
	want := []Mount{{"/sys", "sysfs"}, {"/sys/fs/cgroup", "cgroup2"}, {"/tmp/a b/rootfs", "overlay"}, {"/tmp/a b/rootfs/dev", "tmpfs"}}
	if !slices.Equal(ms, want) {
		t.Errorf("Parse = %+v, want %+v", ms, want)
	}
	long := "1 1 0:1 / /long rw - overlay overlay lowerdir=" + strings.Repeat("x", 200<<10) + "\n"
	if ms := Parse(strings.NewReader(long)); len(ms) != 1 || ms[0].Point != "/long" {
		t.Errorf("a 200 KiB line: %d mounts", len(ms))
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{`/tmp/a\040b`: "/tmp/a b", "/plain": "/plain", `/t\011ab\134`: "/t\tab\\", `/end\04`: `/end\04`} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
