package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sandstorm/api"
)

// TestBackupUnderWrites: a copy taken while another connection keeps
// committing sandboxes is consistent (SQLite's integrity check passes),
// holds every sandbox committed before it began, each row whole, and is
// mode 0600.
func TestBackupUnderWrites(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	src := filepath.Join(dir, "state.db")
	s := openAt(t, src)
	if err := s.PutTemplate(ctx, Template{Name: "web", Rootfs: "/r", Process: api.Process{Args: []string{"/a"}}, Ports: []int{8000}}); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Truncate(time.Millisecond)
	mk := func(i int) Sandbox {
		return Sandbox{ID: fmt.Sprintf("id%05d", i), Name: fmt.Sprintf("sb%05d", i), Template: "web", Node: "local", Backend: "gvisor",
			Tier: api.TierHot, Slot: i, HostPorts: map[int]int{8000: 20000 + i}, LastActive: now, CreatedAt: now, Principal: fmt.Sprintf("p%d", i)}
	}
	var committed atomic.Int64 // sandboxes 0..committed-1 are in the store
	for i := range 50 {
		if err := s.CreateSandbox(ctx, mk(i)); err != nil {
			t.Fatal(err)
		}
		committed.Add(1)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 50; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := s.CreateSandbox(ctx, mk(i)); err != nil {
				t.Error(err)
				return
			}
			committed.Add(1)
		}
	}()
	// Let the writer commit some more before the copy begins.
	for committed.Load() < 200 {
		time.Sleep(time.Millisecond)
	}
	before := committed.Load()
	dst := filepath.Join(t.TempDir(), "backup.db")
	sum, err := Backup(ctx, src, dst)
	after := committed.Load()
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("backup mode %v, want 0600", fi.Mode().Perm())
	}
	n := int64(len(sum.Sandboxes))
	if n < before || n > after+1 || sum.Rows["sandboxes"] != n || sum.Rows["templates"] != 1 {
		t.Fatalf("backup holds %d sandboxes (rows %v); %d were committed before it began and %d when it ended", n, sum.Rows, before, after)
	}
	for i := range before {
		if !slices.Contains(sum.Sandboxes, fmt.Sprintf("id%05d", i)) {
			t.Fatalf("sandbox id%05d, committed before the backup began, is not in it", i)
		}
	}
	// The rows are whole: the copy opens as a store and reads back.
	c := openAt(t, dst)
	got, err := c.GetSandbox(ctx, "id00007")
	if err != nil {
		t.Fatal(err)
	}
	if want := mk(7); got.Name != want.Name || got.HostPorts[8000] != want.HostPorts[8000] || got.Principal != want.Principal || !got.CreatedAt.Equal(want.CreatedAt) {
		t.Fatalf("row in the copy %+v, want %+v", got, want)
	}
	if leftovers, _ := filepath.Glob(dst + ".tmp-*"); len(leftovers) > 0 {
		t.Fatalf("temporary files left: %v", leftovers)
	}
}

// TestBackupRefuses: bad destinations and sources are refused, and nothing
// is written.
func TestBackupRefuses(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	src := filepath.Join(dir, "state.db")
	s := openAt(t, src)
	s.PutTemplate(ctx, Template{Name: "web", Rootfs: "/r", Process: api.Process{Args: []string{"/a"}}})
	notStore := filepath.Join(dir, "other.db")
	o, err := OpenSQLite(notStore)
	if err != nil {
		t.Fatal(err)
	}
	o.db.Exec(`DROP TABLE sandbox_meta`)
	o.db.Exec(`DROP TABLE sandboxes`)
	o.Close()
	for _, c := range []struct{ name, src, dst, want string }{
		{"onto the store", src, src, "the store itself"},
		{"onto its WAL", src, src + "-wal", "-wal"},
		{"onto a directory", src, dir, "is a directory"},
		{"into a directory that is not there", src, filepath.Join(dir, "absent", "state.db"), "create it first"},
		{"no store", filepath.Join(dir, "none.db"), filepath.Join(dir, "b1"), "no store"},
		{"not a store", notStore, filepath.Join(dir, "b2"), "not a sandstormd store"},
	} {
		if _, err := Backup(ctx, c.src, c.dst); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Backup = %v, want an error with %q", c.name, err, c.want)
		}
	}
	for _, p := range []string{"b1", "b2"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err == nil {
			t.Errorf("a refused backup wrote %s", p)
		}
	}
	if _, err := Inspect(ctx, filepath.Join(dir, "none.db")); err == nil {
		t.Error("Inspect of a missing file succeeded")
	}
	junk := filepath.Join(dir, "junk.db")
	os.WriteFile(junk, []byte(strings.Repeat("not sqlite ", 1000)), 0o600)
	if _, err := Inspect(ctx, junk); err == nil {
		t.Error("Inspect of a file that is not SQLite succeeded")
	}
}

// TestInstallCopy: the copy replaces the store; the store as it was — the
// database with its -wal and -shm — is renamed aside, not deleted.
func TestInstallCopy(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	live := filepath.Join(dir, "state.db")
	s := openAt(t, live)
	s.PutTemplate(ctx, Template{Name: "old", Rootfs: "/r", Process: api.Process{Args: []string{"/a"}}})
	s.Close()
	os.WriteFile(live+"-wal", []byte("wal"), 0o600) // as a kill -9 leaves it
	copyDir := t.TempDir()
	bsrc := filepath.Join(copyDir, "src.db")
	b := openAt(t, bsrc)
	b.PutTemplate(ctx, Template{Name: "new", Rootfs: "/r", Process: api.Process{Args: []string{"/a"}}})
	b.Close()
	backup := filepath.Join(copyDir, "backup.db")
	if _, err := Backup(ctx, bsrc, backup); err != nil {
		t.Fatal(err)
	}
	kept, err := InstallCopy(backup, live, ".before-restore-x")
	if err != nil {
		t.Fatal(err)
	}
	if kept != live+".before-restore-x" {
		t.Fatalf("kept at %q", kept)
	}
	if b, err := os.ReadFile(kept + "-wal"); err != nil || string(b) != "wal" {
		t.Fatalf("the old -wal was not kept beside the old database: %q, %v", b, err)
	}
	if _, err := os.Stat(live + "-wal"); err == nil {
		t.Fatal("the old -wal is still beside the restored database")
	}
	fi, _ := os.Stat(live)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("restored store mode %v, want 0600", fi.Mode().Perm())
	}
	r := openAt(t, live)
	if _, err := r.GetTemplate(ctx, "new"); err != nil {
		t.Fatalf("the restored store lacks the backup's template: %v", err)
	}
	if _, err := r.GetTemplate(ctx, "old"); err == nil {
		t.Fatal("the restored store still has the old one's template")
	}
}
