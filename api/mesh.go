package api

import (
	"encoding/json"
	"time"
)

// The control plane's API (sam-control-plane, internal/controlplane):
// enrolment and refresh of mesh members, the keys their credentials are
// checked with, and the operator's bootstrap tokens and members.

// Challenge is the answer of POST /v1/challenge: a single-use nonce an
// enrolment or refresh must sign within ExpiresInS seconds.
type Challenge struct {
	Challenge  string `json:"challenge"`
	ExpiresInS int    `json:"expires_in_s"`
}

// EnrolRequest is the body of POST /v1/enrol: a bootstrap token or an
// OpenID Connect ID token of the control plane's issuer (one of the two),
// the member's name and Ed25519 public key (standard base64), and its
// signature (base64) of the challenge for this control plane.
type EnrolRequest struct {
	Token     string `json:"token,omitempty"`
	OIDCToken string `json:"oidc_token,omitempty"`
	Name      string `json:"name"`
	PublicKey string `json:"public_key"`
	Challenge string `json:"challenge"`
	Signature string `json:"signature"`
}

// RefreshRequest is the body of POST /v1/refresh: an enrolled member's
// name and its signature of a fresh challenge with its enrolled key.
type RefreshRequest struct {
	Name      string `json:"name"`
	Challenge string `json:"challenge"`
	Signature string `json:"signature"`
}

// Credential is what an enrolment or a refresh answers: the member's
// credential (a JWT bound to its key) and what it is checked against.
type Credential struct {
	Member     string    `json:"member"`
	Credential string    `json:"credential"`
	Expires    time.Time `json:"expires"`
	Keys       MeshKeys  `json:"keys"`
}

// MeshKeys is GET /v1/keys: the control plane's public keys (a JWK set)
// and the members revoked, which every member fetches every few seconds
// and checks credentials against offline.
type MeshKeys struct {
	Issuer  string          `json:"issuer"`
	Keys    json.RawMessage `json:"keys"`
	Revoked []string        `json:"revoked"`
}

// MeshTokenRequest is the body of POST /v1/tokens (operator): a bootstrap
// token good for MaxUses enrolments for TTLSeconds.
type MeshTokenRequest struct {
	MaxUses    int `json:"max_uses"`
	TTLSeconds int `json:"ttl_s"`
}

// MeshToken is a bootstrap token, shown once: the control plane keeps
// only its SHA-256.
type MeshToken struct {
	Token   string    `json:"token"`
	MaxUses int       `json:"max_uses"`
	Expires time.Time `json:"expires"`
}

// MeshMember is one member as GET /v1/members lists it.
type MeshMember struct {
	Name       string    `json:"name"`
	PublicKey  string    `json:"public_key"`
	EnrolledAt time.Time `json:"enrolled_at"`
	RevokedAt  time.Time `json:"revoked_at,omitzero"`
}

// MeshPolicy is GET /v1/policy: the mesh's policy (roles, bindings,
// egress; the YAML or JSON internal/policy parses) as the operator last
// set it with PUT /v1/policy, under its version (1, 2, …; 0 and an empty
// document: none set yet, which grants nothing). The answer's ETag is the
// version, so a member polling with If-None-Match gets a 304 while it is
// unchanged.
type MeshPolicy struct {
	Version  int64     `json:"version"`
	Document string    `json:"document"`
	SetAt    time.Time `json:"set_at,omitzero"`
}

// KeyRotateRequest is the body of POST /v1/keys/rotate (operator): how
// long the key being replaced still verifies (GraceSeconds; absent: the
// control plane's default, longer than a credential lives; 0: at once,
// for a key that leaked).
type KeyRotateRequest struct {
	GraceSeconds *int `json:"grace_s,omitempty"`
}

// KeyRotation answers POST /v1/keys/rotate: the new signing key's ID, when
// the replaced one stops verifying, and the keys members fetch from now.
type KeyRotation struct {
	Current    string    `json:"current"`
	RetiredKey string    `json:"retired_key"`
	RetiresAt  time.Time `json:"retires_at"`
	Keys       MeshKeys  `json:"keys"`
}

// SAMServedPath is where sandstormd tells the sam-node of its machine, on
// sam-node's agent listener and in a request naming no principal, what
// its sandboxes serve (PUT, a SAMServedList replacing the set before).
const SAMServedPath = "/sam/v1/served"

// SAMServed is one sandbox's mesh service (a template's Serve): kind "mcp"
// or "inference", its name, and the URL on the node's gateway where the
// sandbox serves it (an MCP endpoint, or an OpenAI-compatible base URL).
type SAMServed struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
	URL  string `json:"url"`
}

// SAMServedList is the body of PUT SAMServedPath.
type SAMServedList struct {
	Services []SAMServed `json:"services"`
}
