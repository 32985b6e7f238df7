package api

import (
	"encoding/json"
	"time"
)

// The control plane's API (sam-control-plane, internal/sam/controlplane):
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
// egress; the YAML or JSON internal/sam/policy parses) as the operator last
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

// MemberStatus is a mesh member's own view of its place in the mesh
// (sam-node's admin listener, GET /mesh): the routers it was given and
// how it stands with each, and its control plane. It is what a member
// "says" when something is down (issue 29): which router it cannot
// reach and since when, and whether it runs on the last good keys and
// policy.
type MemberStatus struct {
	Member string `json:"member"`
	Peer   string `json:"peer"`
	// Names are what it serves and publishes.
	Names   []string       `json:"names"`
	Routers []RouterStatus `json:"routers"`
	// ControlPlane is reachable, or why not, with when the keys were
	// last fetched (the member verifies others with those meanwhile).
	ControlPlane ControlPlaneStatus `json:"control_plane"`
}

// RouterStatus is how a member stands with one router.
type RouterStatus struct {
	Addr string `json:"addr"`
	// Joined: connected, credentials exchanged both ways, a relay slot
	// held. Since is when it joined (or, while not joined, since when it
	// has not been; zero before a first try).
	Joined bool      `json:"joined"`
	Since  time.Time `json:"since,omitzero"`
	// Epoch names the router's run (a restart makes a new one);
	// Published is true when this member's names were put on the router
	// in this epoch, Verified when it last found them all there.
	Epoch     string    `json:"epoch,omitempty"`
	Published bool      `json:"published"`
	Verified  time.Time `json:"verified,omitzero"`
	// Rejoins counts the joins after the first; Republished the
	// publishes after the first (a new epoch, a lost record, a change of
	// names).
	Rejoins     int    `json:"rejoins"`
	Republished int    `json:"republished"`
	Error       string `json:"error,omitempty"`
}

// ControlPlaneStatus is a member's view of its control plane. While it
// is unreachable the member goes on with the last good keys (KeysAt) and
// policy (PolicyVersion, PolicyStale), and its own credential while that
// lasts (CredentialExpires; it renews once a third of its life is gone).
type ControlPlaneStatus struct {
	URL               string    `json:"url"`
	Reachable         bool      `json:"reachable"`
	UnreachableSince  time.Time `json:"unreachable_since,omitzero"`
	KeysAt            time.Time `json:"keys_at,omitzero"`
	PolicyVersion     int64     `json:"policy_version"`
	PolicyStale       bool      `json:"policy_stale"`
	CredentialExpires time.Time `json:"credential_expires,omitzero"`
	Error             string    `json:"error,omitempty"`
}
