// Package samone is sam-one (issue 17, item 7): the mesh's control plane,
// its router and a console in one process, for a laptop or a first
// machine.
//
// The control plane is internal/sam/controlplane's, opened from the same data
// dir layout as sam-control-plane's (store, issuer keys, admin-token,
// pki/ca.pem), so that CLI's operator commands work against it. The
// router is internal/sam/meshrouter's and a member like any other — listed,
// revocable — but since this process IS the control plane it needs no
// bootstrap token: its credential is issued in-process
// (controlplane.Server.IssueOwn) for its own key, kept in
// <data-dir>/router/identity.key (0600), and renewed at two thirds of its
// life as a member's is (internal/sam/membership). The router checks members'
// credentials against the control plane itself (VerifyCredential), so a
// revocation applies at its next question, not at a 2 s poll. The console
// (internal/sam/meshconsole) is served on the API's own HTTPS listener, at /;
// it shows the members' reports of their agents' refusals
// (controlplane.Config.Reported) beside the control plane's and the
// router's own.
package samone

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"sandstorm/api"
	"sandstorm/internal/console"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/controlplane"
	"sandstorm/internal/sam/meshconsole"
	"sandstorm/internal/sam/meshcred"
	"sandstorm/internal/sam/meshrouter"
	"sandstorm/internal/secretfile"
)

// Options are sam-one serve's.
type Options struct {
	// DataDir is the control plane's (its layout) with the router's key
	// in router/.
	DataDir string
	// Store: "" for SQLite in DataDir, or a postgres:// URL.
	Store string
	// Listen is the API's and the console's address (HTTPS).
	Listen string
	// Name is the control plane's (default "sam").
	Name string
	// RouterListen are the router's libp2p addresses.
	RouterListen []string
	// RouterName is the router's member name (default "router").
	RouterName string
	Log        *slog.Logger
}

// RouterKeyFile is the router's identity in the data dir (an Ed25519
// seed, 0600): its libp2p key and its mesh key.
const RouterKeyFile = "router/identity.key"

// One is a running sam-one.
type One struct {
	cp        *controlplane.Opened
	Router    *meshrouter.Router
	ring      *meshconsole.Ring
	agents    *meshconsole.Agents
	log       *slog.Logger
	name      string // the router's member name
	priv      ed25519.PrivateKey
	cred      atomic.Pointer[string]
	credMu    sync.Mutex
	exp       map[string]time.Time // member → expiry of the last credential issued to it
	mux       *http.ServeMux
	tokenFile string
}

// Start opens the control plane, enrols and starts the router, and
// makes the console; Serve serves them.
func Start(ctx context.Context, o Options) (_ *One, err error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.RouterName == "" {
		o.RouterName = "router"
	}
	one := &One{ring: meshconsole.NewRing(meshconsole.DefaultRingSize), agents: meshconsole.NewAgents(meshconsole.DefaultAgentRows, meshconsole.DefaultAgentPerMember),
		log: o.Log, name: o.RouterName, exp: map[string]time.Time{}, tokenFile: filepath.Join(o.DataDir, controlplane.AdminTokenFile)}
	cp, err := controlplane.Open(controlplane.Options{DataDir: o.DataDir, Store: o.Store, Listen: o.Listen, Name: o.Name, Log: o.Log,
		Refused: func(r controlplane.Refusal) {
			one.ring.Add(api.MeshRefusal{At: r.At, By: "control-plane", What: r.What, Who: r.Name, Reason: r.Reason})
		},
		Issued: func(m string, exp time.Time) {
			one.credMu.Lock()
			one.exp[m] = exp
			one.credMu.Unlock()
		},
		// Members' reports of their agents' refusals: checked, bounded
		// and rate-limited per member by the control plane.
		Reported: one.agents.Add})
	if err != nil {
		return nil, err
	}
	one.cp = cp
	defer func() {
		if err != nil {
			cp.Close()
		}
	}()
	if one.priv, err = routerKey(filepath.Join(o.DataDir, RouterKeyFile)); err != nil {
		return nil, err
	}
	exp, err := one.issue(ctx)
	if errors.Is(err, errdefs.ErrConflict) {
		return nil, fmt.Errorf("the router's credential: %w: %s is not the key it enrolled with; restore it, or give the router another --router-name", err, filepath.Join(o.DataDir, RouterKeyFile))
	}
	if err != nil {
		return nil, fmt.Errorf("the router's credential: %w", err)
	}
	key, err := meshrouter.Identity(one.priv)
	if err != nil {
		return nil, err
	}
	verify := func(c string) (meshcred.Claims, error) {
		// Every admission question; the store answers in well under this.
		vctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return cp.Server.VerifyCredential(vctx, c)
	}
	if one.Router, err = meshrouter.New(key, o.RouterListen, verify, func() string { return *one.cred.Load() }); err != nil {
		return nil, fmt.Errorf("the router: %w", err)
	}
	one.Router.Gate.OnRefusal(func(p peer.ID, why string) {
		one.ring.Add(api.MeshRefusal{At: time.Now(), By: "router", What: "peer", Who: p.String(), Reason: why})
	})
	go one.renew(ctx, exp)

	c := &meshconsole.Console{Sessions: console.NewSessionsCookie(cp.AdminToken, meshconsole.CookieName), IsAdmin: one.isAdmin, State: one.State, TokenFile: one.tokenFile}
	one.mux = http.NewServeMux()
	c.Register(one.mux)
	// Everything else is the control plane's API, as sam-control-plane
	// serves it: the operator's writes need the admin token itself, never
	// the console's session.
	one.mux.Handle("/", cp.Server.Handler())
	return one, nil
}

// Serve serves the API and the console until ctx ends, then stops the
// router and closes the store. ready, if set, is given the API's address.
func (one *One) Serve(ctx context.Context, ready func(addr string)) error {
	defer one.cp.Close()
	defer one.Router.Close()
	return one.cp.Serve(ctx, one.mux, ready)
}

// Close stops what Start started, for a One never served.
func (one *One) Close() error {
	return errors.Join(one.Router.Close(), one.cp.Close())
}

// RouterAddrs are the router's addresses with its peer ID, for members'
// --router.
func (one *One) RouterAddrs() []string {
	var out []string
	for _, a := range one.Router.Host.Addrs() {
		out = append(out, fmt.Sprintf("%s/p2p/%s", a, one.Router.Host.ID()))
	}
	return out
}

func (one *One) isAdmin(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(one.cp.AdminToken)) == 1
}

// issue gets the router a credential from the control plane in-process.
func (one *One) issue(ctx context.Context) (time.Time, error) {
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tok, c, err := one.cp.Server.IssueOwn(ictx, one.name, one.priv.Public().(ed25519.PublicKey))
	if err != nil {
		return time.Time{}, err
	}
	one.cred.Store(&tok)
	return c.Expires, nil
}

// renew renews the router's credential at two thirds of its life (as
// internal/sam/membership renews a member's), retrying every 10 s on a
// failure (a store that is down; a revoked router, which keeps failing
// and says so) while the one it has lasts.
func (one *One) renew(ctx context.Context, exp time.Time) {
	taken := time.Now()
	for {
		wait := exp.Sub(taken) * 2 / 3
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(taken.Add(wait))):
		}
		for {
			next, err := one.issue(ctx)
			if err == nil {
				taken, exp = time.Now(), next
				break
			}
			if ctx.Err() != nil {
				return
			}
			one.log.Error("the router's credential not renewed; retrying in 10 s", "expires", exp, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Second):
			}
		}
	}
}

// State is what the console shows (GET /v1/console).
func (one *One) State(ctx context.Context) (api.MeshConsole, error) {
	out := api.MeshConsole{Members: []api.MeshConsoleMember{}, Refusals: one.ring.List(), AgentRefusals: one.agents.List(),
		Router: api.MeshConsoleRouter{Member: one.name, PeerID: one.Router.Host.ID().String(), Addrs: one.RouterAddrs()}}
	ms, err := one.cp.Store.Mesh().ListMeshMembers(ctx)
	if err != nil {
		return out, err
	}
	net := one.Router.Host.Network()
	one.credMu.Lock()
	exp := maps.Clone(one.exp)
	one.credMu.Unlock()
	for _, m := range ms {
		row := api.MeshConsoleMember{Name: m.Name, EnrolledAt: m.EnrolledAt, RevokedAt: m.RevokedAt, CredentialExpires: exp[m.Name],
			RefusalsDropped: one.agents.Dropped(m.Name)}
		if id, err := peerOf(m.PublicKey); err == nil {
			row.PeerID = id.String()
			// Connected as this member: connected now, and the credential
			// it presented (bound to this very key, checked now) is this
			// member's.
			if m.Name == one.name {
				row.Connected = true // the router itself
			} else if net.Connectedness(id) == network.Connected {
				name, ok := one.Router.Gate.Member(id)
				row.Connected = ok && name == m.Name
			}
		}
		out.Members = append(out.Members, row)
	}
	p, err := one.cp.Store.Mesh().GetMeshPolicy(ctx)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		out.Policy.Principals = []api.MeshConsolePrincipal{}
	case err != nil:
		return out, err
	default:
		out.Policy.Version, out.Policy.SetAt = p.Version, p.SetAt
		out.Policy.Principals, err = meshconsole.Principals(p.Document)
		if err != nil {
			out.Policy.Error = err.Error()
		}
	}
	return out, nil
}

// peerOf is the libp2p peer ID of a member's key (standard base64): a
// member's libp2p key is its mesh key (meshrouter.Identity).
func peerOf(b64 string) (peer.ID, error) {
	pub, err := decodeB64Key(b64)
	if err != nil {
		return "", err
	}
	k, err := crypto.UnmarshalEd25519PublicKey(pub)
	if err != nil {
		return "", err
	}
	return peer.IDFromPublicKey(k)
}

// routerKey loads the router's Ed25519 key, or makes it on the first
// start (0600; its directory 0700).
func routerKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if len(b) != ed25519.SeedSize {
			return nil, fmt.Errorf("%s: %d bytes, want an Ed25519 seed (%d)", path, len(b), ed25519.SeedSize)
		}
		os.Chmod(path, 0o600)
		return ed25519.NewKeyFromSeed(b), nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	return priv, secretfile.Write(path, priv.Seed())
}

func decodeB64Key(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("not an Ed25519 public key")
	}
	return b, nil
}
