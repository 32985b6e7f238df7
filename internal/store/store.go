// Package store keeps the master's desired state: templates, sandboxes with
// their tier, last activity, gateway ports and addresses. SQLite
// (modernc.org/sqlite, pure Go, WAL journal) is the embedded default;
// PostgreSQL (pgx) is for a master whose state must outlive its machine
// (issue 9), with the same schema and the same tests. The store is the only
// thing that writes desired state; every write is one transaction, so a
// daemon killed at any moment leaves either the old or the new row, never
// half of one.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"sandstorm/api"
	"sandstorm/internal/errdefs"
)

// EnrolRows are the fleet's enrolment rows: one-time join tokens and the
// nodes whose certificates are revoked. Only the master's enrolment
// (internal/enrol, through the fleet) writes them.
type EnrolRows struct{ s *Store }

// Enrol is the fleet enrolment's view of the store.
func (s *Store) Enrol() EnrolRows { return EnrolRows{s} }

// Errors are errdefs kinds: errdefs.ErrNotFound when no row matches, errdefs.ErrExists
// when a name or ID is taken, ErrConflict when something still used
// cannot be removed.

// Store is a handle on the state database. It is safe for concurrent use.
type Store struct {
	db *sql.DB
	d  *dialect
}

// q is query in the store's SQL dialect.
func (s *Store) q(query string) string { return s.d.rebind(query) }

// writeCtx is the context a write outside a transaction runs under. On
// SQLite it is ctx without its cancel: modernc.org/sqlite answers
// ctx.Err() for a statement whose context ended while it ran, even when
// the statement had done its work (stmt.exec's deferred check), so a
// caller that gave up mid-insert was told "canceled" for a row that was
// there. A node's create then left its sandbox recorded detached/hot and
// never started (CI: TestFailoverMidCreate, its master killed mid-create).
// A local statement is short (bounded by busy_timeout), so it is let
// finish, and its answer is what happened. PostgreSQL keeps the cancel:
// it is across a network, and its writes that matter run in
// transactions, which a cancel rolls back whole.
func (d *dialect) writeCtx(ctx context.Context) context.Context {
	if d == pgDialect {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// Template is a template row.
type Template struct {
	Name   string
	Rootfs string // absolute path of the rootfs directory on the node
	Owned  bool   // the rootfs was extracted by us (delete it with the template)
	// Digest identifies the rootfs across the fleet (rootfs.Digest): a
	// node fetches it by this and caches it.
	Digest string
	// Image is the image it was made from, pinned by digest ("" if none).
	Image string
	// Layers are its image's layers by tree digest (api.Template.Layers).
	Layers    []string
	Process   api.Process
	Ports     []int
	MemoryMiB int
	// Principal is the default principal of its sandboxes ("" = the
	// sandbox's name).
	Principal string
	// Warm, when set, makes its sandboxes start from a warm image.
	Warm *api.Warm
	// Serves are the mesh services its sandboxes serve (api.Serve).
	Serves []api.Serve
	// Team is the team it belongs to ("": the operator's, which every
	// team may use); another team's is not found (internal/sandboxes).
	Team      string
	CreatedAt time.Time
}

// Sandbox is a sandbox row: desired state plus what the node last did.
type Sandbox struct {
	ID       string
	Name     string
	Template string
	Node     string
	Backend  string
	// Tier is the tier the sandbox is in, as last committed.
	Tier api.Tier
	// Transition is the tier a transition in progress heads to ("" when
	// none). Written before the operation starts and cleared with Tier, so
	// a restart finds half-done transitions.
	Transition api.Tier
	// Slot indexes the sandbox's /30 in the node's subnet; it fixes the
	// sandbox's addresses for life (stable across snapshot/restore).
	Slot int
	// HostPorts maps template port → gateway port on the node.
	HostPorts    map[int]int
	LastActive   time.Time
	CreatedAt    time.Time
	LastWakeMs   float64
	LastWakeFrom api.Tier
	Note         string
	// Principal is who the sandbox is to its boundary and the mesh.
	Principal string
	// MemoryMiB is the sandbox's own memory limit, overriding its
	// template's (0: the template's, or the node's default).
	MemoryMiB int
	// Generation is the master's number for the placement that made it
	// (0: made by no master that numbers them): a node fences what its
	// master no longer places there by it (node.Fence, issue 14).
	Generation int64
	// Egress is its own egress rules (nil: none), given at create.
	Egress *api.Egress
	// Idle overrides the node's idle timers for it (nil: the node's).
	Idle *api.IdleTimers
	// LeftBehind: its master did not place it here (a create cut short,
	// a move). It never runs again: stopped, principal cleared, kept
	// detached for the data in its volume until someone deletes it.
	LeftBehind bool
	// Runsc is the runsc build its memory belongs to (a
	// runtimes.Key): the one it runs on while hot or frozen, the one that
	// wrote its snapshot. "" when it has no memory (detached), and in rows
	// from before builds were kept.
	Runsc string
	// MoveOut, when not 0, is the generation of a move taking it to
	// another node (move.go): until the master settles that move it is
	// neither woken nor served, nor tiered.
	MoveOut int64
	// MoveIn: it arrived by a move its master has not yet settled
	// (move.go): it has no boundary or gateway until the master
	// confirms it, and is dropped if it does not.
	MoveIn bool
	// Rev counts the row's writes (1 when created): what the node says
	// of the sandbox carries it, so the master keeps the newest of two
	// accounts that reach it out of order (PutReported).
	Rev int64
}

// schema is the store's tables, for both databases: written in types both
// take with the same meaning — BIGINT is a 64-bit integer in PostgreSQL
// and has INTEGER affinity in SQLite (whose integers are 64-bit anyway);
// DOUBLE PRECISION is a 64-bit float in both (PostgreSQL's REAL is 32-bit)
// — so there is one schema, not one per dialect (issue 15). Times are Unix
// milliseconds. A database made by an older version gets the columns added
// since from migrations (CREATE TABLE IF NOT EXISTS leaves its tables as
// they were).
const schema = `
CREATE TABLE IF NOT EXISTS templates (
	name       TEXT PRIMARY KEY,
	rootfs     TEXT NOT NULL,
	owned      INTEGER NOT NULL DEFAULT 0,
	process    TEXT NOT NULL,
	ports      TEXT NOT NULL,
	memory_mib INTEGER NOT NULL DEFAULT 0,
	created_at BIGINT NOT NULL,
	principal  TEXT NOT NULL DEFAULT '',
	warm       TEXT NOT NULL DEFAULT '',
	serves     TEXT NOT NULL DEFAULT '',
	digest     TEXT NOT NULL DEFAULT '',
	image      TEXT NOT NULL DEFAULT '',
	team       TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS sandboxes (
	id             TEXT PRIMARY KEY,
	name           TEXT NOT NULL UNIQUE,
	template       TEXT NOT NULL REFERENCES templates(name),
	node           TEXT NOT NULL,
	backend        TEXT NOT NULL,
	tier           TEXT NOT NULL,
	transition     TEXT NOT NULL DEFAULT '',
	slot           INTEGER NOT NULL,
	host_ports     TEXT NOT NULL,
	last_active    BIGINT NOT NULL,
	created_at     BIGINT NOT NULL,
	last_wake_ms   DOUBLE PRECISION NOT NULL DEFAULT 0,
	last_wake_from TEXT NOT NULL DEFAULT '',
	note           TEXT NOT NULL DEFAULT '',
	principal      TEXT NOT NULL DEFAULT '',
	memory_mib     INTEGER NOT NULL DEFAULT 0,
	generation     BIGINT NOT NULL DEFAULT 0,
	left_behind    INTEGER NOT NULL DEFAULT 0,
	idle           TEXT NOT NULL DEFAULT '',
	egress         TEXT NOT NULL DEFAULT '',
	runsc          TEXT NOT NULL DEFAULT '',
	move_out       BIGINT NOT NULL DEFAULT 0,
	move_in        INTEGER NOT NULL DEFAULT 0,
	rev            BIGINT NOT NULL DEFAULT 0,
	UNIQUE (node, slot)
);
CREATE TABLE IF NOT EXISTS nodes (
	name      TEXT PRIMARY KEY,
	address   TEXT NOT NULL UNIQUE,
	paired_at BIGINT NOT NULL,
	draining  INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS join_tokens (
	hash       TEXT PRIMARY KEY,
	expires_at BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS placements (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL UNIQUE,
	node       TEXT NOT NULL,
	template   TEXT NOT NULL DEFAULT '',
	principal  TEXT NOT NULL DEFAULT '',
	memory_mib INTEGER NOT NULL DEFAULT 0,
	generation BIGINT NOT NULL DEFAULT 0,
	state      TEXT NOT NULL DEFAULT '',
	move_node  TEXT NOT NULL DEFAULT '',
	move_gen   BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS revocations (
	node TEXT PRIMARY KEY,
	at   BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS reported (
	id   TEXT PRIMARY KEY,
	node TEXT NOT NULL,
	name TEXT NOT NULL,
	body TEXT NOT NULL,
	rev  BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS reported_node ON reported(node);
CREATE INDEX IF NOT EXISTS reported_name ON reported(name);
CREATE TABLE IF NOT EXISTS counters (
	name  TEXT PRIMARY KEY,
	value BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
	id         TEXT PRIMARY KEY,
	team       TEXT NOT NULL,
	hash       TEXT NOT NULL UNIQUE,
	last4      TEXT NOT NULL,
	created_at BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS sandbox_meta (
	id         TEXT PRIMARY KEY,
	team       TEXT NOT NULL DEFAULT '',
	metadata   TEXT NOT NULL DEFAULT '{}',
	env        TEXT NOT NULL DEFAULT '{}',
	started_at BIGINT NOT NULL,
	end_at     BIGINT NOT NULL DEFAULT 0,
	auto_pause INTEGER NOT NULL DEFAULT 0,
	paused     INTEGER NOT NULL DEFAULT 0,
	private_traffic INTEGER NOT NULL DEFAULT 0,
	mask_host  TEXT NOT NULL DEFAULT '',
	auto_resume INTEGER NOT NULL DEFAULT 0,
	snapshot_of TEXT NOT NULL DEFAULT '',
	snapshot_name TEXT NOT NULL DEFAULT '',
	pause_drops_memory INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS sandbox_meta_team ON sandbox_meta(team);
CREATE TABLE IF NOT EXISTS e2b_templates (
	id         TEXT PRIMARY KEY,
	team       TEXT NOT NULL,
	alias      TEXT NOT NULL,
	created_at BIGINT NOT NULL,
	UNIQUE (team, alias)
);
CREATE TABLE IF NOT EXISTS e2b_tags (
	template_id TEXT NOT NULL,
	tag         TEXT NOT NULL,
	build_id    TEXT NOT NULL,
	template    TEXT NOT NULL,
	created_at  BIGINT NOT NULL,
	PRIMARY KEY (template_id, tag)
);
CREATE TABLE IF NOT EXISTS mesh_tokens (
	hash       TEXT PRIMARY KEY,
	max_uses   INTEGER NOT NULL,
	uses       INTEGER NOT NULL DEFAULT 0,
	expires_at BIGINT NOT NULL,
	created_at BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS mesh_members (
	name        TEXT PRIMARY KEY,
	public_key  TEXT NOT NULL UNIQUE,
	enrolled_at BIGINT NOT NULL,
	revoked_at  BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS mesh_id_tokens (
	hash       TEXT PRIMARY KEY,
	expires_at BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS team_secrets (
	team       TEXT NOT NULL,
	name       TEXT NOT NULL,
	sealed     TEXT NOT NULL,
	hosts      TEXT NOT NULL,
	created_at BIGINT NOT NULL,
	PRIMARY KEY (team, name)
);
CREATE TABLE IF NOT EXISTS mesh_policy (
	version  BIGINT PRIMARY KEY,
	document TEXT NOT NULL,
	set_at   BIGINT NOT NULL
);
`

// migrations add columns that later versions introduced; each is applied
// only if the column is missing, so old databases open and keep their rows.
var migrations = []struct{ table, column, ddl string }{
	{"templates", "principal", `ALTER TABLE templates ADD COLUMN principal TEXT NOT NULL DEFAULT ''`},
	{"sandboxes", "principal", `ALTER TABLE sandboxes ADD COLUMN principal TEXT NOT NULL DEFAULT ''`},
	{"sandboxes", "memory_mib", `ALTER TABLE sandboxes ADD COLUMN memory_mib INTEGER NOT NULL DEFAULT 0`},
	{"templates", "warm", `ALTER TABLE templates ADD COLUMN warm TEXT NOT NULL DEFAULT ''`},
	{"templates", "serves", `ALTER TABLE templates ADD COLUMN serves TEXT NOT NULL DEFAULT ''`},
	{"templates", "digest", `ALTER TABLE templates ADD COLUMN digest TEXT NOT NULL DEFAULT ''`},
	{"templates", "image", `ALTER TABLE templates ADD COLUMN image TEXT NOT NULL DEFAULT ''`},
	{"templates", "layers", `ALTER TABLE templates ADD COLUMN layers TEXT NOT NULL DEFAULT ''`}, // layers.go
	// Issue 14: placements numbered and stated; a node's sandbox carries
	// the number it was placed under.
	{"sandboxes", "generation", `ALTER TABLE sandboxes ADD COLUMN generation BIGINT NOT NULL DEFAULT 0`},
	{"sandboxes", "left_behind", `ALTER TABLE sandboxes ADD COLUMN left_behind INTEGER NOT NULL DEFAULT 0`},
	{"sandboxes", "idle", `ALTER TABLE sandboxes ADD COLUMN idle TEXT NOT NULL DEFAULT ''`},
	{"sandboxes", "egress", `ALTER TABLE sandboxes ADD COLUMN egress TEXT NOT NULL DEFAULT ''`},
	// Issue 18: the runsc build each sandbox's memory belongs to.
	{"sandboxes", "runsc", `ALTER TABLE sandboxes ADD COLUMN runsc TEXT NOT NULL DEFAULT ''`},
	{"placements", "generation", `ALTER TABLE placements ADD COLUMN generation BIGINT NOT NULL DEFAULT 0`},
	{"placements", "state", `ALTER TABLE placements ADD COLUMN state TEXT NOT NULL DEFAULT ''`},
	// Issue 18: a sandbox moved with its memory (move.go); a node drained.
	{"sandboxes", "move_out", `ALTER TABLE sandboxes ADD COLUMN move_out BIGINT NOT NULL DEFAULT 0`},
	{"sandboxes", "move_in", `ALTER TABLE sandboxes ADD COLUMN move_in INTEGER NOT NULL DEFAULT 0`},
	{"placements", "move_node", `ALTER TABLE placements ADD COLUMN move_node TEXT NOT NULL DEFAULT ''`},
	{"placements", "move_gen", `ALTER TABLE placements ADD COLUMN move_gen BIGINT NOT NULL DEFAULT 0`},
	{"nodes", "draining", `ALTER TABLE nodes ADD COLUMN draining INTEGER NOT NULL DEFAULT 0`},
	// A node's account of a sandbox is ordered by the row's writes: an
	// older report that reaches the master after a newer answer does not
	// undo it (fleet.record).
	{"sandboxes", "rev", `ALTER TABLE sandboxes ADD COLUMN rev BIGINT NOT NULL DEFAULT 0`},
	{"reported", "rev", `ALTER TABLE reported ADD COLUMN rev BIGINT NOT NULL DEFAULT 0`},
	// Issue 31: a sandbox whose ports answer only its traffic token.
	{"sandbox_meta", "private_traffic", `ALTER TABLE sandbox_meta ADD COLUMN private_traffic INTEGER NOT NULL DEFAULT 0`},
	{"sandbox_meta", "mask_host", `ALTER TABLE sandbox_meta ADD COLUMN mask_host TEXT NOT NULL DEFAULT ''`},
	{"sandbox_meta", "auto_resume", `ALTER TABLE sandbox_meta ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0`},
	{"sandbox_meta", "snapshot_of", `ALTER TABLE sandbox_meta ADD COLUMN snapshot_of TEXT NOT NULL DEFAULT ''`},
	{"sandbox_meta", "snapshot_name", `ALTER TABLE sandbox_meta ADD COLUMN snapshot_name TEXT NOT NULL DEFAULT ''`},
	{"sandbox_meta", "pause_drops_memory", `ALTER TABLE sandbox_meta ADD COLUMN pause_drops_memory INTEGER NOT NULL DEFAULT 0`},
	// Issue 32: a template a team built through /e2b is its own.
	{"templates", "team", `ALTER TABLE templates ADD COLUMN team TEXT NOT NULL DEFAULT ''`},
	// Issue 33: a secret that may be replaced in request bodies too.
	{"team_secrets", "body", `ALTER TABLE team_secrets ADD COLUMN body INTEGER NOT NULL DEFAULT 0`},
}

// execer is a *sql.DB or a *sql.Tx.
type execer interface {
	QueryRow(query string, args ...any) *sql.Row
	Exec(query string, args ...any) (sql.Result, error)
}

func migrate(db execer, d *dialect) error {
	for _, m := range migrations {
		var n int
		if err := db.QueryRow(d.rebind(d.hasColumn), m.table, m.column).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			if _, err := db.Exec(m.ddl); err != nil {
				return err
			}
		}
	}
	return nil
}

// Open opens (creating if needed) the store at where: a PostgreSQL URL
// (postgres://… or postgresql://…, see OpenPostgres), else the path of a
// SQLite database.
func Open(where string) (*Store, error) {
	if IsPostgres(where) {
		return OpenPostgres(context.Background(), where)
	}
	return OpenSQLite(where)
}

// OpenIn opens where, or with where empty the SQLite database
// state.db in dataDir: what a daemon's --store flag means.
func OpenIn(dataDir, where string) (*Store, error) {
	if where == "" {
		where = filepath.Join(dataDir, "state.db")
	}
	return Open(where)
}

// IsPostgres reports whether where names a PostgreSQL database.
func IsPostgres(where string) bool {
	return strings.HasPrefix(where, "postgres://") || strings.HasPrefix(where, "postgresql://")
}

// OpenSQLite opens (creating if needed) the database at path, in WAL mode
// with a busy timeout, and applies the schema.
func OpenSQLite(path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	// One writer at a time is what SQLite allows anyway; one connection
	// avoids SQLITE_BUSY between our own goroutines.
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: apply schema to %s: %w", path, err)
	}
	if err := migrate(db, sqliteDialect); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: migrate %s: %w", path, err)
	}
	return &Store{db: db, d: sqliteDialect}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func ms(t time.Time) int64 { return t.UnixMilli() }

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func fromMs(v int64) time.Time { return time.UnixMilli(v).UTC() }

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain data types are marshalled here
	}
	return string(b)
}

// PutTemplate inserts t; errdefs.ErrExists if the name is taken.
func (s *Store) PutTemplate(ctx context.Context, t Template) error {
	if t.CreatedAt.IsZero() {
		t.CreatedAt = time.Now()
	}
	warm := ""
	if t.Warm != nil {
		warm = mustJSON(t.Warm)
	}
	serves := ""
	if len(t.Serves) > 0 {
		serves = mustJSON(t.Serves)
	}
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO templates(name, rootfs, owned, process, ports, memory_mib, created_at, principal, warm, digest, serves, image, team) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)`),
		t.Name, t.Rootfs, boolInt(t.Owned), mustJSON(t.Process), mustJSON(t.Ports), t.MemoryMiB, ms(t.CreatedAt), t.Principal, warm, t.Digest, serves, t.Image, t.Team)
	if isConstraint(err) {
		return fmt.Errorf("template %q: %w", t.Name, errdefs.ErrExists)
	}
	if err == nil {
		if err = setTemplateLayers(ctx, s, t.Name, t.Layers); err != nil {
			s.db.ExecContext(context.WithoutCancel(ctx), s.q(`DELETE FROM templates WHERE name=?`), t.Name)
		}
	}
	return err
}

// GetTemplate returns the template called name, or errdefs.ErrNotFound.
func (s *Store) GetTemplate(ctx context.Context, name string) (Template, error) {
	row := s.db.QueryRowContext(ctx, s.q(`SELECT name, rootfs, owned, process, ports, memory_mib, created_at, principal, warm, digest, serves, image, team FROM templates WHERE name=?`), name)
	t, err := scanTemplate(row)
	if errors.Is(err, sql.ErrNoRows) {
		return t, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	if err == nil {
		err = templateLayers(ctx, s, []*Template{&t})
	}
	return t, err
}

// SetTemplateDigest records the digest of template name's rootfs (for a
// template registered before templates had digests).
func (s *Store) SetTemplateDigest(ctx context.Context, name, digest string) error {
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`UPDATE templates SET digest=? WHERE name=?`), digest, name)
	return err
}

// ListTemplates returns every template, by name.
func (s *Store) ListTemplates(ctx context.Context) ([]Template, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT name, rootfs, owned, process, ports, memory_mib, created_at, principal, warm, digest, serves, image, team FROM templates ORDER BY name`))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Template
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows.Close()
	return out, templateLayers(ctx, s, ptrs(out))
}

// DeleteTemplate removes a template; errdefs.ErrNotFound if absent, errdefs.ErrExists
// (wrapped with a message) while sandboxes still use it.
func (s *Store) DeleteTemplate(ctx context.Context, name string) error {
	var n int
	// Its sandboxes here and, on a master, those it placed on its nodes
	// (one it placed on the node in its own process is both, counted once).
	if err := s.db.QueryRowContext(ctx, s.q(`SELECT count(*) FROM (SELECT id FROM sandboxes WHERE template=? UNION SELECT id FROM placements WHERE template=?) AS used`), name, name).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return errdefs.New(errdefs.ErrConflict, "template %q is in use by %d sandbox(es); delete them first (sandboxes: sandstormd sandbox ls)", name, n)
	}
	res, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`DELETE FROM templates WHERE name=?`), name)
	if err != nil {
		return err
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	return nil
}

type scanner interface{ Scan(...any) error }

func scanTemplate(r scanner) (Template, error) {
	var t Template
	var proc, ports, warm, serves string
	var created int64
	if err := r.Scan(&t.Name, &t.Rootfs, &t.Owned, &proc, &ports, &t.MemoryMiB, &created, &t.Principal, &warm, &t.Digest, &serves, &t.Image, &t.Team); err != nil {
		return t, err
	}
	if serves != "" {
		if err := json.Unmarshal([]byte(serves), &t.Serves); err != nil {
			return t, fmt.Errorf("template %q: corrupt serves: %w", t.Name, err)
		}
	}
	if warm != "" {
		t.Warm = new(api.Warm)
		if err := json.Unmarshal([]byte(warm), t.Warm); err != nil {
			return t, fmt.Errorf("template %q: corrupt warm: %w", t.Name, err)
		}
	}
	t.CreatedAt = fromMs(created)
	if err := json.Unmarshal([]byte(proc), &t.Process); err != nil {
		return t, fmt.Errorf("template %q: corrupt process: %w", t.Name, err)
	}
	if err := json.Unmarshal([]byte(ports), &t.Ports); err != nil {
		return t, fmt.Errorf("template %q: corrupt ports: %w", t.Name, err)
	}
	return t, nil
}

const sandboxCols = `id, name, template, node, backend, tier, transition, slot, host_ports, last_active, created_at, last_wake_ms, last_wake_from, note, principal, memory_mib, generation, left_behind, idle, runsc, move_out, move_in, rev, egress`

// CreateSandbox inserts sb; errdefs.ErrExists if its ID, name or slot is taken;
// errdefs.ErrNotFound if its template does not exist.
func (s *Store) CreateSandbox(ctx context.Context, sb Sandbox) error {
	sb.Rev = max(sb.Rev, 1)
	if _, err := s.GetTemplate(ctx, sb.Template); err != nil {
		return err
	}
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO sandboxes(`+sandboxCols+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`), sandboxArgs(sb)...)
	if isConstraint(err) {
		return fmt.Errorf("sandbox %q: %w", sb.Name, errdefs.ErrExists)
	}
	return err
}

func sandboxArgs(sb Sandbox) []any {
	return []any{sb.ID, sb.Name, sb.Template, sb.Node, sb.Backend, string(sb.Tier), string(sb.Transition), sb.Slot,
		mustJSON(sb.HostPorts), ms(sb.LastActive), ms(sb.CreatedAt), sb.LastWakeMs, string(sb.LastWakeFrom), sb.Note, sb.Principal, sb.MemoryMiB,
		sb.Generation, boolInt(sb.LeftBehind), idleText(sb.Idle), sb.Runsc, sb.MoveOut, boolInt(sb.MoveIn), sb.Rev, egressText(sb.Egress)}
}

func egressText(e *api.Egress) string {
	if e == nil {
		return ""
	}
	return mustJSON(e)
}

func idleText(t *api.IdleTimers) string {
	if t == nil {
		return ""
	}
	return mustJSON(t)
}

// GetSandbox returns the sandbox whose ID or name is ref, or errdefs.ErrNotFound.
func (s *Store) GetSandbox(ctx context.Context, ref string) (Sandbox, error) {
	row := s.db.QueryRowContext(ctx, s.q(`SELECT `+sandboxCols+` FROM sandboxes WHERE id=? OR name=? LIMIT 1`), ref, ref)
	sb, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return sb, fmt.Errorf("sandbox %q: %w", ref, errdefs.ErrNotFound)
	}
	return sb, err
}

// ListSandboxes returns every sandbox of node ("" for all nodes), oldest first.
func (s *Store) ListSandboxes(ctx context.Context, node string) ([]Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT `+sandboxCols+` FROM sandboxes WHERE ?='' OR node=? ORDER BY created_at, id`), node, node)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// UpdateSandbox reads the sandbox id, applies fn and writes the result, in
// one transaction. fn must not change the ID. errdefs.ErrNotFound if absent.
func (s *Store) UpdateSandbox(ctx context.Context, id string, fn func(*Sandbox) error) (Sandbox, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Sandbox{}, err
	}
	defer tx.Rollback()
	sb, err := scanSandbox(tx.QueryRowContext(ctx, s.q(`SELECT `+sandboxCols+` FROM sandboxes WHERE id=?`+s.d.forUpdate), id))
	if errors.Is(err, sql.ErrNoRows) {
		return sb, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return sb, err
	}
	if err := fn(&sb); err != nil {
		return sb, err
	}
	sb.ID = id
	sb.Rev++
	args := sandboxArgs(sb)
	_, err = tx.ExecContext(ctx, s.q(`UPDATE sandboxes SET id=?, name=?, template=?, node=?, backend=?, tier=?, transition=?, slot=?, host_ports=?, last_active=?, created_at=?, last_wake_ms=?, last_wake_from=?, note=?, principal=?, memory_mib=?, generation=?, left_behind=?, idle=?, runsc=?, move_out=?, move_in=?, rev=?, egress=? WHERE id=?`),
		append(args, id)...)
	if err != nil {
		return sb, err
	}
	return sb, tx.Commit()
}

// DeleteSandbox removes the row; errdefs.ErrNotFound if absent.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`DELETE FROM sandboxes WHERE id=?`), id)
	if err != nil {
		return err
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

// UsedSlots returns the address slots and gateway ports taken on node.
func (s *Store) UsedSlots(ctx context.Context, node string) (slots map[int]bool, ports map[int]bool, err error) {
	all, err := s.ListSandboxes(ctx, node)
	if err != nil {
		return nil, nil, err
	}
	slots, ports = map[int]bool{}, map[int]bool{}
	for _, sb := range all {
		slots[sb.Slot] = true
		for _, hp := range sb.HostPorts {
			ports[hp] = true
		}
	}
	return slots, ports, nil
}

func scanSandbox(r scanner) (Sandbox, error) {
	var sb Sandbox
	var tier, trans, hostPorts, wakeFrom string
	var last, created int64
	var left, moveIn int
	var idle, egress string
	err := r.Scan(&sb.ID, &sb.Name, &sb.Template, &sb.Node, &sb.Backend, &tier, &trans, &sb.Slot, &hostPorts, &last, &created, &sb.LastWakeMs, &wakeFrom, &sb.Note, &sb.Principal, &sb.MemoryMiB, &sb.Generation, &left, &idle, &sb.Runsc, &sb.MoveOut, &moveIn, &sb.Rev, &egress)
	if err != nil {
		return sb, err
	}
	if egress != "" {
		sb.Egress = &api.Egress{}
		if err := json.Unmarshal([]byte(egress), sb.Egress); err != nil {
			return sb, fmt.Errorf("sandbox %q: corrupt egress: %w", sb.ID, err)
		}
	}
	if idle != "" {
		sb.Idle = &api.IdleTimers{}
		if err := json.Unmarshal([]byte(idle), sb.Idle); err != nil {
			return sb, fmt.Errorf("sandbox %q: corrupt idle: %w", sb.ID, err)
		}
	}
	sb.LeftBehind = left != 0
	sb.MoveIn = moveIn != 0
	sb.Tier, sb.Transition, sb.LastWakeFrom = api.Tier(tier), api.Tier(trans), api.Tier(wakeFrom)
	sb.LastActive, sb.CreatedAt = fromMs(last), fromMs(created)
	if err := json.Unmarshal([]byte(hostPorts), &sb.HostPorts); err != nil {
		return sb, fmt.Errorf("sandbox %q: corrupt host_ports: %w", sb.ID, err)
	}
	return sb, nil
}

// isConstraint reports whether err is a constraint violation (UNIQUE or
// PRIMARY KEY) in SQLite or PostgreSQL, which callers map to errdefs.ErrExists.
func isConstraint(err error) bool {
	if err == nil {
		return false
	}
	if isPgConstraint(err) {
		return true
	}
	var coder interface{ Code() int }
	if errors.As(err, &coder) {
		// SQLITE_CONSTRAINT is 19; extended codes keep it in the low byte.
		return coder.Code()&0xff == 19
	}
	return false
}

// Node is a node the master paired with (a node in the master's own
// process has no row).
type Node struct {
	Name     string
	Address  string // host:port of its seam (nodeapi/remote.Server)
	PairedAt time.Time
	// Draining: it takes no new sandboxes (its own are being moved off:
	// node drain).
	Draining bool
}

// PutNode records a paired node; errdefs.ErrExists if its name or address is
// taken.
func (s *Store) PutNode(ctx context.Context, n Node) error {
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO nodes(name, address, paired_at) VALUES(?,?,?)`), n.Name, n.Address, ms(n.PairedAt))
	if isConstraint(err) {
		return fmt.Errorf("node %q at %s: %w", n.Name, n.Address, errdefs.ErrExists)
	}
	return err
}

// ListNodes returns the paired nodes, by name.
func (s *Store) ListNodes(ctx context.Context) ([]Node, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT name, address, paired_at, draining FROM nodes ORDER BY name`))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Node
	for rows.Next() {
		var n Node
		var at int64
		var draining int
		if err := rows.Scan(&n.Name, &n.Address, &at, &draining); err != nil {
			return nil, err
		}
		n.PairedAt, n.Draining = fromMs(at), draining != 0
		out = append(out, n)
	}
	return out, rows.Err()
}

// DeleteNode forgets node name; errdefs.ErrNotFound if absent.
func (s *Store) DeleteNode(ctx context.Context, name string) error {
	res, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`DELETE FROM nodes WHERE name=?`), name)
	if err != nil {
		return err
	}
	if _, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`DELETE FROM reported WHERE node=?`), name); err != nil {
		return err
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return fmt.Errorf("node %q: %w", name, errdefs.ErrNotFound)
	}
	return nil
}

// Placement says which node a sandbox on a paired node is on (a sandbox
// of the node in the master's process is in sandboxes instead).
type Placement struct {
	ID, Name, Node string
	// What it was created from: enough to create it again elsewhere
	// (move) when its node is lost.
	Template, Principal string
	MemoryMiB           int
	// Generation numbers the placement (NextGeneration): the node stores
	// it with the sandbox, and fences by it (issue 14).
	Generation int64
	// State is "" (placed: the node made it), PlacementCreating (an
	// attempt: ID and Name may be PendingID until the node answers) or
	// PlacementDeleting (desired gone; the node has not said it is),
	// PlacementMoving or PlacementMoved (move.go).
	State string
	// MoveNode and MoveGen are the other end of a move in progress: the
	// node it is going to and the generation it will have there
	// (PlacementMoving), or the node it left and the generation it had
	// there (PlacementMoved).
	MoveNode string
	MoveGen  int64
}

// Placement states.
const (
	PlacementCreating = "creating"
	PlacementDeleting = "deleting"
)

// PendingID is what an attempt of generation gen is called until its node
// says which sandbox it made.
func PendingID(gen int64) string { return fmt.Sprintf("pending-%d", gen) }

const placementCols = `id, name, node, template, principal, memory_mib, generation, state, move_node, move_gen`

// PutPlacement records where a sandbox went (or an attempt to put it
// there); errdefs.ErrExists if its name is taken.
func (s *Store) PutPlacement(ctx context.Context, p Placement) error {
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO placements(`+placementCols+`) VALUES(?,?,?,?,?,?,?,?,?,?)`), p.ID, p.Name, p.Node, p.Template, p.Principal, p.MemoryMiB, p.Generation, p.State, p.MoveNode, p.MoveGen)
	if isConstraint(err) {
		return fmt.Errorf("sandbox %q: %w", p.Name, errdefs.ErrExists)
	}
	return err
}

// GetPlacement finds the placement of the sandbox whose ID or name is ref.
func (s *Store) GetPlacement(ctx context.Context, ref string) (Placement, error) {
	ps, err := s.placements(ctx, `SELECT `+placementCols+` FROM placements WHERE id=? OR name=? LIMIT 1`, ref, ref)
	if err != nil {
		return Placement{}, err
	}
	if len(ps) == 0 {
		return Placement{}, fmt.Errorf("sandbox %q: %w", ref, errdefs.ErrNotFound)
	}
	return ps[0], nil
}

// DeletePlacement forgets sandbox id's placement.
func (s *Store) DeletePlacement(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`DELETE FROM placements WHERE id=?`), id)
	return err
}

// SetPlacementNode records which node attempt id is being tried on, before
// the master asks it.
func (s *Store) SetPlacementNode(ctx context.Context, id, node string) error {
	return s.setPlacement(ctx, `UPDATE placements SET node=? WHERE id=?`, node, id)
}

// SetPlacementState sets sandbox id's placement state.
func (s *Store) SetPlacementState(ctx context.Context, id, state string) error {
	return s.setPlacement(ctx, `UPDATE placements SET state=? WHERE id=?`, state, id)
}

func (s *Store) setPlacement(ctx context.Context, q string, args ...any) error {
	res, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(q), args...)
	if err != nil {
		return err
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return fmt.Errorf("placement %v: %w", args[len(args)-1], errdefs.ErrNotFound)
	}
	return nil
}

// ResolveAttempt replaces the attempt of generation gen with what its node
// made (ps, placed; none if it made nothing), in one transaction. Done
// twice, the second finds no attempt and changes nothing.
func (s *Store) ResolveAttempt(ctx context.Context, gen int64, ps []Placement) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, s.q(`DELETE FROM placements WHERE generation=? AND state=?`), gen, PlacementCreating)
	if err != nil {
		return err
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return nil
	}
	for _, p := range ps {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO placements(`+placementCols+`) VALUES(?,?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO NOTHING`),
			p.ID, p.Name, p.Node, p.Template, p.Principal, p.MemoryMiB, p.Generation, "", "", 0); err != nil {
			if isConstraint(err) {
				return fmt.Errorf("sandbox %q: %w", p.Name, errdefs.ErrExists)
			}
			return err
		}
	}
	return tx.Commit()
}

// CountPlacements is how many sandboxes the master placed on node.
func (s *Store) CountPlacements(ctx context.Context, node string) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, s.q(`SELECT count(*) FROM placements WHERE node=?`), node).Scan(&n)
	return n, err
}

// ListPlacements returns the placements on node, by name.
func (s *Store) ListPlacements(ctx context.Context, node string) ([]Placement, error) {
	return s.placements(ctx, `SELECT `+placementCols+` FROM placements WHERE node=? ORDER BY name`, node)
}

func (s *Store) placements(ctx context.Context, q string, args ...any) ([]Placement, error) {
	rows, err := s.db.QueryContext(ctx, s.q(q), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Placement
	for rows.Next() {
		var p Placement
		if err := rows.Scan(&p.ID, &p.Name, &p.Node, &p.Template, &p.Principal, &p.MemoryMiB, &p.Generation, &p.State, &p.MoveNode, &p.MoveGen); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// Counters: the master's placement generation (NextGeneration, shared by
// every master on one database) and a node's fence mark (node.Fence).

// NextGeneration takes the next placement generation: 1, 2, … in one
// statement, so two masters on one database never take the same.
func (s *Store) NextGeneration(ctx context.Context) (int64, error) {
	return s.bump(ctx, "generation", 1)
}

// Generation is the last generation taken (0: none yet).
func (s *Store) Generation(ctx context.Context) (int64, error) { return s.Counter(ctx, "generation") }

// Counter reads counter name (0 if never set).
func (s *Store) Counter(ctx context.Context, name string) (int64, error) {
	var v int64
	err := s.db.QueryRowContext(ctx, s.q(`SELECT value FROM counters WHERE name=?`), name).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return v, err
}

// RaiseCounter sets counter name to v if v is above it; it never goes down.
func (s *Store) RaiseCounter(ctx context.Context, name string, v int64) error {
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO counters(name, value) VALUES(?,?) ON CONFLICT(name) DO UPDATE SET value=excluded.value WHERE counters.value < excluded.value`), name, v)
	return err
}

func (s *Store) bump(ctx context.Context, name string, by int64) (int64, error) {
	var v int64
	err := s.db.QueryRowContext(s.d.writeCtx(ctx), s.q(`INSERT INTO counters(name, value) VALUES(?,?) ON CONFLICT(name) DO UPDATE SET value=counters.value+excluded.value RETURNING value`), name, by).Scan(&v)
	return v, err
}

// The reported table is the master's copy of its paired nodes' actual
// state: each sandbox as its node last reported it (nodeapi.Report, as
// the node commits a change), so that a GET or a list on the master reads
// here and never waits on a node (issue 9). It is a cache of the nodes'
// own stores, rebuilt from a node's full report each time it connects;
// the placements above are the master's desired state.

// ReplaceReported makes sbs the whole of what node has, in one
// transaction (a node's full report). A node reports only its own: an ID
// another node has reported is left to that node (a node cannot take
// over another's sandbox by naming its ID).
func (s *Store) ReplaceReported(ctx context.Context, node string, sbs []api.Sandbox) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM reported WHERE node=?`), node); err != nil {
		return err
	}
	for _, sb := range sbs {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO reported(id, node, name, body, rev) VALUES(?,?,?,?,?) ON CONFLICT(id) DO NOTHING`), sb.ID, node, sb.Name, mustJSON(sb), sb.Revision); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// PutReported records sandbox sb as node reported it; a sandbox another
// node reported stays that node's. An account older than the one kept
// (a lower Revision: a report read before a call's answer, arriving
// after it) is dropped; an equal one replaces it, for what the row does
// not count (its last activity).
func (s *Store) PutReported(ctx context.Context, node string, sb api.Sandbox) error {
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO reported(id, node, name, body, rev) VALUES(?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET name=excluded.name, body=excluded.body, rev=excluded.rev
		WHERE reported.node=excluded.node AND excluded.rev >= reported.rev`), sb.ID, node, sb.Name, mustJSON(sb), sb.Revision)
	return err
}

// MoveReported records sb as node reports it after a move to node has
// committed (fleet/move.go): the report of the copy it left, another
// node's, gives way; one node already made stays (it is as new, or newer).
func (s *Store) MoveReported(ctx context.Context, node string, sb api.Sandbox) error {
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO reported(id, node, name, body, rev) VALUES(?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET node=excluded.node, name=excluded.name, body=excluded.body, rev=excluded.rev WHERE reported.node<>excluded.node`), sb.ID, node, sb.Name, mustJSON(sb), sb.Revision)
	return err
}

// DeleteReported forgets sandbox id's report, if node reported it.
func (s *Store) DeleteReported(ctx context.Context, node, id string) error {
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`DELETE FROM reported WHERE id=? AND node=?`), id, node)
	return err
}

// Reported is one reported sandbox and its node.
type Reported struct {
	Node    string
	Sandbox api.Sandbox
}

// FindReported returns the reported sandboxes whose ID or name is ref
// (several share a name when a move left a copy behind).
func (s *Store) FindReported(ctx context.Context, ref string) ([]Reported, error) {
	return s.reported(ctx, `SELECT node, body FROM reported WHERE id=? OR name=? ORDER BY id`, ref, ref)
}

// ListReportedOf returns what node reported, by name.
func (s *Store) ListReportedOf(ctx context.Context, node string) ([]Reported, error) {
	return s.reported(ctx, `SELECT node, body FROM reported WHERE node=? ORDER BY name, id`, node)
}

// ListReported returns every reported sandbox, by name.
func (s *Store) ListReported(ctx context.Context) ([]Reported, error) {
	return s.reported(ctx, `SELECT node, body FROM reported ORDER BY name, id`)
}

func (s *Store) reported(ctx context.Context, q string, args ...any) ([]Reported, error) {
	rows, err := s.db.QueryContext(ctx, s.q(q), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Reported
	for rows.Next() {
		var r Reported
		var body string
		if err := rows.Scan(&r.Node, &body); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(body), &r.Sandbox); err != nil {
			return nil, fmt.Errorf("store: reported sandbox of %s: %w", r.Node, err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// ListUnsettled returns the placements that are attempts or deletes.
func (s *Store) ListUnsettled(ctx context.Context) ([]Placement, error) {
	return s.placements(ctx, `SELECT `+placementCols+` FROM placements WHERE state<>'' ORDER BY name`)
}

// ListAllPlacements returns every placement, by name.
func (s *Store) ListAllPlacements(ctx context.Context) ([]Placement, error) {
	return s.placements(ctx, `SELECT `+placementCols+` FROM placements ORDER BY name`)
}

// Revoke records that every certificate issued to node before at is
// revoked (it was forgotten then; fleet.Fleet checks).
func (v EnrolRows) Revoke(ctx context.Context, node string, at time.Time) error {
	s := v.s
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO revocations(node, at) VALUES(?,?) ON CONFLICT(node) DO UPDATE SET at=excluded.at`), node, ms(at))
	return err
}

// Revocations is when each revoked node's certificates were revoked.
func (v EnrolRows) Revocations(ctx context.Context) (map[string]time.Time, error) {
	s := v.s
	rows, err := s.db.QueryContext(ctx, `SELECT node, at FROM revocations`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var n string
		var at int64
		if err := rows.Scan(&n, &at); err != nil {
			return nil, err
		}
		out[n] = fromMs(at)
	}
	return out, rows.Err()
}

// PutJoinToken records a join token (by its hash) until expires.
func (v EnrolRows) PutJoinToken(ctx context.Context, hash string, expires time.Time) error {
	s := v.s
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO join_tokens(hash, expires_at) VALUES(?,?)`), hash, ms(expires))
	return err
}

// UseJoinToken consumes the join token with hash: true if it was there
// and not expired. A token is good once.
func (v EnrolRows) UseJoinToken(ctx context.Context, hash string, now time.Time) (bool, error) {
	s := v.s
	res, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`DELETE FROM join_tokens WHERE hash=? AND expires_at>?`), hash, ms(now))
	if err != nil {
		return false, err
	}
	k, _ := res.RowsAffected()
	s.db.ExecContext(s.d.writeCtx(ctx), s.q(`DELETE FROM join_tokens WHERE expires_at<=?`), ms(now))
	return k == 1, nil
}
