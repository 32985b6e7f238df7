// Package meshcred is the mesh's credentials (issue 17, item 1): what a
// control plane issues to a member it enrolled, and what every other
// member checks offline before it serves that member anything.
//
// A credential is a JSON Web Token (RFC 7519) signed with Ed25519 (EdDSA,
// RFC 8037) by one of the control plane's keys, named by its "kid". It is
// short-lived ("exp") and bound to the member's own Ed25519 key by a
// confirmation claim ("cnf" with the key as a JWK, RFC 7800): a stolen
// credential is useless without that key, which never leaves the member.
// The public SAM uses Biscuit tokens (biscuit-go) for the same; the module
// proxy here refuses biscuit-go (403 for every version, checked on
// 2026-12-02), so this is the standard format go-jose implements.
//
// The control plane's keys rotate with a grace period (Issuer.Rotate): a
// new key signs from then on, the old one still verifies until the grace
// ends — longer than a credential lives, so none signed before the
// rotation is refused early. Members verify against a KeySet, the public
// half of every key still in use, which they fetch and keep.
//
// Proof of possession: every enrolment and refresh signs a fresh,
// single-use challenge (Challenges) with the member's key, so a replayed
// or stale request is refused (SignChallenge, VerifyChallenge).
package meshcred

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Errors a verification answers; each wraps ErrInvalid.
var (
	ErrInvalid    = errors.New("credential refused")
	ErrUnknownKey = fmt.Errorf("%w: signed by a key this member does not know (revoked, or past its grace)", ErrInvalid)
	ErrExpired    = fmt.Errorf("%w: expired", ErrInvalid)
	ErrRevoked    = fmt.Errorf("%w: revoked", ErrInvalid)
)

// Claims is what a verified credential says.
type Claims struct {
	// Member is who it was issued to (its "sub").
	Member string
	// Key is the member's own key the credential is bound to: the peer
	// presenting it must prove it holds the private half.
	Key ed25519.PublicKey
	// ID is the credential's own ID ("jti"), what a revocation names.
	ID      string
	Expires time.Time
}

// confirmation is RFC 7800's "cnf" claim with the key as a JWK.
type confirmation struct {
	JWK jose.JSONWebKey `json:"jwk"`
}

type extra struct {
	Cnf confirmation `json:"cnf"`
}

type signingKey struct {
	id     string
	priv   ed25519.PrivateKey
	retire time.Time // zero: the current key
}

// Issuer is a control plane's signing keys. The zero value is not
// usable; NewIssuer makes one with a fresh key.
type Issuer struct {
	name string
	mu   sync.Mutex
	keys []signingKey // the current first
}

// NewIssuer returns an issuer named name (its credentials' "iss") with a
// new key.
func NewIssuer(name string) (*Issuer, error) {
	i := &Issuer{name: name}
	return i, i.Rotate(0, time.Now())
}

// Rotate makes a new current key; the one it replaces verifies until now
// + grace and is then dropped, as are older keys past theirs.
func (i *Issuer) Rotate(grace time.Duration, now time.Time) error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	id := make([]byte, 8)
	rand.Read(id)
	i.mu.Lock()
	defer i.mu.Unlock()
	keys := []signingKey{{id: hex.EncodeToString(id), priv: priv}}
	for n, k := range i.keys {
		if n == 0 {
			k.retire = now.Add(grace)
		}
		if k.retire.After(now) {
			keys = append(keys, k)
		}
	}
	i.keys = keys
	return nil
}

// Rotated returns a copy of the issuer rotated as Rotate would, leaving
// i as it was: a control plane saves the copy's keys first and serves it
// only once they are on disk, so a rotation that could not be saved is
// not half made (a restart would otherwise go back to the old key).
func (i *Issuer) Rotated(grace time.Duration, now time.Time) (*Issuer, error) {
	i.mu.Lock()
	c := &Issuer{name: i.name, keys: append([]signingKey(nil), i.keys...)}
	i.mu.Unlock()
	return c, c.Rotate(grace, now)
}

// CurrentKeyID is the ID ("kid") of the key that signs now.
func (i *Issuer) CurrentKeyID() string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.keys[0].id
}

// storedKey is a signing key as MarshalKeys writes it.
type storedKey struct {
	ID     string    `json:"id"`
	Seed   []byte    `json:"seed"`
	Retire time.Time `json:"retire,omitzero"`
}

// MarshalKeys is the issuer's private keys, for a file of mode 0600: a
// restarted control plane signs and verifies with the same keys, so no
// member's credential is refused because of a restart.
func (i *Issuer) MarshalKeys() ([]byte, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	out := make([]storedKey, len(i.keys))
	for n, k := range i.keys {
		out[n] = storedKey{ID: k.id, Seed: k.priv.Seed(), Retire: k.retire}
	}
	return json.Marshal(out)
}

// LoadIssuer is the issuer named name with the keys MarshalKeys wrote.
func LoadIssuer(name string, data []byte) (*Issuer, error) {
	var in []storedKey
	if err := json.Unmarshal(data, &in); err != nil {
		return nil, fmt.Errorf("issuer keys: %w", err)
	}
	if len(in) == 0 || !in[0].Retire.IsZero() {
		return nil, errors.New("issuer keys: no current key first")
	}
	i := &Issuer{name: name}
	for _, k := range in {
		if len(k.Seed) != ed25519.SeedSize || k.ID == "" {
			return nil, fmt.Errorf("issuer keys: key %q is not an Ed25519 seed", k.ID)
		}
		i.keys = append(i.keys, signingKey{id: k.ID, priv: ed25519.NewKeyFromSeed(k.Seed), retire: k.Retire})
	}
	return i, nil
}

// Issue signs a credential for member, bound to its key, valid for ttl
// from now.
func (i *Issuer) Issue(member string, key ed25519.PublicKey, ttl time.Duration, now time.Time) (string, Claims, error) {
	if len(key) != ed25519.PublicKeySize {
		return "", Claims{}, fmt.Errorf("member key: %d bytes, want an Ed25519 public key (%d)", len(key), ed25519.PublicKeySize)
	}
	i.mu.Lock()
	cur := i.keys[0]
	i.mu.Unlock()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: jose.JSONWebKey{Key: cur.priv, KeyID: cur.id}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return "", Claims{}, err
	}
	jti := make([]byte, 16)
	rand.Read(jti)
	c := Claims{Member: member, Key: key, ID: hex.EncodeToString(jti), Expires: now.Add(ttl).Truncate(time.Second)}
	std := jwt.Claims{Issuer: i.name, Subject: member, ID: c.ID, IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(c.Expires)}
	tok, err := jwt.Signed(signer).Claims(std).Claims(extra{Cnf: confirmation{JWK: jose.JSONWebKey{Key: key}}}).Serialize()
	return tok, c, err
}

// KeySet is the public half of an issuer's keys still in use: what a
// member verifies credentials with, offline.
type KeySet struct {
	Issuer string             `json:"issuer"`
	Keys   jose.JSONWebKeySet `json:"keys"`
}

// KeySet returns the issuer's public keys: the current one and those in
// their grace.
func (i *Issuer) KeySet(now time.Time) KeySet {
	i.mu.Lock()
	defer i.mu.Unlock()
	ks := KeySet{Issuer: i.name}
	for _, k := range i.keys {
		if k.retire.IsZero() || k.retire.After(now) {
			ks.Keys.Keys = append(ks.Keys.Keys, jose.JSONWebKey{Key: k.priv.Public(), KeyID: k.id, Algorithm: string(jose.EdDSA), Use: "sig"})
		}
	}
	return ks
}

// Verify checks a credential offline: signed by a key of ks, by its
// issuer, within its validity at now, and not revoked (revoked, which may
// be nil, is asked about the credential's claims: its member, its ID). It returns what the credential says; the caller must still check
// that the peer holds Claims.Key (a signed challenge, or the key of the
// authenticated connection).
func (ks KeySet) Verify(token string, now time.Time, revoked func(Claims) bool) (Claims, error) {
	tok, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if len(tok.Headers) != 1 {
		return Claims{}, fmt.Errorf("%w: %d signatures, want 1", ErrInvalid, len(tok.Headers))
	}
	keys := ks.Keys.Key(tok.Headers[0].KeyID)
	if len(keys) != 1 {
		return Claims{}, ErrUnknownKey
	}
	var std jwt.Claims
	var ext extra
	if err := tok.Claims(keys[0].Key, &std, &ext); err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := std.ValidateWithLeeway(jwt.Expected{Issuer: ks.Issuer, Time: now}, Leeway); err != nil {
		if errors.Is(err, jwt.ErrExpired) {
			return Claims{}, ErrExpired
		}
		return Claims{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if std.Expiry == nil || std.Subject == "" || std.ID == "" {
		return Claims{}, fmt.Errorf("%w: no expiry, subject or ID", ErrInvalid)
	}
	key, ok := ext.Cnf.JWK.Key.(ed25519.PublicKey)
	if !ok {
		return Claims{}, fmt.Errorf("%w: not bound to an Ed25519 key (cnf)", ErrInvalid)
	}
	c := Claims{Member: std.Subject, Key: key, ID: std.ID, Expires: std.Expiry.Time()}
	if revoked != nil && revoked(c) {
		return Claims{}, ErrRevoked
	}
	return c, nil
}

// Leeway is how far members' clocks may disagree when a credential's
// times are checked: a few seconds, against credentials that live for
// minutes.
const Leeway = 5 * time.Second

// challengeContext separates the mesh's challenge signatures from any
// other use of a member's key.
const challengeContext = "sam enrolment challenge v1\x00"

// SignChallenge is a member's proof that it holds priv: a signature over
// the challenge and the audience (the control plane's name), so that a
// signature made for one control plane is no proof for another.
func SignChallenge(priv ed25519.PrivateKey, challenge, audience string) []byte {
	return ed25519.Sign(priv, []byte(challengeContext+audience+"\x00"+challenge))
}

// VerifyChallenge checks SignChallenge's signature.
func VerifyChallenge(pub ed25519.PublicKey, challenge, audience string, sig []byte) bool {
	return len(pub) == ed25519.PublicKeySize && ed25519.Verify(pub, []byte(challengeContext+audience+"\x00"+challenge), sig)
}

// Challenges hands out single-use challenges that expire: a control
// plane's defence against a replayed or stale enrolment. They are kept in
// memory — a restart forgets the outstanding ones, which only makes their
// members ask again.
type Challenges struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[string]time.Time // challenge → when it expires
}

// NewChallenges returns challenges that live for ttl.
func NewChallenges(ttl time.Duration) *Challenges {
	return &Challenges{ttl: ttl, m: map[string]time.Time{}}
}

// New returns a fresh challenge.
func (c *Challenges) New(now time.Time) string {
	b := make([]byte, 24)
	rand.Read(b)
	s := base64.RawURLEncoding.EncodeToString(b)
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, exp := range c.m {
		if !exp.After(now) {
			delete(c.m, k)
		}
	}
	c.m[s] = now.Add(c.ttl)
	return s
}

// Spend reports whether s is a challenge handed out, unexpired and not
// spent before, and spends it: true at most once per challenge.
func (c *Challenges) Spend(s string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	exp, ok := c.m[s]
	delete(c.m, s)
	return ok && exp.After(now)
}
