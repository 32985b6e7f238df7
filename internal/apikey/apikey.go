// Package apikey is who calls the master's API: the operator (the root
// token in <data-dir>/pki/api-token) or a team, by one of its API keys.
// A key is shaped as E2B's (e2b_ and 40 hex digits), which the E2B SDK
// checks before it sends anything (js-sdk src/api/index.ts,
// API_KEY_PATTERN); it is shown once, when made, and kept only as its
// SHA-256, so a copy of the store gives no key.
package apikey

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"time"

	"sandstorm/internal/store"
)

// Prefix starts every key.
const Prefix = "e2b_"

var shape = regexp.MustCompile(`^e2b_[0-9a-f]{40}$`)

// Valid reports whether s is shaped as a key (it may still be unknown).
func Valid(s string) bool { return shape.MatchString(s) }

// Hash is what is kept of key.
func Hash(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

// New makes a key for team: the key itself, to show once, and its row.
func New(team string, now time.Time) (string, store.APIKey) {
	var b [20]byte
	rand.Read(b[:])
	key := Prefix + hex.EncodeToString(b[:])
	var id [4]byte
	rand.Read(id[:])
	return key, store.APIKey{ID: "key-" + hex.EncodeToString(id[:]), Team: team, Hash: Hash(key), Last4: key[len(key)-4:], CreatedAt: now.UTC()}
}

// Caller is who a request is from.
type Caller struct {
	// Operator: the root token; sees and does everything.
	Operator bool
	// Team: the team of the API key used ("" for the operator).
	Team string
	// Session: the operator by a console login, which reads only.
	Session bool
}

// Sees reports whether c may see a sandbox owned by team (the operator
// sees all; a team its own only).
func (c Caller) Sees(team string) bool { return c.Operator || c.Team == team }

type ctxKey struct{}

// With is ctx carrying c.
func With(ctx context.Context, c Caller) context.Context { return context.WithValue(ctx, ctxKey{}, c) }

// From is the caller ctx carries; without one, nobody: a team that owns
// nothing (fail closed).
func From(ctx context.Context) Caller {
	c, ok := ctx.Value(ctxKey{}).(Caller)
	if !ok {
		return Caller{Team: "\x00nobody"}
	}
	return c
}
