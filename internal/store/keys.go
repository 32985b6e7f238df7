package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"sandstorm/internal/errdefs"
)

// TeamRows are the API's rows of its teams: their API keys, and which
// team owns each sandbox with its settings (the E2B surface's metadata
// and timeouts). The master's and the E2B API's handlers write them.
type TeamRows struct{ s *Store }

// Teams is the API's view of the store.
func (s *Store) Teams() TeamRows { return TeamRows{s} }

// APIKey is one team's API key, as kept: its SHA-256 only (internal/apikey
// makes and checks keys), and its last four characters to tell keys apart
// in a list.
type APIKey struct {
	ID        string
	Team      string
	Hash      string
	Last4     string
	CreatedAt time.Time
}

// PutAPIKey stores k.
func (v TeamRows) PutAPIKey(ctx context.Context, k APIKey) error {
	s := v.s
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO api_keys(id, team, hash, last4, created_at) VALUES(?,?,?,?,?)`), k.ID, k.Team, k.Hash, k.Last4, ms(k.CreatedAt))
	if isConstraint(err) {
		return fmt.Errorf("api key %s: %w", k.ID, errdefs.ErrExists)
	}
	return err
}

// APIKeyByHash is the key whose hash is hash, or errdefs.ErrNotFound.
func (v TeamRows) APIKeyByHash(ctx context.Context, hash string) (APIKey, error) {
	ks, err := v.apiKeys(ctx, `SELECT id, team, hash, last4, created_at FROM api_keys WHERE hash=?`, hash)
	if err != nil {
		return APIKey{}, err
	}
	if len(ks) == 0 {
		return APIKey{}, fmt.Errorf("api key: %w", errdefs.ErrNotFound)
	}
	return ks[0], nil
}

// APIKeys lists every key, oldest first.
func (v TeamRows) APIKeys(ctx context.Context) ([]APIKey, error) {
	return v.apiKeys(ctx, `SELECT id, team, hash, last4, created_at FROM api_keys ORDER BY created_at, id`)
}

// DeleteAPIKey revokes key id: errdefs.ErrNotFound if there is none.
func (v TeamRows) DeleteAPIKey(ctx context.Context, id string) error {
	s := v.s
	res, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`DELETE FROM api_keys WHERE id=?`), id)
	if err != nil {
		return err
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return fmt.Errorf("api key %s: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

func (v TeamRows) apiKeys(ctx context.Context, q string, args ...any) ([]APIKey, error) {
	s := v.s
	rows, err := s.db.QueryContext(ctx, s.q(q), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		var k APIKey
		var created int64
		if err := rows.Scan(&k.ID, &k.Team, &k.Hash, &k.Last4, &created); err != nil {
			return nil, err
		}
		k.CreatedAt = fromMs(created)
		out = append(out, k)
	}
	return out, rows.Err()
}

// SandboxMeta is what the master keeps of a sandbox beyond its placement:
// the team that owns it, its metadata (labels), the environment its
// commands get, and its lifetime — E2B's timeout: at EndAt it is killed,
// or with AutoPause snapshotted (internal/e2b).
type SandboxMeta struct {
	ID        string
	Team      string
	Metadata  map[string]string
	Env       map[string]string
	StartedAt time.Time
	EndAt     time.Time // zero: no end
	AutoPause bool
	// Paused: paused by a client (E2B's pause), not by idleness: E2B
	// lists it "paused" until a connect.
	Paused bool
	// Private: its own ports answer only a request with its traffic
	// access token (E2B's allowPublicTraffic: false).
	Private bool
	// MaskHost is the Host its own ports are asked with, ${PORT} their
	// port ("": the name the client used; E2B's maskRequestHost).
	MaskHost string
	// AutoResume: traffic resumes it when Paused (E2B's autoResume);
	// otherwise only a connect does, and traffic is told it is paused.
	AutoResume bool
	// SnapshotOf, when set, makes this sandbox a snapshot of that one
	// (internal/sandboxes: a clone kept in the snapshot tier, from which
	// sandboxes are cloned with its memory), named SnapshotName.
	SnapshotOf, SnapshotName string
	// PauseDropsMemory: its pause at its end keeps its files, not its
	// memory (E2B's autoPauseMemory false): a connect cold-boots it.
	PauseDropsMemory bool
}

const metaCols = `id, team, metadata, env, started_at, end_at, auto_pause, paused, private_traffic, mask_host, auto_resume, snapshot_of, snapshot_name, pause_drops_memory`

// PutSandboxMeta stores m, replacing what was kept of sandbox m.ID.
func (v TeamRows) PutSandboxMeta(ctx context.Context, m SandboxMeta) error {
	s := v.s
	var end int64
	if !m.EndAt.IsZero() {
		end = ms(m.EndAt)
	}
	// One statement: two puts at once (a pause and a connect) each
	// replace the row, never meet on its key (issue 31, item 7).
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO sandbox_meta(`+metaCols+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET team=excluded.team, metadata=excluded.metadata, env=excluded.env, started_at=excluded.started_at,
		end_at=excluded.end_at, auto_pause=excluded.auto_pause, paused=excluded.paused, private_traffic=excluded.private_traffic, mask_host=excluded.mask_host, auto_resume=excluded.auto_resume,
		snapshot_of=excluded.snapshot_of, snapshot_name=excluded.snapshot_name, pause_drops_memory=excluded.pause_drops_memory`),
		m.ID, m.Team, mustJSON(orEmpty(m.Metadata)), mustJSON(orEmpty(m.Env)), ms(m.StartedAt), end, boolInt(m.AutoPause), boolInt(m.Paused), boolInt(m.Private), m.MaskHost, boolInt(m.AutoResume), m.SnapshotOf, m.SnapshotName, boolInt(m.PauseDropsMemory))
	return err
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// GetSandboxMeta is what is kept of sandbox id, or errdefs.ErrNotFound.
func (v TeamRows) GetSandboxMeta(ctx context.Context, id string) (SandboxMeta, error) {
	ms, err := v.sandboxMetas(ctx, `SELECT `+metaCols+` FROM sandbox_meta WHERE id=?`, id)
	if err != nil {
		return SandboxMeta{}, err
	}
	if len(ms) == 0 {
		return SandboxMeta{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return ms[0], nil
}

// SandboxMetas lists what is kept of every sandbox.
func (v TeamRows) SandboxMetas(ctx context.Context) ([]SandboxMeta, error) {
	return v.sandboxMetas(ctx, `SELECT `+metaCols+` FROM sandbox_meta ORDER BY started_at, id`)
}

// DueSandboxMetas lists the sandboxes whose lifetime ended by now and
// that are not paused: what the lifetime loop acts on, four times a
// second, without reading every row.
func (v TeamRows) DueSandboxMetas(ctx context.Context, now time.Time) ([]SandboxMeta, error) {
	return v.sandboxMetas(ctx, `SELECT `+metaCols+` FROM sandbox_meta WHERE end_at > 0 AND end_at <= ? AND paused = 0 ORDER BY end_at, id`, ms(now))
}

// DeleteSandboxMeta forgets sandbox id.
func (v TeamRows) DeleteSandboxMeta(ctx context.Context, id string) error {
	s := v.s
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`DELETE FROM sandbox_meta WHERE id=?`), id)
	return err
}

func (v TeamRows) sandboxMetas(ctx context.Context, q string, args ...any) ([]SandboxMeta, error) {
	s := v.s
	rows, err := s.db.QueryContext(ctx, s.q(q), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SandboxMeta
	for rows.Next() {
		var m SandboxMeta
		var md, env string
		var started, end int64
		var auto, paused, private, resume, drops bool
		if err := rows.Scan(&m.ID, &m.Team, &md, &env, &started, &end, &auto, &paused, &private, &m.MaskHost, &resume, &m.SnapshotOf, &m.SnapshotName, &drops); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(md), &m.Metadata); err != nil {
			return nil, fmt.Errorf("sandbox %s: corrupt metadata: %w", m.ID, err)
		}
		if err := json.Unmarshal([]byte(env), &m.Env); err != nil {
			return nil, fmt.Errorf("sandbox %s: corrupt env: %w", m.ID, err)
		}
		m.StartedAt = fromMs(started)
		if end != 0 {
			m.EndAt = fromMs(end)
		}
		m.AutoPause, m.Paused, m.Private, m.AutoResume, m.PauseDropsMemory = auto, paused, private, resume, drops
		out = append(out, m)
	}
	return out, rows.Err()
}
