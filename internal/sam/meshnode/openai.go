package meshnode

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"

	"sandstorm/internal/errdefs"

	"sandstorm/api"
)

// model is the OpenAI model object.
type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

type modelList struct {
	Object string  `json:"object"`
	Data   []model `json:"data"`
}

// visibleModels are the served models principal may use (and, for a
// narrowed request, only the one it was narrowed to).
func (n *Node) visibleModels(principal string, svc service) []model {
	g := n.policy.Current().For(principal)
	out := []model{}
	if svc.kind == "mcp" {
		return out
	}
	for _, name := range n.models {
		if svc.kind == "inference" && name != svc.name {
			continue
		}
		if g.Model(name) {
			out = append(out, model{ID: name, Object: "model", OwnedBy: n.byModel[name][0].Name})
		}
	}
	sm, _ := n.servedNames()
	for _, name := range sm {
		if len(n.byModel[name]) == 0 && (svc.kind != "inference" || name == svc.name) && g.Model(name) {
			out = append(out, model{ID: name, Object: "model", OwnedBy: "sandbox"})
		}
	}
	if n.remote != nil {
		models, _ := n.remote.snapshot()
		for _, name := range sortedKeys(models) {
			if svc.kind == "inference" && name != svc.name {
				continue
			}
			if g.Model(name) {
				out = append(out, model{ID: name, Object: "model", OwnedBy: models[name]})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// localProviders are the providers of model on this node: the
// configured ones in rank order, then the sandboxes serving it.
func (n *Node) localProviders(model string) []*provider {
	ps := n.byModel[model]
	if sv := n.servedModels(model); len(sv) > 0 {
		ps = append(slices.Clone(ps), sv...)
	}
	return ps
}

// ownedBy is who serves a model: its first local provider, or the
// member the mesh's catalogue names.
func (n *Node) ownedBy(name string) string {
	if ps := n.localProviders(name); len(ps) > 0 {
		return ps[0].Name
	}
	if n.remote != nil {
		models, _ := n.remote.snapshot()
		if m, ok := models[name]; ok {
			return m
		}
	}
	return "mesh"
}

func (n *Node) serveModels(w http.ResponseWriter, r *http.Request, principal string, svc service) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET")
		refuse(w, errdefs.ErrMethod, "method_not_allowed", "use GET")
		return
	}
	if svc.kind == "mcp" {
		refuse(w, errdefs.ErrForbidden, "wrong_service",
			fmt.Sprintf("this endpoint is the MCP server %q; it serves no models", svc.name))
		return
	}
	if n.remote != nil {
		n.remote.wait(r.Context())
	}
	if name, one := strings.CutPrefix(r.URL.Path, "/v1/models/"); one {
		if kind, code, msg, why := n.modelAllowed(principal, svc, name, n.remote != nil); kind != nil {
			if why != "" {
				n.refused(r, principal, api.RefusedModel, name, why)
			}
			refuse(w, kind, code, msg)
			return
		}
		if len(n.localProviders(name)) == 0 {
			if models, _ := n.remote.snapshot(); models[name] == "" {
				n.modelNotServed(w, principal, name)
				return
			}
		}
		writeJSON(w, http.StatusOK, model{ID: name, Object: "model", OwnedBy: n.ownedBy(name)})
		return
	}
	writeJSON(w, http.StatusOK, modelList{Object: "list", Data: n.visibleModels(principal, svc)})
}

// modelAllowed decides on a model before anything is dialled. A model
// that is not granted is refused the same way whether or not it exists.
// With mesh, a model no local provider serves may be served elsewhere in
// the mesh: that is for the lookup that follows to say. kind is the
// refusal's errdefs kind (nil: allowed), code its OpenAI error code; why
// is its reason in a few words when the principal was refused, for the
// console (refused).
func (n *Node) modelAllowed(principal string, svc service, name string, mesh bool) (kind error, code, msg, why string) {
	switch {
	case name == "":
		return errdefs.ErrBadInput, "invalid_request", "no model: the request body must name a model (GET /v1/models lists the ones you may use)", ""
	case svc.kind == "mcp":
		return errdefs.ErrForbidden, "model_not_granted", fmt.Sprintf("this endpoint is the MCP server %q; it serves no models", svc.name),
			"asked of the endpoint of MCP server " + svc.name
	case svc.kind == "inference" && name != svc.name:
		return errdefs.ErrForbidden, "model_not_granted", fmt.Sprintf("this endpoint serves only the model %q, not %q", svc.name, name),
			"asked of the endpoint of model " + svc.name
	case !n.policy.Current().For(principal).Model(name):
		return errdefs.ErrForbidden, "model_not_granted", fmt.Sprintf("model %q is not granted to principal %q; GET /v1/models lists the models you may use", name, principal),
			whyNotGranted
	case len(n.localProviders(name)) == 0 && !mesh:
		return errdefs.ErrNotFound, "model_not_found", fmt.Sprintf("model %q is not served by any provider of this mesh node; GET /v1/models lists the models you may use", name), ""
	}
	return nil, "", "", ""
}

// serveInference routes a completion request by its model to the first
// provider, in rank order, that answers it.
func (n *Node) serveInference(w http.ResponseWriter, r *http.Request, principal string, svc service, path string) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		refuse(w, errdefs.ErrMethod, "method_not_allowed", "use POST")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, n.maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			refuse(w, errdefs.ErrTooLarge, "request_too_large",
				fmt.Sprintf("request body exceeds %d bytes", mbe.Limit))
			return
		}
		refuse(w, errdefs.ErrBadInput, "invalid_request", "could not read the request body")
		return
	}
	var head struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	if err := json.Unmarshal(body, &head); err != nil {
		refuse(w, errdefs.ErrBadInput, "invalid_request", "the request body is not a JSON object with a string \"model\": "+err.Error())
		return
	}
	// A call from another member is served by this node's own providers
	// only: never sent on, so it cannot loop or be amplified.
	mesh := n.remote != nil && !fromMesh(r)
	if kind, code, msg, why := n.modelAllowed(principal, svc, head.Model, mesh); kind != nil {
		if kind == errdefs.ErrForbidden && n.byModel[head.Model] != nil {
			n.m.modelRequests.WithLabelValues(head.Model, "denied").Inc()
		}
		if why != "" {
			n.refused(r, principal, api.RefusedModel, head.Model, why)
		}
		n.log.Debug("meshnode: inference refused", "principal", principal, "code", code)
		refuse(w, kind, code, msg)
		return
	}

	local := n.localProviders(head.Model)
	if len(local) == 0 {
		n.serveFromMesh(w, r, principal, head.Model, path, body)
		return
	}
	var last string
	for _, p := range local {
		resp, err := n.attempt(r.Context(), p, path, body, r.Header)
		if err != nil {
			if r.Context().Err() != nil {
				n.m.providerAttempts.WithLabelValues(p.Name, "canceled").Inc()
				return // the agent went away
			}
			n.m.providerAttempts.WithLabelValues(p.Name, "connect_error").Inc()
			n.log.Warn("meshnode: provider unreachable; trying the next", "provider", p.Name, "err", err)
			last = fmt.Sprintf("provider %q unreachable", p.Name)
			continue
		}
		if resp.StatusCode >= 500 {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			n.m.providerAttempts.WithLabelValues(p.Name, "server_error").Inc()
			n.log.Warn("meshnode: provider failed; trying the next", "provider", p.Name, "status", resp.StatusCode)
			last = fmt.Sprintf("provider %q answered %d", p.Name, resp.StatusCode)
			continue
		}
		outcome := "ok"
		if resp.StatusCode >= 400 {
			outcome = "client_error"
		}
		n.m.providerAttempts.WithLabelValues(p.Name, outcome).Inc()
		n.m.modelRequests.WithLabelValues(head.Model, "served").Inc()
		n.relay(w, resp, p)
		return
	}
	n.m.modelRequests.WithLabelValues(head.Model, "unavailable").Inc()
	refuse(w, errdefs.ErrUpstream, "upstream_unavailable",
		fmt.Sprintf("no provider of model %q could serve the request (last: %s); try again later", head.Model, last))
}

// serveFromMesh sends an inference request to a member that serves the
// model, the next one on a connection error or a 5xx (as for local
// providers: nothing has been sent to the agent yet).
func (n *Node) serveFromMesh(w http.ResponseWriter, r *http.Request, principal, model, path string, body []byte) {
	ids, err := n.meshTargets(r.Context(), "inference://"+model)
	if err != nil && len(ids) == 0 {
		n.m.modelRequests.WithLabelValues(model, "unavailable").Inc()
		writeUnavailable(w, "model_unavailable",
			fmt.Sprintf("model %q is granted to principal %q, but the mesh cannot be asked who serves it right now (%v)", model, principal, err))
		return
	}
	if len(ids) == 0 {
		n.modelNotServed(w, principal, model)
		return
	}
	last := ""
	for _, id := range ids {
		resp, err := n.meshAttempt(r.Context(), id, principal, path, body, r.Header)
		if err != nil {
			if r.Context().Err() != nil {
				n.m.providerAttempts.WithLabelValues("mesh", "canceled").Inc()
				return
			}
			n.m.providerAttempts.WithLabelValues("mesh", "connect_error").Inc()
			n.log.Warn("meshnode: member unreachable; trying the next", "member", id, "model", model, "err", err)
			last = fmt.Sprintf("member %s unreachable", id)
			continue
		}
		if resp.StatusCode >= 500 {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			n.m.providerAttempts.WithLabelValues("mesh", "server_error").Inc()
			last = fmt.Sprintf("member %s answered %d", id, resp.StatusCode)
			continue
		}
		outcome := "ok"
		if resp.StatusCode >= 400 {
			outcome = "client_error"
		}
		n.m.providerAttempts.WithLabelValues("mesh", outcome).Inc()
		n.m.modelRequests.WithLabelValues(model, "served").Inc()
		n.relay(w, resp, &provider{Provider: Provider{Name: "mesh:" + id}})
		return
	}
	n.m.modelRequests.WithLabelValues(model, "unavailable").Inc()
	writeUnavailable(w, "model_unavailable",
		fmt.Sprintf("model %q is granted to principal %q, but no member serving it could take the request (last: %s)", model, principal, last))
}

// modelNotServed answers a granted model that no member serves: one the
// mesh listed lately is away (503, try again), one it never did is not
// found (404).
func (n *Node) modelNotServed(w http.ResponseWriter, principal, model string) {
	if n.remote.recently("inference://" + model) {
		n.m.modelRequests.WithLabelValues("", "unavailable").Inc()
		writeUnavailable(w, "model_unavailable",
			fmt.Sprintf("model %q is granted to principal %q, but no member of the mesh serves it right now", model, principal))
		return
	}
	refuse(w, errdefs.ErrNotFound, "model_not_found",
		fmt.Sprintf("model %q is not served anywhere in the mesh; GET /v1/models lists the models you may use", model))
}

// attempt sends the request to one provider. Only the headers an
// OpenAI-compatible server needs go upstream: never the agent's
// Authorization, never an X-Sam-* header.
func (n *Node) attempt(ctx context.Context, p *provider, path string, body []byte, in http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if a := in.Get("Accept"); a != "" {
		req.Header.Set("Accept", a)
	} else {
		req.Header.Set("Accept", "application/json")
	}
	req.Header.Set("User-Agent", "sam-node")
	if p.key != "" {
		req.Header.Set("Authorization", "Bearer "+p.key)
	}
	return n.upstream.Do(req)
}

// hop-by-hop and other headers that must not be relayed to the agent.
var dropResponseHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Connection": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Content-Length": true, "Set-Cookie": true, "Alt-Svc": true,
}

// relay copies the provider's answer to the agent, flushing after every
// read so that a stream reaches the agent as it is produced.
func (n *Node) relay(w http.ResponseWriter, resp *http.Response, p *provider) {
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		if dropResponseHeaders[http.CanonicalHeaderKey(k)] {
			continue
		}
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		nr, err := resp.Body.Read(buf)
		if nr > 0 {
			if _, werr := w.Write(buf[:nr]); werr != nil {
				return // the agent went away; the deferred Close ends the upstream request
			}
			_ = rc.Flush()
		}
		if err != nil {
			if err != io.EOF {
				n.log.Warn("meshnode: provider stream broke off", "provider", p.Name, "err", err)
			}
			return
		}
	}
}
