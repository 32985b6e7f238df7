package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"sandstorm/internal/store"
)

// What `sandstormd store backup` and `store restore` do (issue 18 item 5).

// pgDumpAdvice is what a PostgreSQL store's operator is told instead: the
// database is theirs to dump; what it does not hold is on the nodes.
const pgDumpAdvice = `this store is PostgreSQL: back it up with pg_dump (e.g. pg_dump -Fc -f sandstorm.dump DBNAME), which holds all the masters' desired state — templates, placements, paired nodes and revocations, API keys (as hashes), the CA and API token the masters share, and the sandbox rows of nodes that run in a master's process — and restore it with pg_restore into an empty database while no master runs. It does not hold what lives on each node: a node apart from its master (serve --node) keeps its own store in <data-dir>/state.db (back it up there with sandstormd store backup), and every node keeps its sandboxes' volumes, snapshot images, warm images and its pki/node directory under its data dir`

// storeFile is the SQLite store of dataDir, or an error saying what to do
// with a PostgreSQL one.
func storeFile(dataDir, where string) (string, error) {
	if store.IsPostgres(where) {
		return "", errors.New(pgDumpAdvice)
	}
	if where != "" {
		return where, nil
	}
	return filepath.Join(dataDir, "state.db"), nil
}

// BackupStore writes an online, consistent copy of the store of dataDir
// (where: --store; "" is <data-dir>/state.db) to dst, mode 0600. A daemon
// may be running on it.
func BackupStore(ctx context.Context, dataDir, where, dst string) (store.Summary, error) {
	src, err := storeFile(dataDir, where)
	if err != nil {
		return store.Summary{}, err
	}
	return store.Backup(ctx, src, dst)
}

// RestoreResult says what a restore did.
type RestoreResult struct {
	store.Summary
	// Kept is where the store as it was was renamed ("": there was none).
	Kept string
	// Newer are sandboxes this node has on disk that the backup does not
	// know: the next start removes them, volumes included.
	Newer []string
	// Lost are sandboxes in the backup whose directory is gone: the next
	// start makes them detached (a request cold-starts them).
	Lost []string
}

// RestoreStore puts the backup file in place of dataDir's SQLite store. No
// daemon may be running on dataDir (its lock is held throughout). A
// sandbox on this node that the backup does not know would be removed by
// the next start, its volume with it: unless discardNewer, the restore is
// refused and says which. The store as it was is renamed aside, never
// deleted.
func RestoreStore(ctx context.Context, dataDir, where, file string, discardNewer bool) (RestoreResult, error) {
	var res RestoreResult
	dst, err := storeFile(dataDir, where)
	if err != nil {
		return res, err
	}
	sum, err := store.Inspect(ctx, file)
	if err != nil {
		return res, fmt.Errorf("%s cannot be restored: %w", file, err)
	}
	res.Summary = sum
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return res, err
	}
	lock, err := takeLock(dataDir)
	if err != nil {
		who := "a sandstormd"
		if b, e := os.ReadFile(filepath.Join(dataDir, "sandstormd.pid")); e == nil && strings.TrimSpace(string(b)) != "" {
			pid := strings.TrimSpace(string(b))
			who = "sandstormd (PID " + pid + "; stop it with: kill " + pid + ", or systemctl stop sandstormd)"
		}
		return res, fmt.Errorf("%s is running on %s: stop it before a restore", who, dataDir)
	}
	defer lock.Close()
	ents, err := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return res, err
	}
	onDisk := map[string]bool{}
	for _, e := range ents {
		if e.IsDir() {
			onDisk[e.Name()] = true
			if !slices.Contains(sum.Sandboxes, e.Name()) {
				res.Newer = append(res.Newer, e.Name())
			}
		}
	}
	for _, id := range sum.Sandboxes {
		if !onDisk[id] {
			res.Lost = append(res.Lost, id)
		}
	}
	if len(res.Newer) > 0 && !discardNewer {
		return res, fmt.Errorf("%d sandboxes on this node are not in %s (made after it: %s); the next start would remove them with their volumes. Restore anyway with --discard-newer, or take a newer backup",
			len(res.Newer), file, strings.Join(res.Newer, ", "))
	}
	res.Kept, err = store.InstallCopy(file, dst, ".before-restore-"+time.Now().UTC().Format("20060102T150405Z"))
	return res, err
}
