package memstat

import (
	"bufio"
	"os"
	"strings"
	"testing"
)

// TestParseSmaps: mappings are summed by kind — gVisor's memory file (a
// memfd, "(deleted)" or not), anonymous memory, the runsc binary, other
// files — and a field that is not Rss or Pss is not counted.
func TestParseSmaps(t *testing.T) {
	const text = `7f0000000000-7f0000100000 rw-s 00000000 00:01 1234 /memfd:runsc-memory (deleted)
Size:               1024 kB
Rss:                 600 kB
Pss:                 600 kB
7f0000100000-7f0000200000 rw-p 00000000 00:00 0 
Rss:                 100 kB
Pss:                  50 kB
Swap:                999 kB
55d000000000-55d000100000 r-xp 00000000 08:01 42 /usr/local/bin/runsc
Rss:                  30 kB
Pss:                  10 kB
7f0000300000-7f0000400000 r--p 00000000 08:01 43 /usr/lib/x.so
Rss:                   5 kB
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]
Rss:                   8 kB
`
	rss, pss := map[string]int64{}, map[string]int64{}
	if err := ParseSmaps(bufio.NewScanner(strings.NewReader(text)), "/work/bin/runsc", rss, pss); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"memfd:runsc-memory": 600, "anon": 100, "binary": 30, "file": 5, "[stack]": 8}
	for k, v := range want {
		if rss[k] != v {
			t.Errorf("rss[%s] = %d, want %d (all: %v)", k, rss[k], v, rss)
		}
	}
	if len(rss) != len(want) || pss["anon"] != 50 {
		t.Errorf("rss %v pss %v", rss, pss)
	}
	if err := ParseSmaps(bufio.NewScanner(strings.NewReader("")), "", rss, pss); err == nil {
		t.Error("an empty smaps parsed without error")
	}
}

// TestReadOurselves: this process's own smaps, as Read reads a sandbox's.
func TestReadOurselves(t *testing.T) {
	p, err := readProc(os.Getpid(), "")
	if err != nil {
		t.Fatal(err)
	}
	if p.RssKiB["[stack]"] <= 0 || p.RssKiB["anon"]+p.RssKiB["file"] <= 0 {
		t.Errorf("own memory by kind: %v", p.RssKiB)
	}
	if s := ParseStat("cache 4096\nrss 8192\nbad line here\n"); s["cache"] != 4096 || s["rss"] != 8192 || len(s) != 2 {
		t.Errorf("ParseStat: %v", s)
	}
}
