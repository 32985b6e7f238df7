package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Backup of a SQLite store (issue 18 item 5). The copy is SQLite's own
// VACUUM INTO (sqlite.org/lang_vacuum.html#vacuuminto): it reads the live
// database in one read transaction, so it is consistent as of one moment
// however many writes the running daemon makes meanwhile (in WAL mode a
// reader and the writer do not block each other), and the file it writes
// is a plain, compact database. A PostgreSQL store is pg_dump's.

// Summary is what a copy of the store holds.
type Summary struct {
	// Rows counts the rows of each table.
	Rows map[string]int64
	// Sandboxes are the IDs of every sandbox row (every node's).
	Sandboxes []string
	// Bytes is the file's size.
	Bytes int64
}

// String is a one-line account: the tables that say most first.
func (s Summary) String() string {
	var parts []string
	for _, t := range []string{"templates", "sandboxes", "nodes", "placements", "api_keys"} {
		parts = append(parts, fmt.Sprintf("%d %s", s.Rows[t], strings.ReplaceAll(t, "_", " ")))
	}
	return strings.Join(parts, ", ") + fmt.Sprintf(" (%d bytes)", s.Bytes)
}

// Backup writes a consistent copy of the SQLite database at src to dst,
// mode 0600 from its first byte (the store holds token and key hashes),
// whole or not at all: it is written beside dst and renamed over it once
// complete and synced. src may be in use by a running daemon. The copy is
// then opened and checked (Inspect).
func Backup(ctx context.Context, src, dst string) (Summary, error) {
	si, err := os.Stat(src)
	if err != nil {
		return Summary{}, fmt.Errorf("no store at %s: %w", src, err)
	}
	if di, err := os.Stat(dst); err == nil {
		if di.IsDir() {
			return Summary{}, fmt.Errorf("%s is a directory: name the file to write", dst)
		}
		if os.SameFile(si, di) {
			return Summary{}, fmt.Errorf("%s is the store itself", dst)
		}
	}
	if d := filepath.Dir(dst); d != "" {
		if di, err := os.Stat(d); err != nil || !di.IsDir() {
			return Summary{}, fmt.Errorf("no directory %s to write %s into: create it first (mkdir -p %s)", d, filepath.Base(dst), d)
		}
	}
	for _, side := range []string{"-wal", "-shm"} {
		if strings.HasSuffix(filepath.Clean(dst), filepath.Base(src)+side) {
			return Summary{}, fmt.Errorf("%s would replace the store's own %s file", dst, side)
		}
	}
	// No mode=ro: a read-only connection cannot read a WAL database whose
	// -shm it may not write. VACUUM INTO writes nothing to src.
	db, err := sql.Open("sqlite", "file:"+src+"?_pragma=busy_timeout(10000)")
	if err != nil {
		return Summary{}, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'sandboxes'`).Scan(&n); err != nil {
		return Summary{}, fmt.Errorf("%s: %w", src, err)
	}
	if n == 0 {
		return Summary{}, fmt.Errorf("%s is not a sandstormd store (no sandboxes table)", src)
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	tmp := dst + ".tmp-" + hex.EncodeToString(rnd[:])
	// VACUUM INTO takes an empty file as it is, mode included.
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return Summary{}, err
	}
	f.Close()
	defer os.Remove(tmp) // gone once renamed
	if _, err := db.ExecContext(ctx, `VACUUM INTO ?`, tmp); err != nil {
		return Summary{}, fmt.Errorf("copy %s: %w", src, err)
	}
	if err := syncFile(tmp); err != nil {
		return Summary{}, err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return Summary{}, err
	}
	syncFile(filepath.Dir(dst))
	return Inspect(ctx, dst)
}

// Inspect opens a copy of the store read-only and checks it: SQLite's
// integrity check, and the store's tables. It counts what it holds.
func Inspect(ctx context.Context, path string) (Summary, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Summary{}, err
	}
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		return Summary{}, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	var check string
	if err := db.QueryRowContext(ctx, `PRAGMA integrity_check`).Scan(&check); err != nil {
		return Summary{}, fmt.Errorf("%s is not a SQLite database: %w", path, err)
	}
	if check != "ok" {
		return Summary{}, fmt.Errorf("%s fails SQLite's integrity check: %s", path, check)
	}
	s := Summary{Rows: map[string]int64{}, Bytes: fi.Size()}
	rows, err := db.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`)
	if err != nil {
		return s, err
	}
	var tables []string
	for rows.Next() {
		var t string
		rows.Scan(&t)
		tables = append(tables, t)
	}
	rows.Close()
	for _, want := range []string{"templates", "sandboxes", "placements", "nodes"} {
		if !contains(tables, want) {
			return s, fmt.Errorf("%s is not a sandstormd store (no %s table)", path, want)
		}
	}
	for _, t := range tables {
		var n int64
		// t comes from sqlite_master of this file; quoted as an identifier.
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM "`+strings.ReplaceAll(t, `"`, `""`)+`"`).Scan(&n); err != nil {
			return s, err
		}
		s.Rows[t] = n
	}
	ids, err := db.QueryContext(ctx, `SELECT id FROM sandboxes`)
	if err != nil {
		return s, err
	}
	defer ids.Close()
	for ids.Next() {
		var id string
		if err := ids.Scan(&id); err != nil {
			return s, err
		}
		s.Sandboxes = append(s.Sandboxes, id)
	}
	sort.Strings(s.Sandboxes)
	return s, ids.Err()
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// syncFile fsyncs a file or directory.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return err
	}
	return nil
}

// InstallCopy puts the database copy src in place of the SQLite store at
// dst, which no process may have open (the caller holds the data dir's
// lock). The store's files as they were — the database and its -wal and
// -shm, which together are its state — are renamed aside with suffix
// aside (dst<aside>, dst<aside>-wal…), never deleted; it returns that
// path ("" when there was no store). The copy is written beside dst
// (0600), synced and renamed into place.
func InstallCopy(src, dst, aside string) (string, error) {
	tmp := dst + ".restore-tmp"
	if err := copyFile(src, tmp); err != nil {
		os.Remove(tmp)
		return "", err
	}
	kept := ""
	if _, err := os.Stat(dst); err == nil {
		kept = dst + aside
		// -wal and -shm first: a crash between the renames must not leave
		// the old database beside a -wal it would replay.
		for _, side := range []string{"-wal", "-shm", ""} {
			if err := os.Rename(dst+side, kept+side); err != nil && !errors.Is(err, os.ErrNotExist) {
				os.Remove(tmp)
				return "", fmt.Errorf("set the old store aside: %w", err)
			}
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		return kept, err
	}
	syncFile(filepath.Dir(dst))
	return kept, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if err := out.Chmod(0o600); err != nil {
		out.Close()
		return err
	}
	if _, err := out.ReadFrom(in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
