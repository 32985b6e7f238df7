package store

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"sandstorm/internal/errdefs"
)

// SecretRows are the secrets teams and the operator (team "") store for
// their sandboxes' boundaries to send (internal/secrets): the value only
// sealed, by the master's secrets key, bound to its team and name.
type SecretRows struct{ s *Store }

// Secrets is the secrets' view of the store.
func (s *Store) Secrets() SecretRows { return SecretRows{s} }

// Secret is one stored secret.
type Secret struct {
	Team, Name string
	Sealed     []byte
	Hosts      []string
	// Body: the boundary replaces its marker in request bodies too.
	Body      bool
	CreatedAt time.Time
}

// Put stores sec, replacing a secret of the same team and name (a
// rotation: sandboxes already made keep the value they were given).
func (v SecretRows) Put(ctx context.Context, sec Secret) error {
	s := v.s
	hosts, err := json.Marshal(sec.Hosts)
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO team_secrets(team, name, sealed, hosts, body, created_at) VALUES(?,?,?,?,?,?)
		ON CONFLICT (team, name) DO UPDATE SET sealed=excluded.sealed, hosts=excluded.hosts, body=excluded.body, created_at=excluded.created_at`),
		sec.Team, sec.Name, base64.StdEncoding.EncodeToString(sec.Sealed), string(hosts), boolInt(sec.Body), ms(sec.CreatedAt))
	return err
}

// Get is team's secret name, or errdefs.ErrNotFound.
func (v SecretRows) Get(ctx context.Context, team, name string) (Secret, error) {
	out, err := v.list(ctx, `WHERE team=? AND name=?`, team, name)
	if err != nil {
		return Secret{}, err
	}
	if len(out) == 0 {
		return Secret{}, fmt.Errorf("secret %q: %w", name, errdefs.ErrNotFound)
	}
	return out[0], nil
}

// List is team's secrets, by name.
func (v SecretRows) List(ctx context.Context, team string) ([]Secret, error) {
	return v.list(ctx, `WHERE team=? ORDER BY name`, team)
}

// Delete removes team's secret name, or says errdefs.ErrNotFound.
func (v SecretRows) Delete(ctx context.Context, team, name string) error {
	s := v.s
	res, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`DELETE FROM team_secrets WHERE team=? AND name=?`), team, name)
	if err != nil {
		return err
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return fmt.Errorf("secret %q: %w", name, errdefs.ErrNotFound)
	}
	return nil
}

func (v SecretRows) list(ctx context.Context, where string, args ...any) ([]Secret, error) {
	s := v.s
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT team, name, sealed, hosts, body, created_at FROM team_secrets `+where), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Secret
	for rows.Next() {
		var sec Secret
		var sealed, hosts string
		var created, body int64
		if err := rows.Scan(&sec.Team, &sec.Name, &sealed, &hosts, &body, &created); err != nil {
			return nil, err
		}
		if sec.Sealed, err = base64.StdEncoding.DecodeString(sealed); err != nil {
			return nil, fmt.Errorf("secret %q: sealed value: %w", sec.Name, err)
		}
		if err := json.Unmarshal([]byte(hosts), &sec.Hosts); err != nil {
			return nil, fmt.Errorf("secret %q: hosts: %w", sec.Name, err)
		}
		sec.CreatedAt, sec.Body = fromMs(created), body != 0
		out = append(out, sec)
	}
	return out, rows.Err()
}
