package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"sandstorm/api"
	"sandstorm/internal/sam/membership"
	"sandstorm/internal/sam/meshnode"
	"sandstorm/internal/sam/meshpeer"
	"sandstorm/internal/sam/refusals"
)

// meshOptions are sam-node's flags for the mesh beyond this machine.
type meshOptions struct {
	dir     string
	routers []string
	listen  []string
}

func (m meshOptions) on() bool { return len(m.routers) > 0 }

// openMember opens the node's mesh identity (sam-node join) and keeps it
// current (keys, revocations, its credential) until ctx ends.
func openMember(ctx context.Context, o meshOptions, log *slog.Logger) (*membership.Member, []peer.AddrInfo, error) {
	var routers []peer.AddrInfo
	for _, r := range o.routers {
		ai, err := peer.AddrInfoFromString(r)
		if err != nil {
			return nil, nil, fmt.Errorf("--router %q: want a multiaddr ending in /p2p/<peer ID> (sam-router prints its own): %w", r, err)
		}
		routers = append(routers, *ai)
	}
	m, err := membership.OpenDir(o.dir, log)
	if err != nil {
		return nil, nil, fmt.Errorf("--mesh-dir: %w; enrol this node first with: sam-node join --mesh-dir %s …", err, o.dir)
	}
	go m.Run(ctx)
	return m, routers, nil
}

// reportRefusals sends the control plane what the node and its machine's
// boundaries refused its agents (internal/sam/refusals), every
// refusals.NodeEvery, until ctx ends.
func reportRefusals(ctx context.Context, m *membership.Member, node *meshnode.Node, log *slog.Logger) {
	refusals.Forward(ctx, node.Refusals(), refusals.NodeEvery, m.ReportRefusals, "the control plane", log)
}

// joinMesh joins the routers in the background, retrying until one takes
// this member — the node serves its own agents meanwhile — then sets the
// mesh and keeps the peer joined until ctx ends. It returns when the peer
// has left.
func joinMesh(ctx context.Context, m *membership.Member, routers []peer.AddrInfo, listen []string, node *meshnode.Node, mesh *meshpeer.Deferred, log *slog.Logger) {
	backoff := 500 * time.Millisecond
	for ctx.Err() == nil {
		p, err := meshpeer.Join(ctx, meshpeer.Config{
			Key: m.PrivateKey(), Credential: m.Credential, Verify: m.Verify,
			Routers: routers, Listen: listen,
			Names: node.Names, Handler: node.MeshHandler(), Logger: log,
		})
		if err != nil {
			log.Warn("sam-node: cannot join the mesh yet; retrying", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 10*time.Second)
			continue
		}
		var addrs []string
		for _, a := range p.Host.Addrs() {
			addrs = append(addrs, a.String())
		}
		log.Info("sam-node: joined the mesh", "member", m.Name(), "peer", p.Host.ID().String(), "addrs", addrs, "serves", node.Names())
		mesh.Set(p)
		p.Run(ctx)
		p.Close()
		return
	}
}

// serveMeshStatus adds the member's view of the mesh to the node's admin
// listener (never the agent listener: it names routers and members):
//
//	GET /mesh                   api.MemberStatus: each router joined or not
//	                            and since when, its epoch, whether this
//	                            member's names are published there; the
//	                            control plane reachable or not, the keys
//	                            and policy in use
//	GET /mesh/providers?name=N  the members providing N, the routers asked
//	                            now (past the discovery cache)
//
// and gauges of the same on /metrics.
func serveMeshStatus(node *meshnode.Node, m *membership.Member, routers []peer.AddrInfo, mesh *meshpeer.Deferred) error {
	status := func() api.MemberStatus {
		var st api.MemberStatus
		if p := mesh.Peer(); p != nil {
			st = p.Status()
		} else {
			for _, r := range routers {
				st.Routers = append(st.Routers, api.RouterStatus{Addr: r.String()})
			}
		}
		st.Member, st.ControlPlane = m.Name(), m.ControlPlaneStatus()
		return st
	}
	node.HandleAdmin("GET /mesh", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, status())
	}))
	node.HandleAdmin("GET /mesh/providers", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get("name")
		p := mesh.Peer()
		switch {
		case name == "":
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "name a mesh name: ?name=inference://MODEL, mcp://SERVER or catalog"})
			return
		case p == nil:
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": meshpeer.ErrNotJoined.Error()})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		found, err := p.FindNow(ctx, name)
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
			return
		}
		out := []map[string]any{}
		for _, ai := range found {
			out = append(out, map[string]any{"peer": ai.ID.String(), "addrs": ai.Addrs})
		}
		writeJSON(w, http.StatusOK, out)
	}))
	joined := func() float64 {
		n := 0
		for _, r := range status().Routers {
			if r.Joined {
				n++
			}
		}
		return float64(n)
	}
	return node.RegisterMetrics(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sam_node_mesh_routers",
			Help: "Routers this member was given (--router)."}, func() float64 { return float64(len(routers)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sam_node_mesh_routers_joined",
			Help: "Routers this member is joined to now: connected, credentials exchanged, a relay slot held."}, joined),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sam_node_mesh_control_plane_reachable",
			Help: "1 while the control plane answers; 0 while the member runs on its last good keys and policy."}, func() float64 {
			if m.ControlPlaneStatus().Reachable {
				return 1
			}
			return 0
		}),
	)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
