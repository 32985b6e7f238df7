// Package controlplane is the mesh's control plane (issue 17, item 1;
// sam-control-plane): it enrols nodes as members and issues the
// credentials every other member checks offline (internal/sam/meshcred).
//
// Enrolment: a node asks for a challenge, signs it with its own Ed25519
// key for this control plane (meshcred.SignChallenge, audience = the
// control plane's name), and sends the signature with a bootstrap token
// the operator made (POST /v1/tokens: max uses, expiry, kept only as its
// SHA-256, a use spent in one statement so two enrolments cannot share
// the last one). A replayed or stale challenge is refused: each is good
// once, for a minute. The answer is a short-lived credential bound to the
// node's key, and the keys to check any member's with. A member renews
// its credential the same way without a token (POST /v1/refresh), proving
// again that it holds its enrolled key; a revoked member cannot.
//
// Revocation reaches every member within seconds: GET /v1/keys, which
// members fetch every few seconds, lists the revoked members beside the
// keys, and a member refuses a revoked member's credential whatever its
// expiry says.
//
// Enrolment may present an OpenID Connect ID token instead of a bootstrap
// token (oidc.go); the signed challenge is required all the same. The
// control plane serves the mesh's one policy to its members (policy.go)
// and rotates its signing keys with a grace (keys.go).
package controlplane

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/httpjson"
	"sandstorm/internal/sam/meshcred"
	"sandstorm/internal/store"
)

// Config is a control plane's.
type Config struct {
	// Name is the control plane's name: its credentials' issuer, and the
	// audience of the challenges members sign.
	Name   string
	Store  *store.Store
	Issuer *meshcred.Issuer
	// AdminToken is the operator's: it makes bootstrap tokens, lists and
	// revokes members.
	AdminToken string
	// CredentialTTL is how long a credential lives (default 10 min):
	// short, since members refresh, and a revocation that a member has
	// not fetched yet is bounded by it too.
	CredentialTTL time.Duration
	// ChallengeTTL is how long a challenge may be signed (default 1 min).
	ChallengeTTL time.Duration
	// DefaultGrace is how long a rotated-out key still verifies when the
	// operator names no grace (default twice CredentialTTL: every
	// credential it signed expires within it).
	DefaultGrace time.Duration
	// SaveKeys, if set, is given the issuer's keys (meshcred's
	// MarshalKeys) after a rotation, before the new key signs anything:
	// Serve writes them to a 0600 file, so a restart keeps the rotation.
	SaveKeys func([]byte) error
	// OIDC, if set, lets a node enrol with an ID token of that issuer
	// instead of a bootstrap token (oidc.go).
	OIDC *OIDCConfig
	// Refused, if set, is told of every refusal of an enrolment, a
	// refresh or a credential (sam-one's console lists them); Issued of
	// every credential issued, with its expiry. Both are called on the
	// request's goroutine and must not block.
	Refused func(Refusal)
	Issued  func(member string, expires time.Time)
	// Reported, if set, is given every member's report of its agents'
	// refusals, checked (refusals.go); it is called on the request's
	// goroutine and must not block. nil: reports are taken and dropped.
	Reported func(member string, rep api.RefusalReport)
	Now      func() time.Time
	Log      *slog.Logger
}

// Refusal is one request the control plane refused, and why.
type Refusal struct {
	At time.Time
	// What was refused: "enrol", "refresh" or "credential" (a member's
	// credential presented for the policy).
	What string
	// Name is the member the request named or the credential is of ("":
	// none).
	Name   string
	Reason string
}

// refuse logs a refusal, tells the Refused hook and answers err.
func (s *Server) refuse(w http.ResponseWriter, what, name string, err error) {
	s.cfg.Log.Warn(what+" refused", "name", name, "why", err)
	if s.cfg.Refused != nil {
		s.cfg.Refused(Refusal{At: s.cfg.Now(), What: what, Name: name, Reason: err.Error()})
	}
	errdefs.WriteHTTP(w, err)
}

// Server is the control plane's HTTP API.
type Server struct {
	cfg  Config
	ch   *meshcred.Challenges
	iss  atomic.Pointer[meshcred.Issuer]
	oidc *oidcVerifier
	// rotating serialises rotations: each starts from the keys the last
	// one saved.
	rotating sync.Mutex
	reports  reportLimits
}

// New returns a control plane.
func New(cfg Config) *Server {
	if cfg.CredentialTTL <= 0 {
		cfg.CredentialTTL = 10 * time.Minute
	}
	if cfg.ChallengeTTL <= 0 {
		cfg.ChallengeTTL = time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.DefaultGrace <= 0 {
		cfg.DefaultGrace = 2 * cfg.CredentialTTL
	}
	s := &Server{cfg: cfg, ch: meshcred.NewChallenges(cfg.ChallengeTTL)}
	s.iss.Store(cfg.Issuer)
	if cfg.OIDC != nil {
		s.oidc = newOIDCVerifier(*cfg.OIDC, cfg.Now)
	}
	return s
}

// maxBody bounds every request body: each is a few hundred bytes.
const maxBody = 16 << 10

// Handler serves the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/challenge", s.challenge)
	mux.HandleFunc("POST /v1/enrol", s.enrol)
	mux.HandleFunc("POST /v1/refresh", s.refresh)
	mux.HandleFunc("GET /v1/keys", s.keys)
	mux.HandleFunc("POST /v1/tokens", s.admin(s.createToken))
	mux.HandleFunc("GET /v1/members", s.admin(s.members))
	mux.HandleFunc("POST /v1/members/{name}/revoke", s.admin(s.revoke))
	mux.HandleFunc("POST /v1/keys/rotate", s.admin(s.rotate))
	mux.HandleFunc("PUT /v1/policy", s.admin(s.putPolicy))
	mux.HandleFunc("GET /v1/policy", s.getPolicy)
	mux.HandleFunc("POST "+api.RefusalsPath, s.postRefusals)
	return mux
}

func (s *Server) challenge(w http.ResponseWriter, r *http.Request) {
	httpjson.Write(w, http.StatusOK, api.Challenge{Challenge: s.ch.New(s.cfg.Now()), ExpiresInS: int(s.cfg.ChallengeTTL / time.Second)})
}

// nameRE is a member's name: what a node is called in the mesh (its
// sandstormd node name, or its host's), lower case.
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,62}$`)

func (s *Server) enrol(w http.ResponseWriter, r *http.Request) {
	var req api.EnrolRequest
	if err := httpjson.Decode(w, r, &req, maxBody); err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	if !nameRE.MatchString(req.Name) {
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrBadInput, "name %q: lower-case letters, digits, '.' and '-', at most 63", req.Name))
		return
	}
	switch {
	case (req.Token == "") == (req.OIDCToken == ""):
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrBadInput, "enrol with a bootstrap token (token) or an OpenID Connect ID token (oidc_token): one of the two"))
		return
	case req.OIDCToken != "" && s.oidc == nil:
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrUnauthorized, "this control plane takes no OpenID Connect ID tokens (serve --oidc-issuer): enrol with a bootstrap token"))
		return
	}
	pub, ok := s.provenKey(w, "enrol", req.Name, req.PublicKey, req.Challenge, req.Signature)
	if !ok {
		return
	}
	// The name is checked before the token is spent, so a name taken by
	// another key costs the operator's token nothing.
	if m, err := s.cfg.Store.Mesh().GetMeshMember(r.Context(), req.Name); err == nil {
		if m.PublicKey == req.PublicKey && m.RevokedAt.IsZero() {
			s.refuse(w, "enrol", req.Name, errdefs.New(errdefs.ErrConflict, "member %s is enrolled already with this key: renew its credential with POST /v1/refresh", req.Name))
		} else {
			s.refuse(w, "enrol", req.Name, errdefs.New(errdefs.ErrConflict, "member name %s is taken (by another key, or revoked): enrol under another name", req.Name))
		}
		return
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		errdefs.WriteHTTP(w, err)
		return
	}
	now := s.cfg.Now()
	by := "bootstrap token"
	if req.OIDCToken != "" {
		// Checked in full before it is spent: a refused one costs nothing.
		who, exp, err := s.oidc.identity(r.Context(), req.OIDCToken)
		if err == nil {
			err = s.cfg.Store.Mesh().SpendMeshIDToken(r.Context(), hashIDToken(req.OIDCToken), exp, now)
			if errors.Is(err, errdefs.ErrExists) {
				err = errdefs.New(errdefs.ErrUnauthorized, "this ID token has enrolled a member already: sign in again for another")
			}
		}
		if err != nil {
			s.refuse(w, "enrol", req.Name, err)
			return
		}
		by = "oidc " + who
	} else if err := s.cfg.Store.Mesh().SpendMeshToken(r.Context(), hashToken(req.Token), now); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			s.refuse(w, "enrol", req.Name, errdefs.New(errdefs.ErrUnauthorized, "bootstrap token unknown, spent or expired: ask the operator for another (sam-control-plane token create)"))
			return
		}
		errdefs.WriteHTTP(w, err)
		return
	}
	if err := s.cfg.Store.Mesh().PutMeshMember(r.Context(), store.MeshMember{Name: req.Name, PublicKey: req.PublicKey, EnrolledAt: now}); err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	s.cfg.Log.Info("member enrolled", "name", req.Name, "by", by)
	s.issue(w, r, req.Name, pub)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	var req api.RefreshRequest
	if err := httpjson.Decode(w, r, &req, maxBody); err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	m, err := s.cfg.Store.Mesh().GetMeshMember(r.Context(), req.Name)
	if errors.Is(err, errdefs.ErrNotFound) {
		s.refuse(w, "refresh", req.Name, errdefs.New(errdefs.ErrUnauthorized, "no member %q: enrol first (POST /v1/enrol with a bootstrap token)", req.Name))
		return
	}
	if err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	pub, ok := s.provenKey(w, "refresh", req.Name, m.PublicKey, req.Challenge, req.Signature)
	if !ok {
		return
	}
	if !m.RevokedAt.IsZero() {
		s.refuse(w, "refresh", req.Name, errdefs.New(errdefs.ErrForbidden, "member %s was revoked at %s", m.Name, m.RevokedAt.Format(time.RFC3339)))
		return
	}
	s.issue(w, r, m.Name, pub)
}

// provenKey decodes key, the member's, and checks that sig proves its
// holder signed challenge (proves); a failure is answered, a bad proof as
// a refusal of op for name, and ok is false.
func (s *Server) provenKey(w http.ResponseWriter, op, name, key, challenge, sig string) (pub ed25519.PublicKey, ok bool) {
	pub, err := decodeKey(key)
	if err != nil {
		errdefs.WriteHTTP(w, err)
		return nil, false
	}
	if err := s.proves(pub, challenge, sig); err != nil {
		s.refuse(w, op, name, err)
		return nil, false
	}
	return pub, true
}

// proves checks that sig is pub's signature of a challenge this control
// plane handed out, unexpired and never spent before (it is spent now,
// whatever the signature: a challenge is good for one try).
func (s *Server) proves(pub ed25519.PublicKey, challenge, sig string) error {
	if !s.ch.Spend(challenge, s.cfg.Now()) {
		return errdefs.New(errdefs.ErrUnauthorized, "challenge unknown, spent or expired: sign a fresh one (POST /v1/challenge)")
	}
	b, err := base64.StdEncoding.DecodeString(sig)
	if err != nil || !meshcred.VerifyChallenge(pub, challenge, s.cfg.Name, b) {
		return errdefs.New(errdefs.ErrUnauthorized, "the signature is not this key's of the challenge for control plane %s", s.cfg.Name)
	}
	return nil
}

func (s *Server) issue(w http.ResponseWriter, r *http.Request, name string, pub ed25519.PublicKey) {
	tok, c, err := s.iss.Load().Issue(name, pub, s.cfg.CredentialTTL, s.cfg.Now())
	if err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	if s.cfg.Issued != nil {
		s.cfg.Issued(name, c.Expires)
	}
	keys, err := s.meshKeys(r)
	if err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, api.Credential{Member: name, Credential: tok, Expires: c.Expires, Keys: keys})
}

func (s *Server) keys(w http.ResponseWriter, r *http.Request) {
	keys, err := s.meshKeys(r)
	if err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, keys)
}

func (s *Server) meshKeys(r *http.Request) (api.MeshKeys, error) {
	ks := s.iss.Load().KeySet(s.cfg.Now())
	raw, err := json.Marshal(ks.Keys)
	if err != nil {
		return api.MeshKeys{}, err
	}
	ms, err := s.cfg.Store.Mesh().ListMeshMembers(r.Context())
	if err != nil {
		return api.MeshKeys{}, err
	}
	out := api.MeshKeys{Issuer: ks.Issuer, Keys: raw, Revoked: []string{}}
	for _, m := range ms {
		if !m.RevokedAt.IsZero() {
			out.Revoked = append(out.Revoked, m.Name)
		}
	}
	return out, nil
}

// Verifier is what a member checks others' credentials with: the keys
// and revocations of the control plane's last GET /v1/keys.
type Verifier struct {
	keys    meshcred.KeySet
	revoked map[string]bool
}

// NewVerifier reads a GET /v1/keys answer.
func NewVerifier(k api.MeshKeys) (*Verifier, error) {
	v := &Verifier{keys: meshcred.KeySet{Issuer: k.Issuer}, revoked: map[string]bool{}}
	if err := json.Unmarshal(k.Keys, &v.keys.Keys); err != nil {
		return nil, errdefs.New(errdefs.ErrBadInput, "the control plane's keys: %v", err)
	}
	for _, n := range k.Revoked {
		v.revoked[n] = true
	}
	return v, nil
}

// Verify checks a member's credential offline.
func (v *Verifier) Verify(credential string, now time.Time) (meshcred.Claims, error) {
	return v.keys.Verify(credential, now, func(c meshcred.Claims) bool { return v.revoked[c.Member] })
}

// admin wraps an operator's handler: the admin token, as a bearer token.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.isAdmin(r) {
			errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrUnauthorized, "this needs the control plane's admin token (Authorization: Bearer <token>; sam-control-plane writes it to <data-dir>/admin-token)"))
			return
		}
		h(w, r)
	}
}

// isAdmin reports whether r carries the admin token.
func (s *Server) isAdmin(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && s.cfg.AdminToken != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.AdminToken)) == 1
}

// MaxTokenTTL bounds a bootstrap token's life: it is a secret that
// enrols machines, and should not outlive the job of enrolling them.
const MaxTokenTTL = 7 * 24 * time.Hour

func (s *Server) createToken(w http.ResponseWriter, r *http.Request) {
	var req api.MeshTokenRequest
	if err := httpjson.Decode(w, r, &req, maxBody); err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	ttl := time.Duration(req.TTLSeconds) * time.Second
	if req.MaxUses < 1 || req.MaxUses > 10000 || ttl <= 0 || ttl > MaxTokenTTL {
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrBadInput, "max_uses 1 to 10000 and ttl_s 1 to %d, please", int(MaxTokenTTL/time.Second)))
		return
	}
	b := make([]byte, 24)
	rand.Read(b)
	tok := "samb_" + hex.EncodeToString(b)
	now := s.cfg.Now()
	exp := now.Add(ttl)
	if err := s.cfg.Store.Mesh().PutMeshToken(r.Context(), hashToken(tok), req.MaxUses, exp, now); err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	s.cfg.Log.Info("bootstrap token made", "max_uses", req.MaxUses, "expires", exp)
	httpjson.Write(w, http.StatusCreated, api.MeshToken{Token: tok, MaxUses: req.MaxUses, Expires: exp})
}

func (s *Server) members(w http.ResponseWriter, r *http.Request) {
	ms, err := s.cfg.Store.Mesh().ListMeshMembers(r.Context())
	if err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	out := api.List[api.MeshMember]{Items: []api.MeshMember{}}
	for _, m := range ms {
		out.Items = append(out.Items, api.MeshMember{Name: m.Name, PublicKey: m.PublicKey, EnrolledAt: m.EnrolledAt, RevokedAt: m.RevokedAt})
	}
	httpjson.Write(w, http.StatusOK, out)
}

func (s *Server) revoke(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := s.cfg.Store.Mesh().RevokeMeshMember(r.Context(), name, s.cfg.Now()); err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	s.cfg.Log.Info("member revoked", "name", name)
	w.WriteHeader(http.StatusNoContent)
}

// hashToken is what the store keeps of a bootstrap token.
func hashToken(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

// decodeKey reads a member's public key: standard base64 of 32 bytes.
func decodeKey(s string) (ed25519.PublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, errdefs.New(errdefs.ErrBadInput, "public_key: want the standard base64 of an Ed25519 public key (32 bytes)")
	}
	return ed25519.PublicKey(b), nil
}
