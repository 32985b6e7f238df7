package sandboxtraffic

import (
	"crypto/sha256"
	"encoding/base64"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sign is the SDK's getSignature (js-sdk src/sandbox/signature.ts).
func sign(path, op, user, token string, exp int64) url.Values {
	raw := path + ":" + op + ":" + user + ":" + token
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	if exp != 0 {
		raw += ":" + strconv.FormatInt(exp, 10)
		q.Set("signature_expiration", strconv.FormatInt(exp, 10))
	}
	sum := sha256.Sum256([]byte(raw))
	q.Set("signature", "v1_"+strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "="))
	return q
}

// TestSignedFor: a signature opens the file it names, for the operation
// it names, for its user, until its expiry, for the sandbox whose token
// made it, and nothing else; refusals in E2B's words.
func TestSignedFor(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	later := now.Unix() + 60
	for _, c := range []struct {
		name         string
		method, path string
		q            url.Values
		want         string
	}{
		{"read", "GET", "/files", sign("hello.txt", "read", "", "tok", later), ""},
		{"read, no expiry", "GET", "/files", sign("hello.txt", "read", "", "tok", 0), ""},
		{"write as root", "POST", "/files", sign("hello.txt", "write", "root", "tok", later), ""},
		{"expired", "GET", "/files", sign("hello.txt", "read", "", "tok", now.Unix()-1), errSigExpired},
		{"a read's signature to write", "POST", "/files", sign("hello.txt", "read", "", "tok", later), errSigInvalid},
		{"another sandbox's", "GET", "/files", sign("hello.txt", "read", "", "other", later), errSigInvalid},
		{"another user", "GET", "/files", func() url.Values { q := sign("a", "read", "", "tok", later); q.Set("username", "root"); return q }(), errSigInvalid},
		{"another file", "GET", "/files", func() url.Values { q := sign("a", "read", "", "tok", later); q.Set("path", "b"); return q }(), errSigInvalid},
		{"a later expiry", "GET", "/files", func() url.Values {
			q := sign("a", "read", "", "tok", later)
			q.Set("signature_expiration", strconv.FormatInt(later+3600, 10))
			return q
		}(), errSigInvalid},
		{"not /files", "POST", "/process.Process/Start", sign("a", "write", "", "tok", later), errSigInvalid},
		{"DELETE", "DELETE", "/files", sign("a", "write", "", "tok", later), errSigInvalid},
	} {
		if got := signedFor(c.method, c.path, c.q, "tok", now); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
