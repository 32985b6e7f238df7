package controlplane

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/httpjson"
	"sandstorm/internal/sam/meshcred"
	"sandstorm/internal/sam/policy"
)

// The mesh's policy (issue 17, item 1): one document of roles, bindings
// and egress in internal/sam/policy's format, set by the operator and served
// to every member, which evaluates it on names locally. Each accepted
// change is a new version in the store, so a member polls cheaply (the
// version is the ETag) and a restart of the control plane serves the
// same policy.

// MaxPolicyBytes bounds a policy document: a mesh's roles and bindings
// are KiB; a MiB is room for thousands of principals.
const MaxPolicyBytes = 1 << 20

func (s *Server) putPolicy(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxPolicyBytes))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrTooLarge, "a policy of at most %d bytes, please", MaxPolicyBytes))
		return
	}
	if err != nil {
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrBadInput, "reading the policy: %v", err))
		return
	}
	if !utf8.Valid(b) || strings.TrimSpace(string(b)) == "" {
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrBadInput, "the body is the policy document (YAML or JSON: roles, bindings), and it is empty or not text"))
		return
	}
	// Validated exactly as every member will parse it: a document the
	// control plane accepts is one no member refuses.
	if _, err := policy.Parse(b); err != nil {
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrBadInput, "policy refused, the one in force is unchanged: %v", err))
		return
	}
	now := s.cfg.Now()
	v, err := s.cfg.Store.Mesh().PutMeshPolicy(r.Context(), string(b), now)
	if err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	s.cfg.Log.Info("mesh policy set", "version", v, "bytes", len(b))
	w.Header().Set("ETag", policyETag(v))
	httpjson.Write(w, http.StatusOK, api.MeshPolicy{Version: v, Document: string(b), SetAt: now.UTC()})
}

// getPolicy serves the policy to a member presenting its credential (or
// to the operator). If-None-Match with the version it has costs a 304.
func (s *Server) getPolicy(w http.ResponseWriter, r *http.Request) {
	if !s.isAdmin(r) {
		if c, err := s.credentialOf(r); err != nil {
			if errors.Is(err, errdefs.ErrUnauthorized) || errors.Is(err, errdefs.ErrForbidden) {
				s.refuse(w, "credential", c.Member, err)
				return
			}
			errdefs.WriteHTTP(w, err)
			return
		}
	}
	p, err := s.cfg.Store.Mesh().GetMeshPolicy(r.Context())
	if errors.Is(err, errdefs.ErrNotFound) {
		// None set yet: version 0, which grants nothing.
		httpjson.Write(w, http.StatusOK, api.MeshPolicy{})
		return
	}
	if err != nil {
		errdefs.WriteHTTP(w, err)
		return
	}
	tag := policyETag(p.Version)
	w.Header().Set("ETag", tag)
	if r.Header.Get("If-None-Match") == tag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	httpjson.Write(w, http.StatusOK, api.MeshPolicy{Version: p.Version, Document: p.Document, SetAt: p.SetAt})
}

func policyETag(v int64) string { return `"` + strconv.FormatInt(v, 10) + `"` }

// credentialOf checks the member credential a request presents
// (Authorization: Bearer <credential>): signed by this control plane's
// keys, unexpired, of a member enrolled with the key it is bound to and
// not revoked.
func (s *Server) credentialOf(r *http.Request) (meshcred.Claims, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return meshcred.Claims{}, errdefs.New(errdefs.ErrUnauthorized, "this needs a member's credential (Authorization: Bearer <credential>)")
	}
	return s.VerifyCredential(r.Context(), tok)
}

// VerifyCredential checks a member's credential as the control plane
// itself does (credentialOf): against its current keys and the store's
// members, so a revocation applies at once. sam-one's router checks
// credentials with it.
func (s *Server) VerifyCredential(ctx context.Context, tok string) (meshcred.Claims, error) {
	var storeErr error
	now := s.cfg.Now()
	c, err := s.iss.Load().KeySet(now).Verify(tok, now, func(c meshcred.Claims) bool {
		m, err := s.cfg.Store.Mesh().GetMeshMember(ctx, c.Member)
		if err != nil {
			if !errors.Is(err, errdefs.ErrNotFound) {
				storeErr = err
			}
			return true
		}
		return !m.RevokedAt.IsZero() || m.PublicKey != base64.StdEncoding.EncodeToString(c.Key)
	})
	switch {
	case storeErr != nil:
		return c, storeErr
	case errors.Is(err, meshcred.ErrRevoked):
		return c, errdefs.New(errdefs.ErrForbidden, "credential of a member revoked (or not enrolled with this key)")
	case err != nil:
		return c, errdefs.Mark(errdefs.ErrUnauthorized, err)
	}
	return c, nil
}

// SetPolicy sets the mesh's policy (operator): the document as given,
// YAML or JSON.
func (c *Client) SetPolicy(ctx context.Context, doc []byte) (api.MeshPolicy, error) {
	var out api.MeshPolicy
	_, err := c.raw(ctx, http.MethodPut, "/v1/policy", "application/yaml", doc, nil, &out)
	return out, err
}

// Policy fetches the mesh's policy with a member's credential (or, with
// credential "", the client's admin token). have is the version the
// caller holds: while it is the newest, the answer is (have's version, no
// document, changed false) and costs a 304.
func (c *Client) Policy(ctx context.Context, credential string, have int64) (p api.MeshPolicy, changed bool, err error) {
	h := http.Header{}
	if credential != "" {
		h.Set("Authorization", "Bearer "+credential)
	}
	if have > 0 {
		h.Set("If-None-Match", policyETag(have))
	}
	status, err := c.raw(ctx, http.MethodGet, "/v1/policy", "", nil, h, &p)
	if err != nil {
		return p, false, err
	}
	if status == http.StatusNotModified {
		return api.MeshPolicy{Version: have}, false, nil
	}
	return p, true, nil
}
