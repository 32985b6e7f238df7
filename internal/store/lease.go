package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"
)

// Leadership of a store shared by several masters (issue 9: "two masters
// on one PostgreSQL: one leads, the other stands by and takes over within
// 10 s when the leader is killed").
//
// The lease is a session-level advisory lock (PostgreSQL §13.3.5) held on
// one connection of its own. PostgreSQL releases it the moment that
// session ends: a leader killed with -9 closes its socket, so a standby
// polling once a second gets the lock within about a second. A leader that
// is cut off (a partition, a hung process) stops pinging; the session's
// idle_session_timeout (PostgreSQL 14+) then ends it on the server side
// after leaseIdle, so the lock is freed even though no FIN ever arrives —
// and the cut-off leader, whose pings fail, steps down on its own
// (Lost). Both bounds keep a takeover well inside 10 s.

// leaderLockKey is the advisory lock key of the masters' lease.
const leaderLockKey = 0x53414e45 // "SANE"

const (
	leasePoll  = time.Second     // a standby's try, and a leader's ping
	leaseIdle  = 4 * time.Second // the server ends a leader session silent this long
	leasePingT = 2 * time.Second // a ping slower than this counts as failed
)

// ErrNoLease is returned by AcquireLease on a store that has no leases
// (SQLite: one machine, one master; its data dir lock is the guard).
var ErrNoLease = errors.New("this store has no leader lease (SQLite): a second master needs PostgreSQL")

// Lease is a held leadership. Lost is closed when it is no longer held;
// its holder must then stop acting as the leader.
type Lease struct {
	conn   *sql.Conn
	lost   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

// Leader is who holds (or last held) the lease.
type Leader struct {
	Holder string
	Since  time.Time
}

// AcquireLease waits until this process leads, then records holder as the
// leader and returns the lease. waiting is called once, with the current
// leader, if it has to wait. It returns ctx's error if ctx ends first.
func (s *Store) AcquireLease(ctx context.Context, holder string, waiting func(Leader)) (*Lease, error) {
	if s.d != pgDialect {
		return nil, ErrNoLease
	}
	if _, err := s.db.ExecContext(s.d.writeCtx(ctx), `CREATE TABLE IF NOT EXISTS leader (id INTEGER PRIMARY KEY, holder TEXT NOT NULL, since BIGINT NOT NULL)`); err != nil {
		return nil, err
	}
	told := false
	for {
		l, err := s.tryLease(ctx, holder)
		if err != nil {
			return nil, err
		}
		if l != nil {
			return l, nil
		}
		if !told && waiting != nil {
			told = true
			cur, _ := s.CurrentLeader(ctx)
			waiting(cur)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(leasePoll):
		}
	}
}

// tryLease takes the lock if it is free (nil, nil if it is not).
func (s *Store) tryLease(ctx context.Context, holder string) (*Lease, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	var got bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, leaderLockKey).Scan(&got); err != nil {
		conn.Close()
		return nil, err
	}
	if !got {
		conn.Close()
		return nil, nil
	}
	// From here the session is the lease: keep it from going idle longer
	// than leaseIdle without the server ending it.
	if _, err := conn.ExecContext(ctx, fmt.Sprintf(`SET idle_session_timeout = %d`, leaseIdle.Milliseconds())); err != nil {
		conn.Raw(func(any) error { return driverBad })
		conn.Close()
		return nil, fmt.Errorf("lease: %w", err)
	}
	if _, err := conn.ExecContext(ctx, `INSERT INTO leader(id, holder, since) VALUES(1, $1, $2) ON CONFLICT (id) DO UPDATE SET holder=EXCLUDED.holder, since=EXCLUDED.since`, holder, ms(time.Now())); err != nil {
		conn.Raw(func(any) error { return driverBad })
		conn.Close()
		return nil, fmt.Errorf("lease: record the leader: %w", err)
	}
	pctx, cancel := context.WithCancel(context.Background())
	l := &Lease{conn: conn, lost: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	go l.keep(pctx)
	return l, nil
}

// driverBad makes database/sql discard a connection instead of pooling it
// (a session that holds, or may hold, the lock must never be reused):
// Conn.Raw closes a connection whose function returns driver.ErrBadConn.
var driverBad = driver.ErrBadConn

// keep pings the lease's session until it fails or the lease is released.
func (l *Lease) keep(ctx context.Context) {
	defer close(l.done)
	t := time.NewTicker(leasePoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, leasePingT)
		err := l.conn.PingContext(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			close(l.lost)
			return
		}
	}
}

// Lost is closed when the lease is no longer held.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Release gives the lease up: its session ends, and with it the lock.
func (l *Lease) Release() {
	l.cancel()
	<-l.done
	l.conn.Raw(func(any) error { return driverBad })
	l.conn.Close()
}

// CurrentLeader reads who holds, or last held, the lease.
func (s *Store) CurrentLeader(ctx context.Context) (Leader, error) {
	var l Leader
	var since int64
	err := s.db.QueryRowContext(ctx, `SELECT holder, since FROM leader WHERE id=1`).Scan(&l.Holder, &since)
	if err != nil {
		return l, err
	}
	l.Since = fromMs(since)
	return l, nil
}

// SharedSecret returns the secret called name that every master of this
// store shares (the API token: a client must not need to know which master
// leads), making it with gen if no master has yet. PostgreSQL only: a
// SQLite store has one master, which keeps its secrets in its data dir.
func (s *Store) SharedSecret(ctx context.Context, name string, gen func() (string, error)) (string, error) {
	if s.d != pgDialect {
		return "", ErrNoLease
	}
	if _, err := s.db.ExecContext(s.d.writeCtx(ctx), `CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL)`); err != nil {
		return "", err
	}
	v, err := gen()
	if err != nil {
		return "", err
	}
	if _, err := s.db.ExecContext(s.d.writeCtx(ctx), `INSERT INTO secrets(name, value) VALUES($1, $2) ON CONFLICT (name) DO NOTHING`, name, v); err != nil {
		return "", err
	}
	err = s.db.QueryRowContext(ctx, `SELECT value FROM secrets WHERE name=$1`, name).Scan(&v)
	return v, err
}
