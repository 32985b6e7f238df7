package controlplane

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/meshcred"
	"sandstorm/internal/store"
)

// IssueOwn issues a credential to a member that runs in the control
// plane's own process (sam-one's router): no bootstrap token and no
// challenge, since the caller holds the key and is the control plane.
// The member is enrolled under name with pub at its first issue, so it
// is listed and revocable like any other; a name held by another key, or
// revoked, is refused as an enrolment would be.
func (s *Server) IssueOwn(ctx context.Context, name string, pub ed25519.PublicKey) (string, meshcred.Claims, error) {
	if !nameRE.MatchString(name) {
		return "", meshcred.Claims{}, errdefs.New(errdefs.ErrBadInput, "name %q: lower-case letters, digits, '.' and '-', at most 63", name)
	}
	key := base64.StdEncoding.EncodeToString(pub)
	m, err := s.cfg.Store.Mesh().GetMeshMember(ctx, name)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		if err := s.cfg.Store.Mesh().PutMeshMember(ctx, store.MeshMember{Name: name, PublicKey: key, EnrolledAt: s.cfg.Now()}); err != nil {
			return "", meshcred.Claims{}, err
		}
		s.cfg.Log.Info("member enrolled", "name", name, "by", "the control plane's own process")
	case err != nil:
		return "", meshcred.Claims{}, err
	case m.PublicKey != key:
		return "", meshcred.Claims{}, errdefs.New(errdefs.ErrConflict, "member name %s is another key's", name)
	case !m.RevokedAt.IsZero():
		return "", meshcred.Claims{}, errdefs.New(errdefs.ErrForbidden, "member %s is revoked", name)
	}
	tok, c, err := s.iss.Load().Issue(name, pub, s.cfg.CredentialTTL, s.cfg.Now())
	if err == nil && s.cfg.Issued != nil {
		s.cfg.Issued(name, c.Expires)
	}
	return tok, c, err
}
