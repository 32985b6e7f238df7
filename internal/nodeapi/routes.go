package nodeapi

import (
	"fmt"
	"time"

	"sandstorm/internal/errdefs"
)

// Route is where one sandbox's traffic goes and what an ingress node
// checks before it sends it there (issue 33, "an ingress that is not the
// master"): the master pushes every node the fleet's routes (PutRoutes),
// so a node serves a sandbox's envd and ports from its own table, with the
// master off the path of every request. Tokens travel only over the
// nodes' mutual TLS; a node holds them as the master does.
type Route struct {
	ID   string `json:"id"`
	Node string `json:"node"`
	// Address is the holder's seam (host:port of its --node-listen),
	// where a peer forwards to; "" when no peer can reach it (the
	// master's own node, or one behind NAT): such traffic goes through
	// the master.
	Address string `json:"address,omitempty"`
	// Generation is its placement's: the holder serves a forwarded
	// request only if its copy has this one (RouteGenerationHeader), so
	// a stale route never reaches a copy a move left behind.
	Generation int64 `json:"generation"`
	// AccessToken opens its envd (E2B's envdAccessToken), TrafficToken
	// its ports when Private (allowPublicTraffic false).
	AccessToken  string `json:"access_token"`
	TrafficToken string `json:"traffic_token,omitempty"`
	Private      bool   `json:"private,omitempty"`
	// Paused: paused by a client (E2B's pause); traffic is answered
	// "paused", or with AutoResume sent to the master, which resumes it.
	Paused     bool              `json:"paused,omitempty"`
	AutoResume bool              `json:"auto_resume,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	MaskHost   string            `json:"mask_host,omitempty"`
}

// Routes is one push of routes to a node: with Full, the whole table
// (Set), replacing what it had; otherwise a change to the table at
// version Base (Set added or replaced, Drop removed). Version is the
// table's after it. A node whose table is not at Base refuses the change
// (errdefs.ErrPrecondition) and the master sends it whole: a node that
// restarted, or missed a push, is never left with half a table.
type Routes struct {
	Full    bool     `json:"full,omitempty"`
	Base    int64    `json:"base,omitempty"`
	Version int64    `json:"version"`
	Set     []Route  `json:"set,omitempty"`
	Drop    []string `json:"drop,omitempty"`
	// Peers are the nodes the master has paired now, every one of them
	// at each push: only these may forward a request to this node, and
	// only with a certificate issued after their RevokedAt (a node
	// forgotten and paired again under its name).
	Peers []Peer `json:"peers"`
}

// Peer is a node of the fleet, as its peers are to admit it.
type Peer struct {
	Name      string    `json:"name"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
}

// IngressInfo is where a node's ingress listens (Node.Ingress).
type IngressInfo struct {
	// Address is its listener's (host:port; the host may be unspecified,
	// ":8443" or "[::]:8443": a peer then dials the host of the node's
	// seam address).
	Address string `json:"address"`
	// TLS: it ends TLS itself (--ingress-cert); else it serves plain HTTP.
	TLS bool `json:"tls"`
	// Public is the address clients reach this ingress at, on its
	// listener's port (--ingress-public): the fleet's DNS
	// (--ingress-dns) gives it for this node's sandboxes. Empty: none
	// given, and its sandboxes' names are answered with the asking
	// node's own.
	Public string `json:"public,omitempty"`
}

// RouteGenerationHeader carries, on a request an ingress forwards, the
// generation of the route it followed; the holder answers
// errdefs.ErrNotFound if its copy is of another (nodeside).
const RouteGenerationHeader = "Sandstorm-Route-Generation"

// Check says what is wrong with u, if anything.
func (u Routes) Check() error {
	if u.Version <= 0 || !u.Full && u.Version <= u.Base {
		return errdefs.New(errdefs.ErrBadInput, "routes: version %d after base %d", u.Version, u.Base)
	}
	for _, r := range u.Set {
		if r.ID == "" || r.Node == "" || r.AccessToken == "" {
			return errdefs.Mark(errdefs.ErrBadInput, fmt.Errorf("routes: a route needs id, node and access token (%q on %q)", r.ID, r.Node))
		}
	}
	return nil
}
