package sandboxtraffic

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Signed URLs (the SDK's downloadUrl and uploadUrl, js-sdk
// src/sandbox/signature.ts): a URL of envd's /files that carries its own
// authority, for a browser or curl that holds no access token. Its
// signature is "v1_" and the unpadded standard base64 of
// sha256("<path>:<read|write>:<user>:<envd access token>[:<expiry>]"),
// over the query's path and username as the SDK sent them; the expiry,
// if any, is Unix seconds. The bodies of its refusals are E2B's envd's,
// word for word: the SDK's tests compare them.

const (
	errSigExpired = "signature is already expired"
	errSigInvalid = "invalid signature"
)

// signedFor checks a request to /files that carries a signature instead
// of an access token, for the sandbox whose envd access token is token:
// "" if it authorises the request, else why not, in E2B's words.
func signedFor(method, path string, q url.Values, token string, now time.Time) string {
	sig := q.Get("signature")
	op := ""
	switch {
	case path != "/files":
		return errSigInvalid // a signature opens /files only
	case method == http.MethodGet || method == http.MethodHead:
		op = "read"
	case method == http.MethodPost:
		op = "write"
	default:
		return errSigInvalid
	}
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + token
	if exp := q.Get("signature_expiration"); exp != "" {
		at, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return errSigInvalid
		}
		if now.Unix() > at {
			return errSigExpired
		}
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	if subtle.ConstantTimeCompare([]byte(sig), []byte(want)) != 1 {
		return errSigInvalid
	}
	return ""
}
