package envd

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
)

// account is who a call acts as: the user a command runs as and files are
// made for, and where a relative path starts.
type account struct {
	name     string
	uid, gid uint32
	home     string
}

// userOf is who a request acts as. The SDK names a user in an
// `Authorization: Basic base64("<user>:")` header (envd/rpc.ts,
// authenticationHeader), /files in a `username` parameter; naming none
// means the sandbox's default user. The password part is empty and not
// checked: the node has already checked the caller's access token, and
// inside the sandbox every user is the sandbox's anyway.
func (s *Server) userOf(h http.Header, param string) (account, error) {
	name := param
	if name == "" {
		if v, ok := strings.CutPrefix(h.Get("Authorization"), "Basic "); ok {
			b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
			if err != nil {
				return account{}, fmt.Errorf("authorization header: %v", err)
			}
			name, _, _ = strings.Cut(string(b), ":")
		}
	}
	if name == "" {
		name = s.cfg.DefaultUser
	}
	if name == "" {
		name = "root"
	}
	return lookup(name)
}

// lookup reads the sandbox's own /etc/passwd (os/user's pure-Go reader:
// envd is built without cgo).
func lookup(name string) (account, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return account{}, fmt.Errorf("error looking up user '%s': %v", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return account{}, fmt.Errorf("user '%s': uid %q gid %q are not numbers", name, u.Uid, u.Gid)
	}
	home := u.HomeDir
	if home == "" {
		home = "/"
	}
	return account{name: u.Username, uid: uint32(uid), gid: uint32(gid), home: home}, nil
}

// resolve makes p absolute: relative to the user's home (envd.yaml,
// parameters.FilePath), with a leading "~" meaning that home. It is a
// path of the sandbox: envd runs inside it, so ".." or a symlink can only
// ever reach the sandbox's own root.
func (a account) resolve(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("path is empty")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("path %q holds a NUL byte", p)
	}
	if p == "~" {
		p = a.home
	} else if rest, ok := strings.CutPrefix(p, "~/"); ok {
		p = filepath.Join(a.home, rest)
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(a.home, p)
	}
	return filepath.Clean(p), nil
}
