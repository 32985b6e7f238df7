package api

import "time"

// sam-one's console (internal/sam/meshconsole): GET /v1/console, what the page
// shows, read with the console's session cookie or the admin token.

// MeshConsole is GET /v1/console's answer.
type MeshConsole struct {
	Router   MeshConsoleRouter   `json:"router"`
	Members  []MeshConsoleMember `json:"members"`
	Policy   MeshConsolePolicy   `json:"policy"`
	Refusals []MeshRefusal       `json:"refusals"`
	// AgentRefusals are what the members reported their agents were
	// refused (internal/sam/refusals), newest first.
	AgentRefusals []MeshAgentRefusal `json:"agent_refusals"`
}

// MeshConsoleRouter is sam-one's own router.
type MeshConsoleRouter struct {
	Member string   `json:"member"`
	PeerID string   `json:"peer_id"`
	Addrs  []string `json:"addrs"`
}

// MeshConsoleMember is a member as the console shows it: CredentialExpires
// is the expiry of the last credential issued to it since this process
// started (absent: none yet); Connected whether it is connected to the
// router now, as a member (its credential checked, bound to its peer ID).
type MeshConsoleMember struct {
	Name              string    `json:"name"`
	PeerID            string    `json:"peer_id"`
	EnrolledAt        time.Time `json:"enrolled_at"`
	RevokedAt         time.Time `json:"revoked_at,omitzero"`
	CredentialExpires time.Time `json:"credential_expires,omitzero"`
	Connected         bool      `json:"connected"`
	// RefusalsDropped counts this member's agents' refusals that are not
	// itemised in AgentRefusals: its own tables were full (a flood), or
	// the console let its oldest rows go.
	RefusalsDropped uint64 `json:"refusals_dropped,omitempty"`
}

// MeshConsolePolicy is the policy in force (version 0: none set, nothing
// granted) and, per bound principal, what its roles grant.
type MeshConsolePolicy struct {
	Version    int64                  `json:"version"`
	SetAt      time.Time              `json:"set_at,omitzero"`
	Principals []MeshConsolePrincipal `json:"principals"`
	// Error is set if the document in force does not parse (it cannot
	// happen for one the control plane accepted).
	Error string `json:"error,omitempty"`
}

// MeshConsolePrincipal is one bound principal: its roles, and the
// services and egress they grant, deduplicated in the document's order.
type MeshConsolePrincipal struct {
	Name          string   `json:"name"`
	Roles         []string `json:"roles"`
	Services      []string `json:"services"`
	Egress        []string `json:"egress"`
	EgressPrivate []string `json:"egress_private,omitempty"`
}

// MeshRefusal is one refusal: by the control plane ("control-plane": an
// enrolment, a refresh or a credential refused) or by the router
// ("router": a peer refused by its gate), newest first.
type MeshRefusal struct {
	Seq    int64     `json:"seq"`
	At     time.Time `json:"at"`
	By     string    `json:"by"`
	What   string    `json:"what"`
	Who    string    `json:"who,omitempty"`
	Reason string    `json:"reason"`
}

// MeshAgentRefusal is one row a member reported: what its agent
// (Principal) was refused, by its boundary or its sam-node, how often,
// first and last.
type MeshAgentRefusal struct {
	Member string `json:"member"`
	RefusalRow
}
