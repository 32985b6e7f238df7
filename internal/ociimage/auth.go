package ociimage

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"

	"sandstorm/internal/errdefs"
)

// maxAuthFile bounds an auth file: a config.json is a few KiB.
const maxAuthFile = 1 << 20

// Keychain is where a registry's credentials come from. With authFile
// set, that file alone, read now in Docker's config.json format
// ({"auths": {"host[:port]": {"auth": base64(user:pass)} or
// {"username", "password"} or {"identitytoken"} or {"registrytoken"}}});
// credential helpers and credsStore are not run. Without it, the standard
// Docker configuration ($DOCKER_CONFIG/config.json, ~/.docker/config.json)
// through authn.DefaultKeychain. A registry with no entry is asked
// anonymously.
//
// No error quotes the file's contents.
func Keychain(authFile string) (authn.Keychain, error) {
	if authFile == "" {
		return authn.DefaultKeychain, nil
	}
	f, err := os.Open(authFile)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errdefs.New(errdefs.ErrBadInput, "auth file %s does not exist", authFile)
		}
		return nil, errdefs.New(errdefs.ErrBadInput, "auth file %s: %v", authFile, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxAuthFile+1))
	if err != nil {
		return nil, errdefs.New(errdefs.ErrBadInput, "auth file %s: %v", authFile, err)
	}
	if len(data) > maxAuthFile {
		return nil, errdefs.New(errdefs.ErrTooLarge, "auth file %s is over %d bytes: it should hold only {\"auths\": …}", authFile, maxAuthFile)
	}
	return parseAuthFile(authFile, data)
}

// authEntry is one registry's entry in a config.json.
type authEntry struct {
	Auth          string `json:"auth"`
	Username      string `json:"username"`
	Password      string `json:"password"`
	IdentityToken string `json:"identitytoken"`
	RegistryToken string `json:"registrytoken"`
}

func parseAuthFile(file string, data []byte) (authn.Keychain, error) {
	var doc struct {
		Auths map[string]authEntry `json:"auths"`
	}
	// json's syntax and type errors name offsets and types, never the
	// values, so the error can be quoted.
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, errdefs.New(errdefs.ErrBadInput, "auth file %s is not a Docker config.json: %v", file, err)
	}
	kc := fileKeychain{}
	for key, e := range doc.Auths {
		cfg := authn.AuthConfig{
			Username: e.Username, Password: e.Password,
			IdentityToken: e.IdentityToken, RegistryToken: e.RegistryToken,
		}
		if e.Auth != "" {
			raw, err := base64.StdEncoding.DecodeString(e.Auth)
			user, pass, ok := strings.Cut(string(raw), ":")
			if err != nil || !ok {
				return nil, errdefs.New(errdefs.ErrBadInput, "auth file %s: the \"auth\" of %q is not base64 of user:password", file, key)
			}
			cfg.Username, cfg.Password = user, pass
		}
		kc[registryKey(key)] = cfg
	}
	return kc, nil
}

// registryKey is a config.json key as a registry's host[:port]: Docker
// writes Docker Hub as https://index.docker.io/v1/ and others may carry a
// scheme or a path.
func registryKey(key string) string {
	key = strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
	key, _, _ = strings.Cut(key, "/")
	switch key {
	case "docker.io", "registry-1.docker.io":
		return name.DefaultRegistry
	}
	return key
}

// fileKeychain is an auth file's entries by registry.
type fileKeychain map[string]authn.AuthConfig

func (kc fileKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if cfg, ok := kc[registryKey(r.RegistryStr())]; ok {
		return authn.FromConfig(cfg), nil
	}
	return authn.Anonymous, nil
}

// secrets is a keychain that remembers every secret it handed out, so
// that an error can be scrubbed of them: a registry may echo a request's
// credentials in the body of its refusal, and that body becomes the
// error's text.
type secrets struct {
	kc   authn.Keychain
	mu   sync.Mutex
	seen []string
}

func (s *secrets) Resolve(r authn.Resource) (authn.Authenticator, error) {
	a, err := s.kc.Resolve(r)
	if err != nil {
		// A keychain's own error may quote its file; keep only the kind.
		return nil, errdefs.New(errdefs.ErrBadInput, "reading the credentials for %s failed: check the Docker config or the auth file", r.RegistryStr())
	}
	cfg, err := a.Authorization()
	if err != nil {
		return nil, errdefs.New(errdefs.ErrBadInput, "the credentials for %s cannot be used: check the Docker config or the auth file", r.RegistryStr())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range []string{cfg.Password, cfg.Auth, cfg.IdentityToken, cfg.RegistryToken} {
		if len(v) >= 4 { // a shorter one would scrub ordinary words
			s.seen = append(s.seen, v)
		}
	}
	if cfg.Password != "" {
		s.seen = append(s.seen, base64.StdEncoding.EncodeToString([]byte(cfg.Username+":"+cfg.Password)))
	}
	return authn.FromConfig(*cfg), nil
}

// scrub is err with every secret s handed out replaced, keeping its kind;
// an error without one is returned as it is.
func (s *secrets) scrub(err error) error {
	if err == nil || s == nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	msg := err.Error()
	clean := msg
	for _, v := range s.seen {
		clean = strings.ReplaceAll(clean, v, "[redacted]")
	}
	if clean == msg {
		return err
	}
	if e, ok := errdefs.Lookup(err); ok {
		return errdefs.Mark(e.Kind, errors.New(clean))
	}
	return errors.New(clean)
}
