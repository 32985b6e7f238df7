package envd

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// account is who a call acts as: the user a command runs as and files are
// made for, and where a relative path starts.
type account struct {
	name     string
	uid, gid uint32
	home     string
	groups   []uint32 // supplementary, from /etc/group
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

// accounts caches lookups while /etc/passwd and /etc/group stay as they
// were: reading and parsing both took about 2 ms of every command's start
// inside gVisor (this node), where two stats take a small part of that.
var accounts struct {
	sync.Mutex
	files [2]fileID
	m     map[string]account
}

// fileID is what says a file was not changed: its inode, size and mtime.
type fileID struct {
	ino, size, mtime int64
}

func idOf(p string) fileID {
	var st syscall.Stat_t
	if syscall.Stat(p, &st) != nil {
		return fileID{ino: -1}
	}
	return fileID{ino: int64(st.Ino), size: st.Size, mtime: st.Mtim.Nano()}
}

// lookup is name's account, from the cache unless the files changed.
func lookup(name string) (account, error) {
	files := [2]fileID{idOf("/etc/passwd"), idOf("/etc/group")}
	accounts.Lock()
	defer accounts.Unlock()
	if accounts.files != files {
		accounts.files, accounts.m = files, map[string]account{}
	}
	if a, ok := accounts.m[name]; ok {
		return a, nil
	}
	a, err := lookupFresh(name)
	if err == nil {
		accounts.m[name] = a
	}
	return a, err
}

// lookupFresh reads the sandbox's own /etc/passwd and /etc/group (os/user's
// pure-Go reader: envd is built without cgo).
func lookupFresh(name string) (account, error) {
	u, err := user.Lookup(name)
	if err != nil {
		if a, ok := numeric(name); ok {
			return a, nil
		}
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
	a := account{name: u.Username, uid: uint32(uid), gid: uint32(gid), home: home}
	if ids, err := u.GroupIds(); err == nil {
		for _, id := range ids {
			if g, err := strconv.ParseUint(id, 10, 32); err == nil {
				a.groups = append(a.groups, uint32(g))
			}
		}
	}
	return a, nil
}

// numeric is the account "UID" or "UID:GID" names when no account of
// that name exists, as a Dockerfile's USER and `docker run --user` mean
// numbers (a template build's RUN in an image with no /etc/passwd): the
// group is the UID's unless given, the home /.
func numeric(name string) (account, bool) {
	us, gs, hasGroup := strings.Cut(name, ":")
	uid, err := strconv.ParseUint(us, 10, 32)
	if err != nil {
		return account{}, false
	}
	gid := uid
	if hasGroup {
		if gid, err = strconv.ParseUint(gs, 10, 32); err != nil {
			return account{}, false
		}
	}
	return account{name: name, uid: uint32(uid), gid: uint32(gid), home: "/"}, true
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
