package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"sandstorm/internal/errdefs"
)

// MeshRows are the mesh control plane's rows (sam-control-plane, or the
// one built into sam-node): its members, their one-time join and ID
// tokens, and the policy it serves. Only internal/sam/controlplane writes
// them.
type MeshRows struct{ s *Store }

// Mesh is the control plane's view of the store.
func (s *Store) Mesh() MeshRows { return MeshRows{s} }

// The control plane's rows (sam-control-plane, internal/sam/controlplane):
// its bootstrap tokens, by their hash only, and its members.

// PutMeshToken records a bootstrap token by its hash: good for maxUses
// enrolments until expires.
func (v MeshRows) PutMeshToken(ctx context.Context, hash string, maxUses int, expires, now time.Time) error {
	s := v.s
	if maxUses < 1 {
		return fmt.Errorf("%w: a bootstrap token needs at least one use", errdefs.ErrBadInput)
	}
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO mesh_tokens(hash, max_uses, uses, expires_at, created_at) VALUES(?,?,0,?,?)`), hash, maxUses, ms(expires), ms(now))
	if isConstraint(err) {
		return fmt.Errorf("bootstrap token: %w", errdefs.ErrExists)
	}
	return err
}

// SpendMeshToken spends one use of the token with hash, atomically: one
// statement that counts the use only while uses remain and the token has
// not expired, so two enrolments racing for the last use cannot both
// have it. errdefs.ErrNotFound for a token unknown, spent or expired (one
// answer for all three: a guess learns nothing).
func (v MeshRows) SpendMeshToken(ctx context.Context, hash string, now time.Time) error {
	s := v.s
	res, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`UPDATE mesh_tokens SET uses=uses+1 WHERE hash=? AND uses<max_uses AND expires_at>?`), hash, ms(now))
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("bootstrap token unknown, spent or expired: %w", errdefs.ErrNotFound)
	}
	return nil
}

// MeshMember is a member of the mesh: a node enrolled under its name with
// its own Ed25519 public key (base64).
type MeshMember struct {
	Name       string
	PublicKey  string
	EnrolledAt time.Time
	RevokedAt  time.Time // zero: not revoked
}

// PutMeshMember records m; errdefs.ErrExists if its name or its key is
// another member's.
func (v MeshRows) PutMeshMember(ctx context.Context, m MeshMember) error {
	s := v.s
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO mesh_members(name, public_key, enrolled_at, revoked_at) VALUES(?,?,?,0)`), m.Name, m.PublicKey, ms(m.EnrolledAt))
	if isConstraint(err) {
		return fmt.Errorf("member %q (or its key): %w", m.Name, errdefs.ErrExists)
	}
	return err
}

// GetMeshMember returns the member called name, or errdefs.ErrNotFound.
func (v MeshRows) GetMeshMember(ctx context.Context, name string) (MeshMember, error) {
	s := v.s
	m, err := scanMember(s.db.QueryRowContext(ctx, s.q(`SELECT name, public_key, enrolled_at, revoked_at FROM mesh_members WHERE name=?`), name))
	if errors.Is(err, errdefs.ErrNotFound) {
		return m, fmt.Errorf("no member %q: %w", name, errdefs.ErrNotFound)
	}
	return m, err
}

// ListMeshMembers lists every member, revoked ones too, by name.
func (v MeshRows) ListMeshMembers(ctx context.Context) ([]MeshMember, error) {
	s := v.s
	rows, err := s.db.QueryContext(ctx, `SELECT name, public_key, enrolled_at, revoked_at FROM mesh_members ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []MeshMember
	for rows.Next() {
		m, err := scanMember(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// RevokeMeshMember marks the member revoked at now (a second revoke keeps
// the first time); errdefs.ErrNotFound if there is none of that name.
func (v MeshRows) RevokeMeshMember(ctx context.Context, name string, now time.Time) error {
	s := v.s
	res, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`UPDATE mesh_members SET revoked_at=? WHERE name=? AND revoked_at=0`), ms(now), name)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	_, err = v.GetMeshMember(ctx, name)
	return err
}

func scanMember(r scanner) (MeshMember, error) {
	var m MeshMember
	var enrolled, revoked int64
	err := r.Scan(&m.Name, &m.PublicKey, &enrolled, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return m, fmt.Errorf("member: %w", errdefs.ErrNotFound)
	}
	if err != nil {
		return m, err
	}
	m.EnrolledAt = fromMs(enrolled)
	if revoked != 0 {
		m.RevokedAt = fromMs(revoked)
	}
	return m, nil
}

// MeshPolicy is one version of the mesh's policy (roles, bindings,
// egress; internal/sam/policy's format), as the operator set it: the control
// plane serves the newest to its members.
type MeshPolicy struct {
	Version  int64
	Document string
	SetAt    time.Time
}

// PutMeshPolicy stores doc as the mesh's policy under the next version
// number and returns it. Every version is kept (a row each, a few KiB),
// so the numbers only grow and a member that has version n knows it has
// every change up to n. PUTs racing for one number: each round one wins
// and the losers' inserts hit the primary key and are retried with the
// next, so n racing writers need at most n-1 retries (an operator's
// writes: a few at most; 32 is room to spare).
func (v MeshRows) PutMeshPolicy(ctx context.Context, doc string, now time.Time) (int64, error) {
	s := v.s
	for range 32 {
		var v int64
		err := s.db.QueryRowContext(s.d.writeCtx(ctx), s.q(`INSERT INTO mesh_policy(version, document, set_at) SELECT COALESCE(MAX(version), 0) + 1, ?, ? FROM mesh_policy RETURNING version`), doc, ms(now)).Scan(&v)
		if isConstraint(err) {
			continue
		}
		return v, err
	}
	return 0, fmt.Errorf("mesh policy: %w: 32 racing writes in a row; try again", errdefs.ErrConflict)
}

// GetMeshPolicy returns the newest policy, or errdefs.ErrNotFound if none
// was ever set.
func (v MeshRows) GetMeshPolicy(ctx context.Context) (MeshPolicy, error) {
	s := v.s
	var p MeshPolicy
	var at int64
	err := s.db.QueryRowContext(ctx, `SELECT version, document, set_at FROM mesh_policy ORDER BY version DESC LIMIT 1`).Scan(&p.Version, &p.Document, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return p, fmt.Errorf("no mesh policy set yet: %w", errdefs.ErrNotFound)
	}
	p.SetAt = fromMs(at)
	return p, err
}

// SpendMeshIDToken records that the OpenID Connect ID token with hash
// has enrolled a member, once: errdefs.ErrExists if it did before. The
// row is kept until the token expires (it is refused after that anyway),
// and expired rows are dropped on the way.
func (v MeshRows) SpendMeshIDToken(ctx context.Context, hash string, expires, now time.Time) error {
	s := v.s
	if _, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`DELETE FROM mesh_id_tokens WHERE expires_at<?`), ms(now)); err != nil {
		return err
	}
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO mesh_id_tokens(hash, expires_at) VALUES(?,?)`), hash, ms(expires))
	if isConstraint(err) {
		return fmt.Errorf("ID token: %w", errdefs.ErrExists)
	}
	return err
}
