package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"sandstorm/api"
	"sandstorm/internal/apikey"
	"sandstorm/internal/errdefs"
)

// A build's files (its COPY steps' sources, a gzipped tarball each) are
// uploaded by their files hash, once per team: GET
// /templates/{id}/files/{hash} says whether the team has them and gives
// a URL to PUT them to. The SDK PUTs there with no API key (E2B's is a
// storage bucket's presigned URL), so the URL carries its own authority:
// an HMAC of the team, the hash and its expiry (Uploads serves it, the
// master lets it through without a key). A team's uploads are kept
// under its own directory: a hash names nothing of another team's.

// uploadTTL is how long an upload URL may be used.
const uploadTTL = time.Hour

// DefaultMaxUpload bounds one upload when Config.MaxUpload is 0.
const DefaultMaxUpload = 4 << 30

// UploadsPrefix is where Uploads is served, under /e2b.
const UploadsPrefix = "/uploads/"

// teamDir is team's directory name ("" is the operator's, which no team
// name can be: a team is 1-63 of a-z, 0-9 and '-').
func teamDir(team string) string {
	if team == "" {
		return "_operator"
	}
	return team
}

func (s *Service) uploadPath(team, hash string) string {
	return filepath.Join(s.cfg.Templates.DataDir, "e2b-files", teamDir(team), hash+".tar.gz")
}

func (s *Service) uploadSignature(dir, hash string, exp int64) string {
	m := hmac.New(sha256.New, s.cfg.TokenKey)
	m.Write([]byte("e2b-upload\x00" + dir + "\x00" + hash + "\x00" + strconv.FormatInt(exp, 10)))
	return hex.EncodeToString(m.Sum(nil))
}

// fileLink is GET /templates/{templateID}/files/{hash}: {present, url}.
func (s *Service) fileLink(w http.ResponseWriter, r *http.Request) {
	if _, err := s.ownTemplate(r, r.PathValue("templateID")); err != nil {
		fail(w, err)
		return
	}
	hash := r.PathValue("hash")
	if !validHash.MatchString(hash) {
		fail(w, errdefs.New(errdefs.ErrBadInput, "files hash %q: want 64 hex digits (sha256)", hash))
		return
	}
	team := apikey.From(r.Context()).Team
	_, err := os.Stat(s.uploadPath(team, hash))
	present := err == nil
	exp := time.Now().Add(uploadTTL).Unix()
	dir := teamDir(team)
	scheme := "https"
	if r.TLS == nil {
		scheme = "http"
	}
	prefix := "/e2b"
	if _, ok := api.APIHostDomain(r.Host, s.cfg.Domain); ok {
		prefix = "" // the API at the root of api.<domain>
	}
	u := url.URL{Scheme: scheme, Host: r.Host, Path: prefix + UploadsPrefix + dir + "/" + hash,
		RawQuery: url.Values{"expires": {strconv.FormatInt(exp, 10)}, "signature": {s.uploadSignature(dir, hash, exp)}}.Encode()}
	writeJSON(w, http.StatusOK, map[string]any{"present": present, "url": u.String()})
}

// Uploads serves PUT <UploadsPrefix>{team}/{hash}?expires&signature: the
// body, whole or not at all, as that team's files of that hash. It needs
// no API key: its URL is its authority.
func (s *Service) Uploads() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT "+UploadsPrefix+"{team}/{hash}", s.upload)
	return mux
}

func (s *Service) upload(w http.ResponseWriter, r *http.Request) {
	dir, hash := r.PathValue("team"), r.PathValue("hash")
	exp, err := strconv.ParseInt(r.URL.Query().Get("expires"), 10, 64)
	want := s.uploadSignature(dir, hash, exp)
	switch {
	case err != nil || !hmac.Equal([]byte(r.URL.Query().Get("signature")), []byte(want)):
		fail(w, errdefs.New(errdefs.ErrForbidden, "upload URL: invalid signature; ask for another (GET /templates/{id}/files/{hash})"))
		return
	case time.Now().Unix() > exp:
		fail(w, errdefs.New(errdefs.ErrForbidden, "upload URL: expired; ask for another (GET /templates/{id}/files/{hash})"))
		return
	case s.cfg.Templates == nil:
		fail(w, errdefs.New(errdefs.ErrNotSupported, "this master builds no templates"))
		return
	}
	team := dir
	if dir == "_operator" {
		team = ""
	}
	max := s.cfg.MaxUpload
	if max <= 0 {
		max = DefaultMaxUpload
	}
	if err := s.keepUpload(team, hash, http.MaxBytesReader(w, r.Body, max)); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			err = errdefs.New(errdefs.ErrTooLarge, "upload: more than %d bytes", max)
		}
		fail(w, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// keepUpload writes body as team's files of hash: to a temporary file
// beside it, renamed into place once whole.
func (s *Service) keepUpload(team, hash string, body io.Reader) error {
	dst := s.uploadPath(team, hash)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(dst), ".upload-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := io.Copy(f, body); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), dst)
}
