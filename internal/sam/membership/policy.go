package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"sandstorm/api"
	"sandstorm/internal/sam/policy"
	"sandstorm/internal/secretfile"
)

// PolicyFile is the last good policy in the member's directory (0600):
// a member started while the control plane is unreachable enforces it
// rather than nothing or everything.
const PolicyFile = "policy.json"

// storedPolicy is PolicyFile: the policy as the control plane served it,
// and when.
type storedPolicy struct {
	api.MeshPolicy
	FetchedAt time.Time `json:"fetched_at"`
}

// PolicySource is the mesh's policy as this member last took it from the
// control plane: what its boundaries and gateway enforce. Current is
// meshnode.PolicySource's method (a *PolicySource is one). Before any
// policy was ever received it is policy.Empty(): nothing is granted.
type PolicySource struct {
	mu        sync.Mutex
	cur       *policy.Policy
	doc       string // the document cur was compiled from
	version   int64
	setAt     time.Time
	fetchedAt time.Time // when the control plane last said it is the newest
	confirmed bool      // whether it has said so since this process started
	failing   time.Time // when fetching it began to fail; zero: it works
	err       error
	hooks     []func(*policy.Policy)
}

func newPolicySource() *PolicySource { return &PolicySource{cur: policy.Empty()} }

// Current is the policy in force.
func (p *PolicySource) Current() *policy.Policy {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// Document is the document of the policy in force and its version
// (meshnode.PolicyDocument: sam-node passes it on to the boundaries of
// its machine); ok is false while none was ever received.
func (p *PolicySource) Document() (version int64, doc []byte, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.version == 0 {
		return 0, nil, false
	}
	return p.version, []byte(p.doc), true
}

// OnChange registers fn, called with each new policy the member takes
// (not with the one in force when it registers: read Current for that).
// It runs on the member's loop: it must not block.
func (p *PolicySource) OnChange(fn func(*policy.Policy)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hooks = append(p.hooks, fn)
}

// PolicyState is how current a member's policy is.
type PolicyState struct {
	// Version is the policy's (0: none ever received, nothing granted).
	Version int64
	// SetAt is when the operator set it; FetchedAt when the control plane
	// last confirmed it is the newest (from an earlier run, if this one
	// has not reached it yet).
	SetAt, FetchedAt time.Time
	// Stale: this process has not confirmed the policy with the control
	// plane since it started, or the last fetch failed. UnreachableSince
	// is when fetching began to fail (zero: it works, or has not been
	// tried yet), Err why.
	Stale            bool
	UnreachableSince time.Time
	Err              error
}

// State says which policy is in force and whether it is stale.
func (p *PolicySource) State() PolicyState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PolicyState{Version: p.version, SetAt: p.setAt, FetchedAt: p.fetchedAt,
		Stale: !p.confirmed || p.err != nil, UnreachableSince: p.failing, Err: p.err}
}

// loadPolicy takes the policy kept in dir, if any. One that no longer
// parses (a file edited by hand, or written by a version with another
// format) is not used: the member starts from nothing granted.
func (m *Member) loadPolicy() {
	b, err := os.ReadFile(filepath.Join(m.dir, PolicyFile))
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	var sp storedPolicy
	if err == nil {
		err = json.Unmarshal(b, &sp)
	}
	var pol *policy.Policy
	if err == nil {
		pol, err = parsePolicy(sp.Version, sp.Document)
	}
	if err != nil {
		m.cfg.Log.Error("the kept policy is unusable: nothing is granted until the control plane sends one", "file", filepath.Join(m.dir, PolicyFile), "err", err)
		return
	}
	p := m.pol
	p.mu.Lock()
	p.cur, p.doc, p.version, p.setAt, p.fetchedAt = pol, sp.Document, sp.Version, sp.SetAt, sp.FetchedAt
	p.mu.Unlock()
}

func parsePolicy(version int64, doc string) (*policy.Policy, error) {
	if version == 0 {
		return policy.Empty(), nil
	}
	pol, err := policy.Parse([]byte(doc))
	if err != nil {
		return nil, fmt.Errorf("policy version %d: %w", version, err)
	}
	return pol, nil
}

// fetchPolicy asks the control plane for the policy, sending the version
// it has (an unchanged policy is a 304), and takes a new one: written to
// dir first, then in force, then the hooks told. A failure keeps the one
// in force.
func (m *Member) fetchPolicy(ctx context.Context) error {
	p := m.pol
	p.mu.Lock()
	have := p.version
	p.mu.Unlock()
	got, changed, err := m.cfg.ControlPlane.Policy(ctx, m.Credential(), have)
	now := m.cfg.Now()
	if err == nil && changed && got.Version != have {
		err = m.takePolicy(got.Version, got.Document, got.SetAt, now)
	}
	if ctx.Err() != nil && err != nil {
		return err
	}
	p.mu.Lock()
	was := p.err
	p.err = err
	if err == nil {
		p.fetchedAt, p.confirmed, p.failing = now, true, time.Time{}
	} else if was == nil {
		p.failing = now
	}
	v := p.version
	p.mu.Unlock()
	if err != nil && was == nil {
		m.cfg.Log.Warn("cannot fetch the mesh's policy: keeping the last good one", "version", v, "err", err)
	}
	if err != nil {
		return fmt.Errorf("fetch the policy: %w", err)
	}
	return nil
}

func (m *Member) takePolicy(version int64, doc string, setAt, now time.Time) error {
	pol, err := parsePolicy(version, doc)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(storedPolicy{MeshPolicy: api.MeshPolicy{Version: version, Document: doc, SetAt: setAt}, FetchedAt: now})
	if err := secretfile.Write(filepath.Join(m.dir, PolicyFile), b); err != nil {
		return fmt.Errorf("keep the policy: %w", err)
	}
	p := m.pol
	p.mu.Lock()
	old := p.version
	p.cur, p.doc, p.version, p.setAt = pol, doc, version, setAt
	hooks := slices.Clone(p.hooks)
	p.mu.Unlock()
	m.cfg.Log.Info("mesh policy taken", "version", version, "was", old)
	for _, fn := range hooks {
		fn(pol)
	}
	return nil
}

// Policy is the member's policy source: the mesh's policy as last taken
// from the control plane, what its gateway and boundaries enforce.
func (m *Member) Policy() *PolicySource { return m.pol }
