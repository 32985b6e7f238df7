package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"sandstorm/internal/testenv"
)

// TestLeaseOneLeaderAndTakeover: of two masters on one PostgreSQL, one
// leads and the other waits (told who leads); when the leader's session
// ends the way a killed process's does — PostgreSQL terminates it — the
// leader learns it has lost (Lost), and the standby leads within the
// issue's 10 s.
func TestLeaseOneLeaderAndTakeover(t *testing.T) {
	url := testenv.Postgres(t)
	a, b := openAt(t, url), openAt(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	la, err := a.AcquireLease(ctx, "master-a", nil)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan Leader, 1)
	got := make(chan *Lease, 1)
	go func() {
		lb, err := b.AcquireLease(ctx, "master-b", func(l Leader) { waited <- l })
		if err != nil {
			t.Error(err)
		}
		got <- lb
	}()
	select {
	case l := <-waited:
		if l.Holder != "master-a" {
			t.Errorf("the standby was told %q leads, want master-a", l.Holder)
		}
	case <-got:
		t.Fatal("a second master took the lease while the first held it")
	case <-ctx.Done():
		t.Fatal("the standby never said it waits")
	}
	// End the leader's session from the server's side, as its death would.
	killed := time.Now()
	if _, err := a.DB().ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype='advisory' AND objid=$1 AND granted`, leaderLockKey); err != nil {
		t.Fatal(err)
	}
	select {
	case lb := <-got:
		if d := time.Since(killed); d > 10*time.Second {
			t.Errorf("takeover took %v, want ≤ 10 s", d)
		}
		defer lb.Release()
	case <-ctx.Done():
		t.Fatal("the standby did not take over")
	}
	testenv.Within(t, la.Lost(), 10*time.Second, "the old leader was not told it lost the lease")
	if cur, err := b.CurrentLeader(ctx); err != nil || cur.Holder != "master-b" {
		t.Errorf("leader recorded as %+v (%v), want master-b", cur, err)
	}
}

// TestLeaseReleaseHandsOver: a leader that stops cleanly frees the lease
// at once, and one that is merely slow (a ping within its bound) keeps it.
func TestLeaseReleaseHandsOver(t *testing.T) {
	url := testenv.Postgres(t)
	a, b := openAt(t, url), openAt(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	la, err := a.AcquireLease(ctx, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Held across several pings and the server's idle timeout.
	select {
	case <-la.Lost():
		t.Fatal("a healthy leader lost its lease")
	case <-time.After(leaseIdle + 2*leasePoll):
	}
	la.Release()
	short, cancel2 := context.WithTimeout(ctx, 3*leasePoll)
	defer cancel2()
	lb, err := b.AcquireLease(short, "b", nil)
	if err != nil {
		t.Fatalf("after a release the lease was not free: %v", err)
	}
	lb.Release()
}

// TestLeaseNeedsPostgres: SQLite has no lease; a second master is refused
// in words that say what to use.
func TestLeaseNeedsPostgres(t *testing.T) {
	s := openAt(t, filepath.Join(t.TempDir(), "state.db"))
	if _, err := s.AcquireLease(context.Background(), "x", nil); !errors.Is(err, ErrNoLease) {
		t.Fatalf("err = %v, want ErrNoLease", err)
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:secret@h:5432/db":                   "postgres://u:xxxxx@h:5432/db",
		"postgres://u@h/db":                               "postgres://u@h/db",
		"postgres:///db?host=/run/pg&password=secret&x=1": "postgres:///db?host=/run/pg&password=xxxxx&x=1",
		"postgresql://u:p%40ss@h/db?sslmode=verify-full":  "postgresql://u:xxxxx@h/db?sslmode=verify-full",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
