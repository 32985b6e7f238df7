package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "sandstorm/third_party/envd/filesystem"
)

// filesystem is the filesystem.Filesystem service. Every path is resolved
// for the calling user (relative: from their home) and is a path of the
// sandbox's own root — envd runs inside the sandbox, so no spelling of a
// path (.., a symlink, an absolute path) can name a file of the host.
// What it makes is owned by the calling user, as if they had made it.
type filesystem struct {
	s        *Server
	mu       sync.Mutex
	watchers map[string]*watcher
}

func (f *filesystem) path(h http.Header, p string) (string, account, error) {
	acct, err := f.s.userOf(h, "")
	if err != nil {
		return "", account{}, errUnauthed(err)
	}
	abs, err := acct.resolve(p)
	if err != nil {
		return "", account{}, errBadInput(err)
	}
	return abs, acct, nil
}

func (f *filesystem) Stat(_ context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	p, _, err := f.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := entry(p)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

func (f *filesystem) MakeDir(_ context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	p, acct, err := f.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if st, err := os.Lstat(p); err == nil {
		if st.IsDir() {
			return nil, errExists(fmt.Errorf("directory '%s' already exists", p))
		}
		return nil, errBadInput(fmt.Errorf("path '%s' already exists and is not a directory", p))
	}
	if err := mkdirAllAs(p, acct); err != nil {
		return nil, fsError(err)
	}
	e, err := entry(p)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
}

// mkdirAllAs makes p and its missing parents, owned by acct.
func mkdirAllAs(p string, acct account) error {
	var made []string
	for d := p; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil || d == "/" {
			break
		}
		made = append(made, d)
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		return err
	}
	for _, d := range made {
		os.Lchown(d, int(acct.uid), int(acct.gid))
	}
	return nil
}

func (f *filesystem) Move(_ context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	src, acct, err := f.path(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := acct.resolve(req.Msg.GetDestination())
	if err != nil {
		return nil, errBadInput(err)
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, fsError(err)
	}
	if err := mkdirAllAs(filepath.Dir(dst), acct); err != nil {
		return nil, fsError(err)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, fsError(err)
	}
	e, err := entry(dst)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
}

func (f *filesystem) ListDir(_ context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	root, _, err := f.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth < 1 {
		depth = 1
	}
	if st, err := os.Stat(root); err != nil {
		return nil, fsError(err)
	} else if !st.IsDir() {
		return nil, errBadInput(fmt.Errorf("path '%s' is not a directory", root))
	}
	out := &pb.ListDirResponse{}
	// WalkDir does not follow symlinks: a link is listed, not entered.
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return err
			}
			return nil // an entry that vanished or cannot be read mid-walk
		}
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		level := strings.Count(rel, "/") + 1
		if e, err := entry(p); err == nil {
			out.Entries = append(out.Entries, e)
		}
		if d.IsDir() && level >= depth {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(out), nil
}

func (f *filesystem) Remove(_ context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	p, _, err := f.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, errBadInput(errors.New("will not remove /"))
	}
	// A missing path is not an error: E2B's envd removes as os.RemoveAll
	// does, and the SDK's own test removes a file that is not there.
	if err := os.RemoveAll(p); err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

// entry describes p without following it when it is a symlink (its
// target is given instead).
func entry(p string) (*pb.EntryInfo, error) {
	st, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	e := &pb.EntryInfo{
		Name:         filepath.Base(p),
		Path:         p,
		Size:         st.Size(),
		Mode:         uint32(st.Mode().Perm()),
		Permissions:  st.Mode().String(),
		ModifiedTime: timestamppb.New(st.ModTime()),
	}
	e.Metadata = readMetadata(p)
	switch {
	case st.Mode()&fs.ModeSymlink != 0:
		e.Type = pb.FileType_FILE_TYPE_SYMLINK
		if t, err := os.Readlink(p); err == nil {
			// The target as E2B's envd gives it: absolute, resolved
			// against the link's directory (ln -s f.txt l gives
			// /home/user/f.txt), cleaned.
			if !filepath.IsAbs(t) {
				t = filepath.Join(filepath.Dir(p), t)
			}
			t = filepath.Clean(t)
			e.SymlinkTarget = &t
		}
	case st.IsDir():
		e.Type = pb.FileType_FILE_TYPE_DIRECTORY
	default:
		e.Type = pb.FileType_FILE_TYPE_FILE
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		e.Owner = nameOf(user.LookupId, sys.Uid)
		e.Group = nameOf(func(id string) (*user.User, error) {
			g, err := user.LookupGroupId(id)
			if err != nil {
				return nil, err
			}
			return &user.User{Username: g.Name}, nil
		}, sys.Gid)
	}
	return e, nil
}

func nameOf(look func(string) (*user.User, error), id uint32) string {
	s := strconv.FormatUint(uint64(id), 10)
	if u, err := look(s); err == nil {
		return u.Username
	}
	return s
}

// fsError maps a filesystem error to the Connect code the SDK reads:
// NotFound becomes its NotFoundError (files.exists answers false on it).
func fsError(err error) error {
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		return err
	case errors.Is(err, fs.ErrNotExist):
		return errNotFound(err)
	case errors.Is(err, fs.ErrExist):
		return errExists(err)
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTEMPTY):
		return errBadInput(err)
	case errors.Is(err, syscall.ENOSPC):
		return connect.NewError(connect.CodeResourceExhausted, err)
	}
	return errInternal(err)
}

// watcher is one watch of a directory: fsnotify (inotify, which gVisor's
// kernel implements) on the directory and, when recursive, on every
// directory below it, including ones made later.
type watcher struct {
	w         *fsnotify.Watcher
	root      string
	recursive bool
	entries   bool

	mu     sync.Mutex
	events []*pb.FilesystemEvent // for GetWatcherEvents

	// movingIn: targets of uploads whose temporary file was renamed
	// onto them, until the rename's Create is seen (event's goroutine
	// only).
	movingIn map[string]bool
}

func (f *filesystem) newWatcher(root string, recursive, entries bool) (*watcher, error) {
	st, err := os.Stat(root)
	if err != nil {
		return nil, fsError(err)
	}
	if !st.IsDir() {
		return nil, errBadInput(fmt.Errorf("path '%s' is not a directory", root))
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, errInternal(err)
	}
	w := &watcher{w: fw, root: root, recursive: recursive, entries: entries, movingIn: map[string]bool{}}
	if err := w.add(root); err != nil {
		fw.Close()
		return nil, fsError(err)
	}
	return w, nil
}

func (w *watcher) add(dir string) error {
	if !w.recursive {
		return w.w.Add(dir)
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() {
			return w.w.Add(p)
		}
		return nil
	})
}

// event turns an fsnotify event into E2B's: the name relative to the
// watched directory, one type per event.
//
// An upload (files.go, writeFileAs) writes a temporary file beside its
// target and renames it over the target, so that no reader sees half a
// file; E2B's envd writes the target in place, and the SDK waits for a
// WRITE of the target's name. Its events are told as E2B's would be: the
// temporary file's creation is the target's (when the target is new),
// its writes are the target's writes, the rest of it is not told.
func (w *watcher) event(ev fsnotify.Event) *pb.FilesystemEvent {
	name := ev.Name
	if target, isNew, ok := uploadTarget(ev.Name); ok {
		switch {
		case ev.Has(fsnotify.Create):
			if !isNew {
				return nil // an overwrite: its writes say it
			}
			ev = fsnotify.Event{Name: target, Op: fsnotify.Create}
		case ev.Has(fsnotify.Write):
			name, ev = ev.Name, fsnotify.Event{Name: target, Op: fsnotify.Write}
		case ev.Has(fsnotify.Rename):
			w.movingIn[target] = true
			return nil
		default:
			return nil
		}
	} else if ev.Has(fsnotify.Create) && w.movingIn[ev.Name] {
		delete(w.movingIn, ev.Name)
		return nil
	}
	e := w.told(ev)
	if e != nil && w.entries && name != ev.Name {
		// The temporary file's entry, under the target's name; once it
		// is renamed, the target's.
		if tmp, err := entry(name); err == nil {
			tmp.Name, tmp.Path = filepath.Base(ev.Name), ev.Name
			e.Entry = tmp
		} else if t, err := entry(ev.Name); err == nil {
			e.Entry = t
		}
	}
	return e
}

// uploadTarget is the path an upload's temporary file p becomes
// (".<base>.upload-[new-]<digits>", os.CreateTemp's), if p is one, and
// whether that path was new when the upload began.
func uploadTarget(p string) (target string, isNew, ok bool) {
	base := filepath.Base(p)
	i := strings.LastIndex(base, uploadSuffix)
	if !strings.HasPrefix(base, ".") || i < 2 {
		return "", false, false
	}
	digits := base[i+len(uploadSuffix):]
	digits, isNew = strings.CutPrefix(digits, uploadNew)
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return "", false, false
	}
	return filepath.Join(filepath.Dir(p), base[1:i]), isNew, true
}

// told is an fsnotify event as E2B tells it.
func (w *watcher) told(ev fsnotify.Event) *pb.FilesystemEvent {
	rel, err := filepath.Rel(w.root, ev.Name)
	if err != nil {
		rel = ev.Name
	}
	out := &pb.FilesystemEvent{Name: rel}
	switch {
	case ev.Has(fsnotify.Create):
		out.Type = pb.EventType_EVENT_TYPE_CREATE
		if w.recursive {
			if st, err := os.Lstat(ev.Name); err == nil && st.IsDir() {
				w.add(ev.Name)
			}
		}
	case ev.Has(fsnotify.Write):
		out.Type = pb.EventType_EVENT_TYPE_WRITE
	case ev.Has(fsnotify.Remove):
		out.Type = pb.EventType_EVENT_TYPE_REMOVE
	case ev.Has(fsnotify.Rename):
		out.Type = pb.EventType_EVENT_TYPE_RENAME
	case ev.Has(fsnotify.Chmod):
		out.Type = pb.EventType_EVENT_TYPE_CHMOD
	default:
		return nil
	}
	if w.entries && out.Type != pb.EventType_EVENT_TYPE_REMOVE && out.Type != pb.EventType_EVENT_TYPE_RENAME {
		if e, err := entry(ev.Name); err == nil {
			out.Entry = e
		}
	}
	return out
}

func (f *filesystem) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	root, _, err := f.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	w, err := f.newWatcher(root, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return err
	}
	defer w.w.Close()
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	tick := time.NewTicker(keepaliveOf(req.Header()))
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-w.w.Events:
			if !ok {
				return nil
			}
			if e := w.event(ev); e != nil {
				if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: e}}); err != nil {
					return err
				}
			}
		case err := <-w.w.Errors:
			return errInternal(fmt.Errorf("watch %s: %v", root, err))
		case <-tick.C:
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// maxWatcherEvents bounds what a polled watcher keeps between polls: a
// client that stops polling must not grow envd without bound.
const maxWatcherEvents = 10000

func (f *filesystem) CreateWatcher(_ context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	root, _, err := f.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	w, err := f.newWatcher(root, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return nil, err
	}
	var b [8]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	f.mu.Lock()
	f.watchers[id] = w
	f.mu.Unlock()
	go func() {
		for ev := range w.w.Events {
			if e := w.event(ev); e != nil {
				w.mu.Lock()
				if len(w.events) < maxWatcherEvents {
					w.events = append(w.events, e)
				}
				w.mu.Unlock()
			}
		}
	}()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

func (f *filesystem) watcher(id string) (*watcher, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.watchers[id]
	if !ok {
		return nil, errNotFound(fmt.Errorf("watcher %q not found", id))
	}
	return w, nil
}

func (f *filesystem) GetWatcherEvents(_ context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	w, err := f.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	evs := w.events
	w.events = nil
	w.mu.Unlock()
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *filesystem) RemoveWatcher(_ context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	w, err := f.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	delete(f.watchers, req.Msg.GetWatcherId())
	f.mu.Unlock()
	w.w.Close()
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}
