package fleet

import "time"

// Health is what the master knows of one node's link, for its metrics
// (sandstorm_master_node_up, sandstorm_master_node_report_age_seconds):
// read from what its reports left, never by calling the node.
type Health struct {
	Name string
	// Lost as GET /v1/nodes says it: no report stream open, or nothing on
	// it for nodeapi.SilenceLimit. A node not heard yet is lost.
	Lost bool
	// LastReport is when its last report arrived (zero: none yet).
	LastReport time.Time
}

// Health is every node's Health, the local one first, then the paired
// ones by name (as Nodes).
func (f *Fleet) Health() []Health {
	now := time.Now()
	var out []Health
	for _, n := range f.Nodes() {
		name := n.Name()
		h := Health{Name: name, Lost: true}
		if l, ok := f.linkOf(name); ok {
			h.Lost, h.LastReport = l.lost(now), l.heard
		}
		out = append(out, h)
	}
	return out
}
