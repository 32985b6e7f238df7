package controlplane

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"

	"sandstorm/internal/errdefs"
)

// Enrolment with OpenID Connect (issue 17, item 1): instead of a
// bootstrap token, a node presents an ID token (OpenID Connect Core 1.0
// §2) from the issuer the control plane is configured with. go-oidc
// checks it — signed by a key of the issuer's JWKS (found by discovery),
// "iss" the configured issuer, "aud" containing the configured client ID,
// unexpired — and the allow rule decides whether that identity may enrol.
// The node still signs a fresh single-use challenge with its own key: the
// ID token says who the operator is, the challenge that the enrolling
// machine holds the key the credential is bound to. An ID token enrols
// one member, once (the store keeps its hash until it expires), so one
// copied from a log cannot enrol a second machine.

// OIDCConfig is the issuer whose ID tokens may enrol, and who may.
type OIDCConfig struct {
	// Issuer is the issuer's URL, exactly as its ID tokens' "iss" and its
	// discovery document say (https).
	Issuer string
	// ClientID is the audience an ID token must be for ("aud").
	ClientID string
	// HTTP fetches the issuer's discovery document and keys; it trusts
	// the issuer's CA (--oidc-ca) and has a deadline.
	HTTP *http.Client
	// AllowEmails are the identities allowed by e-mail: an exact address
	// ("ops@example.com") or every address of a domain ("@example.com"),
	// compared without case, and only if the issuer says the address is
	// verified ("email_verified": true).
	AllowEmails []string
	// AllowSubjects are the identities allowed by the issuer's subject
	// ("sub"), exactly. With neither list, nobody enrols by OIDC.
	AllowSubjects []string
}

// allowedIdentity decides whether an ID token's identity may enrol, and
// names it for the log. Pure: the rule, unit-tested beside it. Fail
// closed: no rule allows nobody; an address the issuer has not verified
// is not an identity.
func allowedIdentity(cfg OIDCConfig, sub, email string, emailVerified bool) (string, bool) {
	for _, s := range cfg.AllowSubjects {
		if s != "" && sub == s {
			return "sub " + sub, true
		}
	}
	if !emailVerified || email == "" || strings.Count(email, "@") != 1 {
		return "", false
	}
	e := strings.ToLower(email)
	for _, a := range cfg.AllowEmails {
		a = strings.ToLower(strings.TrimSpace(a))
		switch {
		case a == "" || a == "@":
		case strings.HasPrefix(a, "@") && strings.HasSuffix(e, a):
			return "email " + email, true
		case e == a:
			return "email " + email, true
		}
	}
	return "", false
}

// oidcVerifier finds the issuer (discovery) on the first ID token it
// checks, not when the control plane starts: an issuer down at start
// costs OIDC enrolments until it is back, not the control plane.
type oidcVerifier struct {
	cfg OIDCConfig
	now func() time.Time
	mu  sync.Mutex
	v   *oidc.IDTokenVerifier
	// failedAt, failErr: the last discovery that failed. For a few seconds
	// after it, enrolments are answered with its error at once rather
	// than each waiting out a discovery of an issuer that is down.
	failedAt time.Time
	failErr  error
}

// discoveryBackoff is how long a failed discovery is not retried.
const discoveryBackoff = 5 * time.Second

func newOIDCVerifier(cfg OIDCConfig, now func() time.Time) *oidcVerifier {
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 10 * time.Second}
	}
	return &oidcVerifier{cfg: cfg, now: now}
}

func (o *oidcVerifier) verifier(ctx context.Context) (*oidc.IDTokenVerifier, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.v != nil {
		return o.v, nil
	}
	if o.failErr != nil && time.Since(o.failedAt) < discoveryBackoff {
		return nil, o.failErr
	}
	dctx, cancel := context.WithTimeout(oidc.ClientContext(ctx, o.cfg.HTTP), 10*time.Second)
	defer cancel()
	p, err := oidc.NewProvider(dctx, o.cfg.Issuer)
	if err != nil {
		o.failedAt, o.failErr = time.Now(), errdefs.Mark(errdefs.ErrUnavailable, fmt.Errorf("the OIDC issuer %s: %w", o.cfg.Issuer, err))
		return nil, o.failErr
	}
	// The key set keeps the context it is made with for its later fetches
	// (it drops its cancel): it carries the issuer's HTTP client.
	o.v = p.VerifierContext(oidc.ClientContext(context.Background(), o.cfg.HTTP), &oidc.Config{ClientID: o.cfg.ClientID, Now: o.now})
	return o.v, nil
}

// identity checks an ID token and the allow rule; it returns the
// identity, for the log, and when the token expires.
func (o *oidcVerifier) identity(ctx context.Context, raw string) (string, time.Time, error) {
	v, err := o.verifier(ctx)
	if err != nil {
		return "", time.Time{}, err
	}
	tok, err := v.Verify(oidc.ClientContext(ctx, o.cfg.HTTP), raw)
	if err != nil {
		var exp *oidc.TokenExpiredError
		if errors.As(err, &exp) {
			return "", time.Time{}, errdefs.New(errdefs.ErrUnauthorized, "the ID token expired at %s: sign in again", exp.Expiry.Format(time.RFC3339))
		}
		return "", time.Time{}, errdefs.New(errdefs.ErrUnauthorized, "the ID token is refused: %v", err)
	}
	var claims struct {
		Email         string `json:"email"`
		EmailVerified bool   `json:"email_verified"`
		AZP           string `json:"azp"`
	}
	if err := tok.Claims(&claims); err != nil {
		return "", time.Time{}, errdefs.New(errdefs.ErrUnauthorized, "the ID token's claims: %v", err)
	}
	// An ID token for several audiences must name this client as the
	// party it was issued to (OpenID Connect Core 1.0 §3.1.3.7, items 4
	// and 5); go-oidc checks only that the audience contains it.
	if len(tok.Audience) > 1 && claims.AZP != o.cfg.ClientID {
		return "", time.Time{}, errdefs.New(errdefs.ErrUnauthorized, "the ID token is for several audiences and its authorized party (azp) %q is not %s", claims.AZP, o.cfg.ClientID)
	}
	who, ok := allowedIdentity(o.cfg, tok.Subject, claims.Email, claims.EmailVerified)
	if !ok {
		unverified := ""
		if claims.Email != "" && !claims.EmailVerified {
			unverified = ", the address not verified by the issuer"
		}
		return "", time.Time{}, errdefs.New(errdefs.ErrForbidden, "the identity %q (sub %s%s) is not allowed to enrol (serve --oidc-allow-email, --oidc-allow-subject)", claims.Email, tok.Subject, unverified)
	}
	return who, tok.Expiry, nil
}

// hashIDToken is what the store keeps of a spent ID token.
func hashIDToken(raw string) string {
	sum := sha256.Sum256([]byte("sam oidc id token\x00" + raw))
	return hex.EncodeToString(sum[:])
}
