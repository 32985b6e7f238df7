// Package envd is the API an E2B SDK calls inside a sandbox: processes
// (process.Process) and the filesystem (filesystem.Filesystem) over Connect
// RPC, file upload and download on /files, and /health. The services are
// those of E2B's own .proto files (third_party/envd), so the SDK's
// generated clients speak to it unchanged.
//
// It runs inside the sandbox (cmd/sandstorm-envd, started by the node on
// the first call that needs it; docs/ARCHITECTURE.md, "envd"), as root of
// the sandbox's own gVisor kernel: what it starts is confined exactly as
// the template's process is — the same sandbox, the same network
// namespace, the boundary its only way out — and a path, however it is
// spelled, names a file of the sandbox, never of the host. It checks no
// token itself: it listens only inside the sandbox's network namespace,
// and the master checks the caller (the API token, the owning team's key,
// or the sandbox's access token) before a request is forwarded. A process
// inside the sandbox can reach it too, and run commands as any user of
// the sandbox: the sandbox is the unit of trust (docs/ARCHITECTURE.md,
// "envd").
package envd

import (
	"encoding/json"
	"io"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"sandstorm/api"
	"sandstorm/third_party/envd/filesystem/filesystemconnect"
	"sandstorm/third_party/envd/process/processconnect"
)

// Version and Port are envd's API version and port (api.EnvdVersion,
// api.EnvdPort: the servers in front of envd name them too).
const (
	Version = api.EnvdVersion
	Port    = api.EnvdPort
)

// Config is what envd knows of its sandbox.
type Config struct {
	// DefaultUser runs commands and owns files when a call names no user
	// (the SDK sends none from envd 0.4.0 on). Empty: root.
	DefaultUser string
	// DefaultWorkdir is a command's directory when it asks for none.
	// Empty: the user's home.
	DefaultWorkdir string
	// Env is added to every command's environment, under what it asks.
	Env map[string]string
}

// EnvHeader carries the sandbox's environment on every call
// (api.EnvdEnvHeader).
const EnvHeader = api.EnvdEnvHeader

func decodeEnv(h http.Header) map[string]string { return api.DecodeEnv(h.Get(EnvHeader)) }

// Server serves the envd API.
type Server struct {
	cfg   Config
	procs *processes
	fs    *filesystem
}

// New returns a server for cfg.
func New(cfg Config) *Server {
	s := &Server{cfg: cfg}
	s.procs = newProcesses(s)
	s.fs = &filesystem{s: s, watchers: map[string]*watcher{}}
	return s
}

// Handler is the whole API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(s.procs))
	mux.Handle(filesystemconnect.NewFilesystemHandler(s.fs))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /files", s.download)
	mux.HandleFunc("POST /files", s.upload)
	return mux
}

// httpError answers as envd does: a JSON body {"code", "message"}
// (spec/envd/envd.yaml, components.schemas.Error).
func httpError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"code": code, "message": msg})
}

// keepalive is how often a server stream sends a keepalive event when the
// client asked for none (the SDK asks with Keepalive-Ping-Interval, in
// seconds): proxies between the SDK and envd cut connections idle longer.
const keepalive = 50 * time.Second

func keepaliveOf(h http.Header) time.Duration {
	var sec int
	if v := h.Get("Keepalive-Ping-Interval"); v != "" {
		if err := json.Unmarshal([]byte(v), &sec); err == nil && sec > 0 && sec < 3600 {
			return time.Duration(sec) * time.Second
		}
	}
	return keepalive
}

func errNotFound(err error) error   { return connect.NewError(connect.CodeNotFound, err) }
func errBadInput(err error) error   { return connect.NewError(connect.CodeInvalidArgument, err) }
func errInternal(err error) error   { return connect.NewError(connect.CodeInternal, err) }
func errUnauthed(err error) error   { return connect.NewError(connect.CodeUnauthenticated, err) }
func errExists(err error) error     { return connect.NewError(connect.CodeAlreadyExists, err) }
func errFailedPrec(err error) error { return connect.NewError(connect.CodeFailedPrecondition, err) }

func writeJSON(w io.Writer, v any) { json.NewEncoder(w).Encode(v) }
