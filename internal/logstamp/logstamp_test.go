package logstamp

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestStampsLines: lines written before the watch have no time, lines
// written while watched get one no earlier than their write and close to
// it, and a partial last line is left for later.
func TestStampsLines(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	path := filepath.Join(t.TempDir(), "console.log")
	os.WriteFile(path, []byte("before the watch\n"), 0o600)
	if err := s.Watch(path); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var wrote []time.Time
	for _, l := range []string{"one\n", "two\n"} {
		wrote = append(wrote, time.Now())
		f.WriteString(l)
		waitStamped(t, path)
		time.Sleep(2 * minGap) // so the two get records of their own
	}
	f.WriteString("partial")
	s.Unwatch(path)

	var out bytes.Buffer
	end, err := Annotate(path, 0, &out)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	t.Logf("%q", lines)
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "- ") || !strings.HasSuffix(lines[0], " before the watch") {
		t.Fatalf("annotated: %q", lines)
	}
	re := regexp.MustCompile(`^(\S+) (one|two)$`)
	for i, l := range lines[1:] {
		m := re.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("line %q", l)
		}
		at, err := time.Parse("2006-01-02T15:04:05.000Z07:00", m[1])
		if err != nil {
			t.Fatal(err)
		}
		if d := at.Sub(wrote[i].Truncate(time.Millisecond)); d < 0 || d > time.Second {
			t.Errorf("line %q stamped %v after its write", l, d)
		}
	}
	if fi, _ := os.Stat(path); end != fi.Size()-int64(len("partial")) {
		t.Errorf("Annotate stopped at %d, want before the partial line", end)
	}
}

// waitStamped polls until the index has a record covering the whole log.
func waitStamped(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		fi, _ := os.Stat(path)
		st := readStamps(path)
		if len(st) > 0 && st[len(st)-1].Size >= fi.Size() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no stamp for the write")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestTornIndex: a record cut short by a crash is ignored.
func TestTornIndex(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	os.WriteFile(path, []byte("a\nb\n"), 0o600)
	os.WriteFile(IndexPath(path), []byte("2 1700000000000000000\n4 17000"), 0o600)
	var out bytes.Buffer
	Annotate(path, 0, &out)
	if got := out.String(); !strings.HasPrefix(got, "2023-11-14T22:13:20.000Z a\n") || !strings.Contains(got, "- ") {
		t.Errorf("annotated %q", got)
	}
}

// TestSplitWrite: a line written as its text and then its newline (as
// Python's print does), the two closer than minGap, still gets a time
// without any later write.
func TestSplitWrite(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	path := filepath.Join(t.TempDir(), "console.log")
	if err := s.Watch(path); err != nil {
		t.Fatal(err)
	}
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	defer f.Close()
	f.WriteString("listening")
	f.WriteString("\n")
	waitStamped(t, path)
	var out bytes.Buffer
	Annotate(path, 0, &out)
	if got := out.String(); strings.HasPrefix(got, "-") || !strings.HasSuffix(got, " listening\n") {
		t.Errorf("annotated %q", got)
	}
}

// TestNodeMarks: the node's own lines are stamped with the time they
// carry, shown once, even with no record at all.
func TestNodeMarks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	os.WriteFile(path, []byte("--- 2026-12-01T12:14:49.819106177Z sandstorm: checkpointed to disk (snapshot tier) ---\n"), 0o600)
	var out bytes.Buffer
	Annotate(path, 0, &out)
	if want := "2026-12-01T12:14:49.819Z --- sandstorm: checkpointed to disk (snapshot tier) ---\n"; out.String() != want {
		t.Errorf("annotated %q, want %q", out.String(), want)
	}
}
