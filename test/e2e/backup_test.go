package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/client"
	"sandstorm/internal/store"
	"sandstorm/internal/testenv"
)

// TestStoreBackupRestore (issue 18 item 5): `sandstormd store backup` of a
// running daemon while sandboxes are being created copies a consistent
// store (mode 0600) holding every sandbox made before it began; `store
// restore` is refused while the daemon runs, for a file that is not a
// store, and (without --discard-newer) when sandboxes made after the
// backup would be lost; and a restore brings the master back with the
// backup's sandboxes, each answering with its memory, and its API key.
func TestStoreBackupRestore(t *testing.T) {
	d := startDaemon(t)
	env := []string{"SANDSTORM_DATA_DIR=" + d.DataDir, "SANDSTORM_API=" + d.API}
	hot, frozen, snap, count := d.threeTiers(t)
	key, err := d.C.CreateAPIKey(ctxT(t), "team-a")
	if err != nil {
		t.Fatal(err)
	}

	// Writes: sandboxes created one after another, and calls to hot.
	var mu sync.Mutex
	var made []api.Sandbox
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			sb, err := d.C.CreateSandbox(context.Background(), api.SandboxRequest{Template: "web", Name: fmt.Sprintf("w%d", i)})
			if err != nil {
				t.Errorf("create w%d: %v", i, err)
				return
			}
			d.track(sb.ID)
			mu.Lock()
			made = append(made, sb)
			mu.Unlock()
		}
	}()
	made2 := func() int { mu.Lock(); defer mu.Unlock(); return len(made) }
	testenv.WaitFor(t, gatewayTimeout, "two sandboxes made by the writer", func() bool { return made2() >= 2 })
	mu.Lock()
	before := slices.Clone(made)
	mu.Unlock()
	file := filepath.Join(t.TempDir(), "backup.db")
	cli(t, env, "store", "backup", file).ok(t, "store backup", `backed up the store of .* \(mode 0600\): 1 templates, \d+ sandboxes`)
	n0 := made2()
	testenv.WaitFor(t, gatewayTimeout, "a sandbox made after the backup", func() bool { return made2() > n0 })
	close(stop)
	wg.Wait()
	count[hot.ID]++
	expectCount(t, endpoint(t, hot), count[hot.ID], "hot while the writer ran")

	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("backup mode %v, want 0600 (it holds token hashes)", fi.Mode().Perm())
	}
	sum, err := store.Inspect(context.Background(), file)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range append([]api.Sandbox{hot, frozen, snap}, before...) {
		if !slices.Contains(sum.Sandboxes, sb.ID) {
			t.Fatalf("sandbox %s (%s), made before the backup began, is not in it (%v)", sb.Name, sb.ID, sum.Sandboxes)
		}
	}
	if sum.Rows["api_keys"] != 1 {
		t.Fatalf("the backup holds %d API keys, want 1", sum.Rows["api_keys"])
	}
	var newer []api.Sandbox
	for _, sb := range made {
		if !slices.Contains(sum.Sandboxes, sb.ID) {
			newer = append(newer, sb)
		}
	}
	if len(newer) == 0 {
		t.Fatal("every sandbox the writer made is in the backup: the writes did not run past it")
	}
	t.Logf("backup: %s; %d sandboxes made after it", sum, len(newer))

	// Restore refused: the daemon runs; a file that is not a store.
	cli(t, env, "store", "restore", file).fails(t, "store restore with the daemon running", `sandstormd \(PID \d+; stop it with: kill \d+, or systemctl stop sandstormd\) is running on .*: stop it before a restore`)
	d.Stop(t)
	junk := filepath.Join(t.TempDir(), "junk.db")
	os.WriteFile(junk, []byte(strings.Repeat("not a database ", 500)), 0o600)
	live, _ := os.ReadFile(filepath.Join(d.DataDir, "state.db"))
	cli(t, env, "store", "restore", junk).fails(t, "store restore of a file that is not a store", `cannot be restored`)
	cli(t, env, "store", "restore", file).fails(t, "store restore losing newer sandboxes", `sandboxes on this node are not in .*--discard-newer`)
	if after, _ := os.ReadFile(filepath.Join(d.DataDir, "state.db")); string(after) != string(live) {
		t.Fatal("a refused restore changed the store")
	}

	// The restore, and the master back with the backup's sandboxes.
	cli(t, env, "store", "restore", "--discard-newer", file).ok(t, "store restore", `restored .*`, `the store as it was is at .*before-restore-`)
	kept, _ := filepath.Glob(filepath.Join(d.DataDir, "state.db.before-restore-*"))
	if len(kept) == 0 {
		t.Fatal("the store as it was was not kept")
	}
	d.Start(t)
	d.expectThreeTiers(t, "after the restore", count, hot, frozen, snap)
	for _, sb := range before {
		if got := d.get(t, sb.ID); got.Name != sb.Name {
			t.Errorf("after the restore %s is %+v", sb.ID, got)
		}
	}
	for _, sb := range newer {
		d.assertGone(t, sb.ID) // as the restore said: removed at the start
	}
	// The API key in the backup still admits its team.
	kc := client.New(d.API, key.Key)
	if err := kc.TrustCA(client.CAFile(d.DataDir)); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.Sandboxes(ctxT(t)); err != nil {
		t.Fatalf("the API key from before the backup: %v", err)
	}
	unknown := client.New(d.API, "e2b_"+strings.Repeat("0", 40))
	unknown.TrustCA(client.CAFile(d.DataDir))
	if _, err := unknown.Sandboxes(ctxT(t)); client.StatusOf(err) != http.StatusUnauthorized {
		t.Fatalf("an unknown key: %v, want 401", err)
	}
}
