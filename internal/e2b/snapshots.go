package e2b

import (
	"net/http"

	"sandstorm/internal/sandboxes"
	"sandstorm/internal/store"
)

// E2B's snapshots, translated to the sandbox service's
// (internal/sandboxes/snapshots.go: what a snapshot is here).

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func infoOf(m store.SandboxMeta) snapshotInfo {
	info := snapshotInfo{SnapshotID: m.ID, Names: []string{}}
	if m.SnapshotName != "" {
		info.Names = append(info.Names, m.SnapshotName)
	}
	return info
}

// createSnapshot is POST /sandboxes/{id}/snapshots {name?}: 201 with the
// snapshot; the sandbox runs on.
func (s *Service) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name string `json:"name"`
	}
	if err := decodeOptional(w, r, &body); err != nil {
		fail(w, err)
		return
	}
	n, sb, _, err := s.findRunning(r, "snapshot")
	if err != nil {
		fail(w, err)
		return
	}
	snap, err := s.sbx.Snapshot(r.Context(), n, sb, body.Name)
	if err != nil {
		fail(w, err)
		return
	}
	s.cfg.Log.Info("e2b snapshot taken", "sandbox", sb.ID, "snapshot", snap.ID, "name", snap.SnapshotName)
	writeJSON(w, http.StatusCreated, infoOf(snap))
}

// listSnapshots is GET /snapshots?sandboxID=&name=&limit=&nextToken=:
// the caller's snapshots, oldest first, paged as the sandboxes' list is.
func (s *Service) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	all, err := s.sbx.Snapshots(r.Context(), sandboxes.SnapshotFilter{Of: q.Get("sandboxID"), Name: q.Get("name")})
	if err != nil {
		fail(w, err)
		return
	}
	limit, err := pageLimit(q)
	if err != nil {
		fail(w, err)
		return
	}
	ds := make([]detail, 0, len(all))
	byID := map[string]store.SandboxMeta{}
	for _, m := range all {
		ds = append(ds, detail{SandboxID: m.ID, StartedAt: m.StartedAt})
		byID[m.ID] = m
	}
	pg, next := page(ds, filter{}, false, limit, q.Get("nextToken"))
	out := make([]snapshotInfo, 0, len(pg))
	for _, d := range pg {
		out = append(out, infoOf(byID[d.SandboxID]))
	}
	if next != "" {
		w.Header().Set("x-next-token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteSnapshot is DELETE /templates/{id}, where E2B deletes a snapshot
// (and a template, which this API does not make: a template that is not
// a snapshot is not found here).
func (s *Service) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	if err := s.sbx.DeleteSnapshot(r.Context(), r.PathValue("id")); err != nil {
		fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
