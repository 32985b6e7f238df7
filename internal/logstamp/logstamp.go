// Package logstamp records when each part of a sandbox's console log was
// written, so `sandbox logs --timestamps` can put a time on every line.
//
// The log is a plain file the sandbox writes itself: it must outlive
// sandstormd (a sandbox keeps running across a daemon restart), so nothing
// can sit between the program and the file to stamp lines as they pass,
// as a shim's log pipe would — and one relay process per sandbox is what
// "cheap when idle" rules out. Instead one inotify instance watches the
// logs of running sandboxes (IN_MODIFY), and on each change appends
// "<size> <unix-nanos>" to <log>.stamps: the bytes up to that size were
// there by then ("<size> 0" when a watch begins: what is there already has
// no known time). A line's time is that of the first record that covers
// its end, so it is late by at most the time to notice the write (the
// event is read at once; records closer than minGap are coalesced). Bytes
// written while nothing watched (the daemon was down) have no time.
package logstamp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// minGap coalesces records: a program writing a line every microsecond
// would otherwise write a record per line.
const minGap = 10 * time.Millisecond

// IndexPath is where the stamps of the log at path are kept.
func IndexPath(path string) string { return path + ".stamps" }

// Stamper watches logs and records their growth.
type Stamper struct {
	fd int
	// f is fd as an *os.File: non-blocking, so its reads go through the
	// runtime's poller and Close ends a read in progress (closing a raw
	// fd does not wake a read blocked on it).
	f *os.File

	mu      sync.Mutex
	byWD    map[int32]*watched
	byPath  map[string]int32
	closed  bool
	stopped chan struct{}
}

type watched struct {
	path   string
	idx    *os.File
	size   int64
	lastAt time.Time
	// later records, minGap after the last one, what a coalesced event
	// left unrecorded (a program that writes a line's text and its
	// newline in two writes, as Python's print does, would otherwise
	// leave its last line without a time until the next write).
	later *time.Timer
}

// New starts a Stamper; Close stops it.
func New() (*Stamper, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	s := &Stamper{fd: fd, f: os.NewFile(uintptr(fd), "inotify"), byWD: map[int32]*watched{}, byPath: map[string]int32{}, stopped: make(chan struct{})}
	go s.loop()
	return s, nil
}

// Watch starts recording the growth of the log at path (created empty if
// missing). Watching a path already watched does nothing.
func (s *Stamper) Watch(path string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("logstamp: closed")
	}
	if _, ok := s.byPath[path]; ok {
		return nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	idx, err := os.OpenFile(IndexPath(path), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	wd, err := unix.InotifyAddWatch(s.fd, path, unix.IN_MODIFY)
	if err != nil {
		idx.Close()
		return fmt.Errorf("inotify watch %s: %w", path, err)
	}
	w := &watched{path: path, idx: idx}
	if fi, err := os.Stat(path); err == nil && fi.Size() > 0 {
		// What is there now was written while nothing watched: a record
		// with no time covers it.
		w.size = fi.Size()
		fmt.Fprintf(idx, "%d 0\n", w.size)
	}
	s.byWD[int32(wd)] = w
	s.byPath[path] = int32(wd)
	return nil
}

// Unwatch stops recording the log at path, after a last look at its size.
func (s *Stamper) Unwatch(path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	wd, ok := s.byPath[path]
	if !ok {
		return
	}
	w := s.byWD[wd]
	if w.later != nil {
		w.later.Stop()
		w.later = nil
	}
	s.record(w, time.Now(), true)
	unix.InotifyRmWatch(s.fd, uint32(wd))
	w.idx.Close()
	delete(s.byWD, wd)
	delete(s.byPath, path)
}

// Close stops every watch.
func (s *Stamper) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	for wd, w := range s.byWD {
		if w.later != nil {
			w.later.Stop()
		}
		s.record(w, time.Now(), true)
		w.idx.Close()
		delete(s.byWD, wd)
	}
	s.mu.Unlock()
	s.f.Close() // ends the read in loop
	<-s.stopped
}

func (s *Stamper) loop() {
	defer close(s.stopped)
	buf := make([]byte, 64<<10)
	for {
		n, err := s.f.Read(buf)
		if err != nil || n <= 0 {
			return
		}
		now := time.Now()
		s.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			if w, ok := s.byWD[ev.Wd]; ok {
				s.record(w, now, false)
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
		s.mu.Unlock()
	}
}

// record appends a stamp if the log grew (under mu). A shrunk log (it was
// replaced) starts over from its new size.
func (s *Stamper) record(w *watched, now time.Time, force bool) {
	fi, err := os.Stat(w.path)
	if err != nil {
		return
	}
	size := fi.Size()
	switch {
	case size < w.size:
		w.size = size
		return
	case size == w.size:
		return
	case !force && now.Sub(w.lastAt) < minGap:
		// Coalesced: recorded minGap after the last record at the latest.
		if w.later == nil {
			w.later = time.AfterFunc(minGap-now.Sub(w.lastAt), func() {
				s.mu.Lock()
				defer s.mu.Unlock()
				w.later = nil
				if s.watching(w) {
					s.record(w, time.Now(), true)
				}
			})
		}
		return
	}
	fmt.Fprintf(w.idx, "%d %d\n", size, now.UnixNano())
	w.size, w.lastAt = size, now
}

// watching reports whether w is still watched (under mu).
func (s *Stamper) watching(w *watched) bool {
	wd, ok := s.byPath[w.path]
	return ok && s.byWD[wd] == w
}

// stamp is one record: the log held Size bytes at At.
type stamp struct {
	Size int64
	At   time.Time
}

// readStamps loads the records of the log at path, in order; a torn last
// line (a crash mid-write) is dropped.
func readStamps(path string) []stamp {
	data, err := os.ReadFile(IndexPath(path))
	if err != nil {
		return nil
	}
	if i := bytes.LastIndexByte(data, '\n'); i < len(data)-1 {
		data = data[:i+1] // the torn last line, if any
	}
	var out []stamp
	for _, l := range bytes.Split(data, []byte{'\n'}) {
		var sz, ns int64
		if _, err := fmt.Sscanf(string(l), "%d %d", &sz, &ns); err == nil && (len(out) == 0 || sz >= out[len(out)-1].Size) {
			st := stamp{Size: sz}
			if ns != 0 {
				st.At = time.Unix(0, ns).UTC()
			}
			out = append(out, st)
		}
	}
	return out
}

// Annotate copies the log at path from byte offset from to w, each line
// prefixed with the time it was written (RFC 3339, UTC, milliseconds) and
// a space, or "-" in its place when nothing recorded it. It returns the
// offset it stopped at: the end of the last complete line (a partial last
// line is left for the next call, so a follower never stamps half a line).
func Annotate(path string, from int64, w io.Writer) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return from, err
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return from, err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return from, err
	}
	stamps := readStamps(path)
	bw := bufio.NewWriter(w)
	off := from
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		line := data[:i+1]
		end := off + int64(len(line))
		if at, rest, ok := markTime(line); ok {
			// The node's own lines carry the time they were written
			// (even while nothing watched): shown once, in the column.
			bw.WriteString(at.UTC().Format(stampLayout))
			bw.WriteString(" --- ")
			bw.Write(rest)
		} else {
			bw.WriteString(stampFor(stamps, end))
			bw.WriteByte(' ')
			bw.Write(line)
		}
		data = data[i+1:]
		off = end
	}
	return off, bw.Flush()
}

// stampFor is the time of the first record covering byte offset end.
func stampFor(stamps []stamp, end int64) string {
	i := sort.Search(len(stamps), func(i int) bool { return stamps[i].Size >= end })
	if i == len(stamps) || stamps[i].At.IsZero() {
		return "-" + pad
	}
	return stamps[i].At.Format(stampLayout)
}

// stampLayout is RFC 3339 with milliseconds.
const stampLayout = "2006-01-02T15:04:05.000Z07:00"

// markTime reads a line the node writes into a console log itself,
// "--- <RFC 3339 time> sandstorm: … ---", and returns its time and what
// follows the time ("sandstorm: … ---\n").
func markTime(line []byte) (time.Time, []byte, bool) {
	rest, ok := bytes.CutPrefix(line, []byte("--- "))
	if !ok {
		return time.Time{}, nil, false
	}
	ts, after, ok := bytes.Cut(rest, []byte(" "))
	if !ok || !bytes.HasPrefix(after, []byte("sandstorm: ")) {
		return time.Time{}, nil, false
	}
	at, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return time.Time{}, nil, false
	}
	return at, after, true
}

// pad lines "-" up with a time's width, so the lines' text stays aligned.
var pad = string(bytes.Repeat([]byte{' '}, len("2006-01-02T15:04:05.000Z")-1))
