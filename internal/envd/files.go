package envd

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// download is GET /files?path=&username=: the file's bytes, streamed
// (http.ServeContent: ranges, no whole-file buffer).
func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	acct, err := s.userOf(r.Header, r.URL.Query().Get("username"))
	if err != nil {
		httpError(w, http.StatusUnauthorized, err.Error())
		return
	}
	p, err := acct.resolve(r.URL.Query().Get("path"))
	if err != nil {
		httpError(w, http.StatusBadRequest, err.Error())
		return
	}
	f, err := os.Open(p)
	if err != nil {
		fileError(w, p, err)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		fileError(w, p, err)
		return
	}
	if st.IsDir() {
		httpError(w, http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", p))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": filepath.Base(p)}))
	http.ServeContent(w, r, "", st.ModTime(), f)
}

// uploaded is one entry of POST /files' answer (envd.yaml, EntryInfo).
type uploaded struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
	// Metadata is what the upload set (X-Metadata-*), absent when none:
	// the SDK's signing test compares an answer without it whole.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// upload is POST /files: a multipart form whose "file" parts are written
// (each to ?path= when one is given, else to the part's filename), or,
// from envd 0.5.7, an application/octet-stream body written to ?path=.
// A file is streamed to disk, never held whole in memory; it is written to
// a temporary name beside it and renamed, so a reader never sees half a
// file and a failed upload leaves the old one. Parent directories are made
// as needed, owned by the user, as is the file.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	acct, err := s.userOf(r.Header, r.URL.Query().Get("username"))
	if err != nil {
		httpError(w, http.StatusUnauthorized, err.Error())
		return
	}
	target := r.URL.Query().Get("path")
	md, err := metadataOf(r.Header)
	if err != nil {
		httpError(w, http.StatusBadRequest, err.Error())
		return
	}
	var body io.Reader = r.Body
	switch enc := r.Header.Get("Content-Encoding"); enc {
	case "", "identity":
	case "gzip":
		// The SDK's write with gzip: true (octet-stream only).
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			httpError(w, http.StatusBadRequest, "gzip body: "+err.Error())
			return
		}
		defer zr.Close()
		body = zr
	default:
		httpError(w, http.StatusBadRequest, fmt.Sprintf("Content-Encoding %q: want gzip or identity", enc))
		return
	}
	var out []uploaded
	write := func(name string, body io.Reader) bool {
		p, err := acct.resolve(name)
		if err != nil {
			httpError(w, http.StatusBadRequest, err.Error())
			return false
		}
		if err := writeFileAs(p, body, acct, md); err != nil {
			fileError(w, p, err)
			return false
		}
		u := uploaded{Path: p, Name: filepath.Base(p), Type: "file"}
		if len(md) > 0 {
			u.Metadata = md
		}
		out = append(out, u)
		return true
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case mt == "application/octet-stream":
		if target == "" {
			httpError(w, http.StatusBadRequest, "an octet-stream upload needs ?path=")
			return
		}
		if !write(target, body) {
			return
		}
	case strings.HasPrefix(mt, "multipart/"):
		// multipart.Reader reads its source 4 KiB at a time (its peek
		// buffer); each read of the connection is a system call into
		// gVisor's netstack, so a 100 MiB upload made 25,600 of them and
		// ran at 55 MB/s where an octet-stream one ran at 350 MB/s
		// (measured on this node). A large buffer under it makes those
		// reads from memory.
		mr := multipart.NewReader(bufio.NewReaderSize(body, uploadBuffer), params["boundary"])
		if !writeParts(w, mr, target, write) {
			return
		}
	default:
		httpError(w, http.StatusBadRequest, fmt.Sprintf("Content-Type %q: want multipart/form-data or application/octet-stream", mt))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	writeJSON(w, out)
}

// writeParts writes each "file" part of mr with write: to target, or
// when there is none to the part's own path. It reports whether all
// were written; if not, it has answered why.
func writeParts(w http.ResponseWriter, mr *multipart.Reader, target string, write func(string, io.Reader) bool) bool {
	n := 0
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			httpError(w, http.StatusBadRequest, "multipart body: "+err.Error())
			return false
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		name := target
		if name == "" {
			name = partPath(part)
		}
		if name == "" {
			httpError(w, http.StatusBadRequest, "a file part with no filename and no ?path=")
			return false
		}
		ok := write(name, part)
		part.Close()
		if !ok {
			return false
		}
		n++
	}
	if n == 0 {
		httpError(w, http.StatusBadRequest, `no "file" part in the multipart body`)
		return false
	}
	return true
}

// partPath is where a multipart upload's part goes: its filename as the
// SDK sent it, a path relative to the user's home or absolute
// (files.write([...]) sends one part per file so). Not Part.FileName,
// which keeps only the last element (filepath.Base) and so wrote
// "/0/f.txt" to ~/f.txt.
func partPath(part *multipart.Part) string {
	_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// uploadSuffix marks an upload's temporary file: ".<base>.upload-<n>"
// (watchers tell its events as the target's: filesystem.go).
const uploadSuffix = ".upload-"

// uploadNew follows uploadSuffix when the target did not exist.
const uploadNew = "new-"

// uploadBuffer is the size of the writes an upload makes.
const uploadBuffer = 1 << 20

func writeFileAs(p string, body io.Reader, acct account, md map[string]string) error {
	if st, err := os.Stat(p); err == nil && st.IsDir() {
		return fmt.Errorf("path '%s' is a directory: %w", p, syscall.EISDIR)
	}
	dir := filepath.Dir(p)
	if err := mkdirAllAs(dir, acct); err != nil {
		return err
	}
	// The temporary name says whether the target is new, for watchers,
	// which see its events later (filesystem.go, uploadTarget).
	mark := uploadSuffix
	if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
		mark += uploadNew
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(p)+mark+"*")
	if err != nil {
		return err
	}
	// Large writes: each write to a file of the sandbox's volume is a
	// call to gVisor's gofer, so 32 KiB at a time (io.Copy's) costs a
	// 100 MiB upload thousands of them.
	// (A bufio.Writer fills its buffer before it writes; the struct hides
	// the file's ReadFrom, which would go around it.)
	bw := bufio.NewWriterSize(struct{ io.Writer }{tmp}, uploadBuffer)
	_, err = io.Copy(bw, body)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Lchown(tmp.Name(), int(acct.uid), int(acct.gid))
	}
	if err == nil {
		err = setMetadata(tmp.Name(), md)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// fileError answers a filesystem error with envd's status for it.
func fileError(w http.ResponseWriter, p string, err error) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		httpError(w, http.StatusNotFound, fmt.Sprintf("path '%s' does not exist", p))
	case errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTDIR):
		httpError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, fs.ErrPermission):
		httpError(w, http.StatusForbidden, err.Error())
	case errors.Is(err, syscall.ENOSPC):
		httpError(w, http.StatusInsufficientStorage, "not enough disk space available")
	default:
		httpError(w, http.StatusInternalServerError, err.Error())
	}
}
