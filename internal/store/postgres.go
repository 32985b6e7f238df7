package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
)

// dialect is what differs between the store's two databases. The queries
// themselves are written once, with SQLite's "?" placeholders.
type dialect struct {
	name string
	// rebind turns "?" placeholders into the dialect's.
	rebind func(string) string
	// hasColumn counts the columns named $2 of table $1.
	hasColumn string
	// forUpdate ends a SELECT that a transaction is about to write back:
	// SQLite runs one writer at a time anyway (one connection); PostgreSQL
	// under READ COMMITTED would otherwise let two read-modify-writes of
	// one row interleave and lose one.
	forUpdate string
}

var sqliteDialect = &dialect{
	name:      "sqlite",
	rebind:    func(q string) string { return q },
	hasColumn: `SELECT count(*) FROM pragma_table_info(?) WHERE name=?`,
}

var pgDialect = &dialect{
	name:      "postgres",
	rebind:    dollarParams,
	hasColumn: `SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema() AND table_name=? AND column_name=?`,
	forUpdate: " FOR UPDATE",
}

// dollarParams numbers the "?" placeholders of q as PostgreSQL's $1, $2, …
// The store's queries have no "?" inside string literals.
func dollarParams(q string) string {
	var b strings.Builder
	k := 0
	for _, r := range q {
		if r == '?' {
			k++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(k))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// schemaLockKey is the advisory lock that serialises schema set-up: two
// masters starting at once on a new database would otherwise race in
// CREATE TABLE IF NOT EXISTS (PostgreSQL checks the catalog before it
// takes its own locks, and the loser fails on pg_type's unique index).
const schemaLockKey = 0x53414e44 // "SAND"

// OpenPostgres connects to the PostgreSQL database at url (a libpq URL,
// postgres://user:password@host:port/dbname?sslmode=…; a host of
// /var/run/postgresql in the query, host=…, is a Unix socket) and applies
// the schema. The database must exist; its tables are created if missing.
func OpenPostgres(ctx context.Context, url string) (*Store, error) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return nil, fmt.Errorf("store: %s: %w", RedactURL(url), err)
	}
	db.SetMaxOpenConns(8)
	db.SetConnMaxIdleTime(time.Minute)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: cannot reach PostgreSQL at %s: %w", RedactURL(url), err)
	}
	if err := pgApplySchema(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: apply schema at %s: %w", RedactURL(url), err)
	}
	return &Store{db: db, d: pgDialect}, nil
}

func pgApplySchema(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, schemaLockKey); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, schema); err != nil {
		return err
	}
	// A database made by an older version gets the columns added since
	// (CREATE TABLE IF NOT EXISTS leaves its tables as they were).
	if err := migrate(tx, pgDialect); err != nil {
		return err
	}
	return tx.Commit()
}

// Dialect names the store's database: "sqlite" or "postgres".
func (s *Store) Dialect() string { return s.d.name }

// DB is the store's database handle (for a lease on the same database).
func (s *Store) DB() *sql.DB { return s.db }

var passwordParam = regexp.MustCompile(`([?&]password=)[^&]*`)

// isPgConstraint reports whether err is PostgreSQL's unique_violation
// (SQLSTATE 23505; PostgreSQL Appendix A, class 23).
func isPgConstraint(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

// RedactURL is url with any password replaced, for messages and logs.
func RedactURL(url string) string {
	url = passwordParam.ReplaceAllString(url, "${1}xxxxx")
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok {
		return url
	}
	auth, host, ok := strings.Cut(rest, "@")
	if !ok {
		return url
	}
	if user, _, hasPw := strings.Cut(auth, ":"); hasPw {
		return scheme + "://" + user + ":xxxxx@" + host
	}
	return url
}
