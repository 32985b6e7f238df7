package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresEnv names the PostgreSQL server tests use, as a URL to a
// database they may create databases from. Unset, it is the local
// cluster's Unix socket as the invoking user, which
// scripts/postgres-up.sh (run by .ci/run) starts and sets up.
const PostgresEnv = "SANDSTORM_TEST_POSTGRES"

const defaultPostgres = "postgres:///postgres?host=/var/run/postgresql"

// Postgres creates a database of its own for test t and returns its URL;
// it is dropped when the test ends. A server that cannot be reached fails
// the test, saying how to start one: the PostgreSQL tests are part of the
// suite, not optional.
func Postgres(t testing.TB) string {
	t.Helper()
	admin := os.Getenv(PostgresEnv)
	if admin == "" {
		admin = defaultPostgres
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("PostgreSQL at %s: %v\nstart it with scripts/postgres-up.sh (after apt-get install -y postgresql), or set %s", admin, err, PostgresEnv)
	}
	defer conn.Close(ctx)
	var b [6]byte
	rand.Read(b[:])
	name := "sandstorm_test_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("%s: %v", PostgresEnv, err)
	}
	u.Path = "/" + name
	return fmt.Sprint(u)
}
