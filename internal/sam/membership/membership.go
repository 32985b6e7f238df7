// Package membership is a node's side of the mesh's control plane
// (issue 17, item 3): its identity, enrolled once and kept in its data
// dir, its credential, renewed before it expires, and the keys it checks
// other members' credentials with, fetched every few seconds so that a
// revocation reaches it within seconds. A node that cannot reach the
// control plane keeps the last good keys and says so (Status).
//
// Files in the member's directory, all mode 0600:
//
//	identity.key     the node's Ed25519 key (its seed); never sent anywhere
//	member.json      its name and the control plane's (URL, name)
//	credential.json  its current credential and the keys of the last fetch
//	policy.json      the mesh's policy as last taken (policy.go)
//	control-plane-ca.pem  the CA the control plane's HTTPS is checked against
package membership

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/controlplane"
	"sandstorm/internal/sam/meshcred"
	"sandstorm/internal/secretfile"
)

// The member directory's files.
const (
	KeyFile        = "identity.key"
	MemberFile     = "member.json"
	CredentialFile = "credential.json"
	CAFile         = "control-plane-ca.pem"
)

// Config is what a member needs besides its directory.
type Config struct {
	// ControlPlane is its client (its URL, name and TLS).
	ControlPlane *controlplane.Client
	// CAPEM is the control plane's CA, kept in the directory at a join
	// (OpenDir builds the client from it).
	CAPEM []byte
	// PollEvery is how often the keys and revocations are fetched
	// (default 2 s: a revocation reaches the member within it).
	PollEvery time.Duration
	Log       *slog.Logger
	Now       func() time.Time
}

// Member is an enrolled node.
type Member struct {
	dir  string
	name string
	priv ed25519.PrivateKey
	cfg  Config

	mu       sync.Mutex
	cred     api.Credential
	verifier *controlplane.Verifier
	keysAt   time.Time // when the keys were last fetched
	takenAt  time.Time // when the credential was taken
	lastErr  error     // the last fetch's or refresh's error; nil when they work
	// failingSince is when fetches began to fail (zero while they work).
	failingSince time.Time

	pol *PolicySource
	// kick asks Run for a fetch now: a credential signed by a key this
	// member does not know may be of a key rotated in since its last
	// fetch.
	kick chan struct{}
}

// memberInfo is member.json.
type memberInfo struct {
	Name             string `json:"name"`
	ControlPlaneURL  string `json:"control_plane_url"`
	ControlPlaneName string `json:"control_plane_name"`
}

// Join enrols the node as name with a bootstrap token, once: its key is
// made (or the one in dir kept: a join retried after a failure keeps its
// identity) and the credential written to dir. A dir that holds a
// member's credential already is not joined again.
func Join(ctx context.Context, dir, name, token string, cfg Config) (*Member, error) {
	return join(ctx, dir, name, cfg, func(priv ed25519.PrivateKey) (api.Credential, error) {
		return cfg.ControlPlane.Enrol(ctx, token, name, priv)
	})
}

// JoinOIDC is Join with an OpenID Connect ID token of the control plane's
// issuer instead of a bootstrap token.
func JoinOIDC(ctx context.Context, dir, name, idToken string, cfg Config) (*Member, error) {
	return join(ctx, dir, name, cfg, func(priv ed25519.PrivateKey) (api.Credential, error) {
		return cfg.ControlPlane.EnrolOIDC(ctx, idToken, name, priv)
	})
}

func join(ctx context.Context, dir, name string, cfg Config, enrol func(ed25519.PrivateKey) (api.Credential, error)) (*Member, error) {
	if _, err := os.Stat(filepath.Join(dir, CredentialFile)); err == nil {
		return nil, errdefs.New(errdefs.ErrExists, "%s holds a member already (%s): run with it, or join into another directory", dir, CredentialFile)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	priv, err := loadOrMakeKey(filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, err
	}
	cred, err := enrol(priv)
	if err != nil {
		return nil, fmt.Errorf("enrol %s with %s: %w", name, cfg.ControlPlane.Base, err)
	}
	info, _ := json.Marshal(memberInfo{Name: name, ControlPlaneURL: cfg.ControlPlane.Base, ControlPlaneName: cfg.ControlPlane.Name})
	if err := secretfile.Write(filepath.Join(dir, MemberFile), info); err != nil {
		return nil, err
	}
	if len(cfg.CAPEM) > 0 {
		if err := secretfile.Write(filepath.Join(dir, CAFile), cfg.CAPEM); err != nil {
			return nil, err
		}
	}
	m := newMember(dir, name, priv, cfg)
	return m, m.take(cred)
}

// OpenDir is the member enrolled in dir, with a client of its control
// plane made from what the join kept there (its URL, name and CA).
func OpenDir(dir string, log *slog.Logger) (*Member, error) {
	info, err := readMemberInfo(dir)
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, err
	}
	hc, err := httpsClient(caPEM)
	if err != nil {
		return nil, err
	}
	return Open(dir, Config{ControlPlane: &controlplane.Client{Base: info.ControlPlaneURL, Name: info.ControlPlaneName, HTTP: hc}, Log: log})
}

// readMemberInfo reads dir's MemberFile, which a join writes.
func readMemberInfo(dir string) (memberInfo, error) {
	var info memberInfo
	b, err := os.ReadFile(filepath.Join(dir, MemberFile))
	if err != nil {
		return info, fmt.Errorf("%s: %w (join first)", dir, err)
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, fmt.Errorf("%s: %w", MemberFile, err)
	}
	return info, nil
}

// PrivateKey is the member's key: its libp2p identity too (a router's
// gate checks that a credential is bound to the peer's own key).
func (m *Member) PrivateKey() ed25519.PrivateKey { return m.priv }

// Open is the member enrolled in dir.
func Open(dir string, cfg Config) (*Member, error) {
	info, err := readMemberInfo(dir)
	if err != nil {
		return nil, err
	}
	priv, err := loadKey(filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, err
	}
	m := newMember(dir, info.Name, priv, cfg)
	b, err := os.ReadFile(filepath.Join(dir, CredentialFile))
	if err != nil {
		return nil, err
	}
	var cred api.Credential
	if err := json.Unmarshal(b, &cred); err != nil {
		return nil, fmt.Errorf("%s: %w", CredentialFile, err)
	}
	v, err := controlplane.NewVerifier(cred.Keys)
	if err != nil {
		return nil, err
	}
	// Its life is not recorded: counted from now, the first renewal is
	// at most a little late, never early.
	m.cred, m.verifier, m.takenAt = cred, v, m.cfg.Now()
	return m, nil
}

func newMember(dir, name string, priv ed25519.PrivateKey, cfg Config) *Member {
	if cfg.PollEvery <= 0 {
		cfg.PollEvery = 2 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := &Member{dir: dir, name: name, priv: priv, cfg: cfg, pol: newPolicySource(), kick: make(chan struct{}, 1)}
	m.loadPolicy()
	return m
}

// take makes cred (an enrolment's or a refresh's answer) the member's and
// writes it to dir.
func (m *Member) take(cred api.Credential) error {
	v, err := controlplane.NewVerifier(cred.Keys)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(cred)
	if err := secretfile.Write(filepath.Join(m.dir, CredentialFile), b); err != nil {
		return err
	}
	m.mu.Lock()
	m.cred, m.verifier, m.keysAt, m.takenAt = cred, v, m.cfg.Now(), m.cfg.Now()
	m.mu.Unlock()
	return nil
}

// Name is the member's name in the mesh.
func (m *Member) Name() string { return m.name }

// Credential is the member's current credential, what it presents.
func (m *Member) Credential() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cred.Credential
}

// ReportRefusals sends the control plane a report of this member's
// agents' refusals (internal/sam/refusals) with its credential; ctx bounds
// the call. It fits refusals.Forward.
func (m *Member) ReportRefusals(ctx context.Context, rep api.RefusalReport) error {
	return m.cfg.ControlPlane.ReportRefusals(ctx, m.Credential(), rep)
}

// Verify checks another member's credential against the last good keys
// and revocations. A credential signed by a key it does not know is
// refused, and makes Run fetch the keys now (or a quarter poll after its
// last fetch) rather than at its next poll: after a rotation, a member
// that renewed at once is refused by the others for about a round trip,
// not for up to a poll.
func (m *Member) Verify(credential string) (meshcred.Claims, error) {
	m.mu.Lock()
	v := m.verifier
	m.mu.Unlock()
	c, err := v.Verify(credential, m.cfg.Now())
	if errors.Is(err, meshcred.ErrUnknownKey) {
		select {
		case m.kick <- struct{}{}:
		default:
		}
	}
	return c, err
}

// Status says how fresh the member's view is: when it last fetched the
// keys, and why the last fetch (of the keys or the policy) or refresh
// failed (nil: they work). Policy().State() says which policy is in
// force and since when it is stale.
func (m *Member) Status() (keysAt time.Time, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.keysAt, m.lastErr
}

// ControlPlaneStatus is Status and the policy's state in the API's
// words (sam-node's admin GET /mesh).
func (m *Member) ControlPlaneStatus() api.ControlPlaneStatus {
	m.mu.Lock()
	st := api.ControlPlaneStatus{URL: m.cfg.ControlPlane.Base, Reachable: m.lastErr == nil, KeysAt: m.keysAt,
		CredentialExpires: m.cred.Expires, UnreachableSince: m.failingSince}
	if m.lastErr != nil {
		st.Error = m.lastErr.Error()
	}
	m.mu.Unlock()
	ps := m.pol.State()
	st.PolicyVersion, st.PolicyStale = ps.Version, ps.Stale
	return st
}

// Run keeps the member current until ctx ends: the keys and revocations
// fetched every PollEvery, and the credential renewed once a third of
// its life has passed. A failure keeps what the member has (the last
// good keys, the credential while it lasts) and is logged once, and again
// when it works again.
func (m *Member) Run(ctx context.Context) {
	tick := time.NewTicker(m.cfg.PollEvery)
	defer tick.Stop()
	for {
		last := time.Now()
		m.step(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-m.kick:
			// At once, but at most one fetch per PollEvery/4 however
			// many unknown keys are presented: a peer cannot make the
			// member hammer the control plane.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(last.Add(m.cfg.PollEvery / 4))):
			}
		}
	}
}

func (m *Member) step(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, m.cfg.PollEvery+5*time.Second)
	defer cancel()
	err := m.renewIfDue(cctx)
	if err == nil {
		var k api.MeshKeys
		if k, err = m.cfg.ControlPlane.Keys(cctx); err == nil {
			var v *controlplane.Verifier
			if v, err = controlplane.NewVerifier(k); err == nil {
				m.mu.Lock()
				m.verifier, m.keysAt = v, m.cfg.Now()
				m.cred.Keys = k
				m.mu.Unlock()
			}
		}
	}
	// The policy is fetched whether or not the keys were: each keeps its
	// last good value on its own.
	if perr := m.fetchPolicy(cctx); perr != nil {
		err = errors.Join(err, perr)
	}
	if ctx.Err() != nil {
		return
	}
	m.mu.Lock()
	was := m.lastErr
	m.lastErr = err
	switch {
	case err == nil:
		m.failingSince = time.Time{}
	case was == nil:
		m.failingSince = m.cfg.Now()
	}
	at := m.keysAt
	m.mu.Unlock()
	switch {
	case err != nil && was == nil:
		m.cfg.Log.Warn("control plane unreachable: keeping the last good keys and policy", "control_plane", m.cfg.ControlPlane.Base, "keys_from", at.Format(time.RFC3339), "err", err)
	case err == nil && was != nil:
		m.cfg.Log.Info("control plane reachable again", "control_plane", m.cfg.ControlPlane.Base)
	}
}

// renewIfDue refreshes the credential once a third of its life has
// passed (or it has less than three polls left): a member keeps two
// thirds in hand against a control plane that is down — with the 10 min
// default, 6.7 min, more than the 5 min outage a mesh must ride out
// without a failed call (issue 29). Renewing earlier costs one request
// per member every few minutes.
func (m *Member) renewIfDue(ctx context.Context) error {
	m.mu.Lock()
	exp, taken := m.cred.Expires, m.takenAt
	m.mu.Unlock()
	now := m.cfg.Now()
	due := taken.Add(exp.Sub(taken) / 3)
	if now.Before(due) && exp.Sub(now) > 3*m.cfg.PollEvery {
		return nil
	}
	cred, err := m.cfg.ControlPlane.Refresh(ctx, m.name, m.priv)
	if err != nil {
		return fmt.Errorf("renew the credential: %w", err)
	}
	return m.take(cred)
}

func loadOrMakeKey(path string) (ed25519.PrivateKey, error) {
	if k, err := loadKey(path); err == nil {
		return k, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	return priv, secretfile.Write(path, priv.Seed())
}

func loadKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) != ed25519.SeedSize {
		return nil, fmt.Errorf("%s: %d bytes, want an Ed25519 seed (%d)", path, len(b), ed25519.SeedSize)
	}
	os.Chmod(path, 0o600)
	return ed25519.NewKeyFromSeed(b), nil
}
