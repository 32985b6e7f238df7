package master

import (
	"net/http"

	"sandstorm/api"
	"sandstorm/internal/sandboxes"
	"sandstorm/internal/store"
)

// The sandbox service's snapshots (internal/sandboxes/snapshots.go) on
// /v1, as on /e2b.

func wireSnapshot(m store.SandboxMeta) api.Snapshot {
	return api.Snapshot{ID: m.ID, Name: m.SnapshotName, Of: m.SnapshotOf, Team: m.Team, CreatedAt: m.StartedAt}
}

// takeSnapshot serves POST /v1/sandboxes/{id}/snapshots [{"name"}]: 201
// with the snapshot; the sandbox runs on.
func (s *server) takeSnapshot(w http.ResponseWriter, r *http.Request) {
	var req api.SnapshotRequest
	if err := decodeOptional(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	n, sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	m, err := s.sbx.Snapshot(r.Context(), n, sb, req.Name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, wireSnapshot(m))
}

// listSnapshots serves GET /v1/snapshots[?of=SANDBOX&name=NAME]: the
// caller's snapshots, oldest first.
func (s *server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	ms, err := s.sbx.Snapshots(r.Context(), sandboxes.SnapshotFilter{Of: r.URL.Query().Get("of"), Name: r.URL.Query().Get("name")})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := api.List[api.Snapshot]{Items: []api.Snapshot{}}
	for _, m := range ms {
		out.Items = append(out.Items, wireSnapshot(m))
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteSnapshot serves DELETE /v1/snapshots/{id}: 204; what was made
// from it stays.
func (s *server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	if err := s.sbx.DeleteSnapshot(r.Context(), r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// fromSnapshot serves POST /v1/snapshots/{id}/sandboxes [SandboxRequest
// without template]: 201 with a sandbox made from the snapshot, with its
// memory.
func (s *server) fromSnapshot(w http.ResponseWriter, r *http.Request) {
	var req api.SandboxRequest
	if err := decodeOptional(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	meta, err := settings(req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sb, _, err := s.sbx.FromSnapshot(r.Context(), r.PathValue("id"), meta)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.decorate(r.Context(), []api.Sandbox{sb})[0])
}
