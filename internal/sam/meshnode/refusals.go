package meshnode

// Agents' refusals for sam-one's console (issue 17, item 7): what this
// node refuses a principal — a model or an MCP server or tool it is not
// granted, here or, for a call from another member, by this member's
// policy — is counted into the node's table (internal/sam/refusals), and so
// is what the boundaries of its machine report on the agent listener
// (POST api.SAMRefusalsPath, sandstormd's node or sam-box, in a request
// naming no principal). sam-node passes the table on to the control
// plane with its member credential (cmd/sam-node).

import (
	"encoding/json"
	"errors"
	"net/http"

	"sandstorm/internal/errdefs"

	"sandstorm/api"
	"sandstorm/internal/sam/refusals"
)

// RefusalsPath is api.SAMRefusalsPath.
const RefusalsPath = api.SAMRefusalsPath

// whyNotGranted is the reason of a refusal by the policy.
const whyNotGranted = "not granted"

// Refusals is the node's table: its own refusals and those its
// machine's boundaries reported, until they are taken and sent on.
func (n *Node) Refusals() *refusals.Table { return n.refusals }

// refused counts one refusal of principal; r, if it is a call from
// another member, names that member.
func (n *Node) refused(r *http.Request, principal, what, target, reason string) {
	from := ""
	if r != nil {
		from, _ = r.Context().Value(fromMeshKey{}).(string)
	}
	n.refusals.Add(refusals.Refusal{Principal: principal, By: api.RefusedBySAMNode, What: what, Target: target, Reason: reason, From: from})
}

// serveRefusals takes a report of the machine's boundaries (POST
// RefusalsPath). It is reached only by a request naming no principal
// (serveAgent): a boundary names its agent's principal on every request
// it forwards, and never forwards this path. A report is bounded
// (refusals.MaxBodyBytes, MaxRows) and checked whole before any of it
// is kept; the node's table is bounded whatever arrives.
func (n *Node) serveRefusals(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		refuse(w, errdefs.ErrMethod, "method_not_allowed", "use POST")
		return
	}
	var rep api.RefusalReport
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, refusals.MaxBodyBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(&rep)
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		refuse(w, errdefs.ErrTooLarge, "request_too_large", "a report of at most 1 MiB, please")
		return
	case err != nil:
		refuse(w, errdefs.ErrBadInput, "invalid_request", "want {\"rows\": [{\"principal\", \"by\", \"what\", \"target\", \"reason\", \"count\", \"first\", \"last\"}], \"dropped\"}: "+err.Error())
		return
	case dec.More():
		refuse(w, errdefs.ErrBadInput, "invalid_request", "one report per request")
		return
	}
	if err := refusals.Check(rep); err != nil {
		refuse(w, errdefs.ErrBadInput, "invalid_request", err.Error())
		return
	}
	n.refusals.Merge(rep)
	w.WriteHeader(http.StatusNoContent)
}
