// Package daemon wires a sandstormd process together: store, backend, node,
// API. cmd/sandstormd stays a thin layer of flags over it.
package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	sdnotify "github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"

	"sandstorm/internal/console"
	"sandstorm/internal/e2b"
	"sandstorm/internal/enrol"
	"sandstorm/internal/events"
	"sandstorm/internal/fleet"
	"sandstorm/internal/handoff"
	"sandstorm/internal/imagetemplate"
	"sandstorm/internal/ingress"
	"sandstorm/internal/layercache"
	"sandstorm/internal/master"
	"sandstorm/internal/memguard"
	"sandstorm/internal/metrics"
	"sandstorm/internal/netns"
	"sandstorm/internal/node"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/nodeside"
	"sandstorm/internal/ociimage"
	"sandstorm/internal/pki"
	"sandstorm/internal/reclaim"
	"sandstorm/internal/rootfs"
	"sandstorm/internal/routes"
	"sandstorm/internal/sam/boundary"
	"sandstorm/internal/sam/dialguard"
	"sandstorm/internal/sam/egresslog"
	"sandstorm/internal/sam/policy"
	"sandstorm/internal/sam/refusals"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/sandbox/gvisor"
	"sandstorm/internal/sandbox/process"
	"sandstorm/internal/sandboxes"
	"sandstorm/internal/secretfile"
	"sandstorm/internal/secrets"
	"sandstorm/internal/store"
	"sandstorm/internal/templates"
	"sandstorm/internal/tier"
)

// Options are sandstormd serve's flags.
type Options struct {
	Master, Node bool
	DataDir      string
	Listen       string // API address, host:port
	Backend      string // "gvisor" or "process"
	// Runsc is the runsc binary ("" is the pinned one next to sandstormd,
	// from make runsc); Platform its platform ("" is systrap);
	// Compression that of snapshot images ("" is none).
	Runsc, Platform, Compression string
	Subnet                       string // sandbox address pool, e.g. 10.213.0.0/16
	GatewayBind                  string // address the gateway listens on
	// HostListen is the Host-routed gateway listener's address ("": none),
	// HostDomain the domain its names end in.
	HostListen, HostDomain string
	// Envd is the envd binary put in every sandbox for commands and files
	// ("": sandstorm-envd beside this executable, if it is there; "none":
	// no commands and files).
	Envd         string
	GatewayPorts string // "20000-29999"
	MemReserve   int64  // MiB
	// SandboxMemory is the default memory limit of a sandbox, MiB;
	// DiskReserve the disk (MiB) kept free under the data dir.
	SandboxMemory, DiskReserve int64
	MaxWakes, MaxStarts        int
	Admission                  time.Duration
	Ready                      time.Duration
	Timers                     tier.Timers
	MaxUpload                  int64 // bytes
	// BuildPrincipal is the principal of template builds' RUN sandboxes.
	BuildPrincipal string
	// RegistryMirrors maps a registry ("docker.io" for Docker Hub) to the
	// host[:port] that serves its images instead (templates.Mirror).
	RegistryMirrors map[string]string
	Zswap           bool
	// Policy is the SAM policy file every boundary decides by ("" = deny
	// everything); SAMNode the local sam-node's agent socket
	// ("unix:///run/sam-node.sock"; "" = no mesh); MetricsAddr serves the
	// process's Prometheus metrics — the node's, the master's and the
	// boundaries' (internal/metrics) — on http://MetricsAddr/metrics
	// ("" = off).
	Policy, SAMNode, MetricsAddr string
	// Resolver is the DNS server ("host:port") boundaries resolve allowed
	// external names with; "" is the system's resolver.
	Resolver string
	// SecretsCA is a PEM file of CAs that verify the servers secrets go
	// to, beside the system's roots ("": the system's alone).
	SecretsCA string
	// Store is where desired state lives: "" is SQLite in the data dir, a
	// postgres:// URL a PostgreSQL database other masters may share (one
	// leads, the others stand by: standby.go).
	Store string
	// NodeName names this node in the store ("local" if empty): nodes
	// sharing a store need names of their own.
	NodeName string
	// NodeListen is where a node apart from its master (--node alone)
	// listens for it: pairing, then the seam over mutual TLS.
	NodeListen string
	// IngressListen, if set, is where such a node serves E2B's traffic
	// to every sandbox of the fleet (ingress.go); IngressCert and
	// IngressKey its TLS (none: plain HTTP, for a TLS proxy in front).
	IngressListen, IngressCert, IngressKey string
	// IngressRequests: the ingress forwards request by request only,
	// never passing a connection to its holder's ingress unread
	// (ingress.Passthrough).
	IngressRequests bool
	// IngressPublic is the address clients reach this node's ingress at
	// (--ingress-public), which it gives its peers for the fleet's DNS;
	// IngressDNS where it answers that DNS (--ingress-dns, UDP and TCP),
	// IngressDNSRecords its fixed names (NAME=IP), IngressDNSNS the
	// zone's name servers, and IngressDNSRate the answers a second over
	// UDP per client network and name (0: no limit). ingressdns.go.
	IngressPublic, IngressDNS       string
	IngressDNSRecords, IngressDNSNS []string
	IngressDNSRate                  float64
	// Join is the master a node behind NAT dials (https://host:port),
	// CAFingerprint the SHA-256 of the master's CA it checks, and
	// JoinToken what admits it the first time.
	Join, CAFingerprint, JoinToken string
	Log                            *slog.Logger

	// mreg is the process's one metrics registry (Serve makes it): the
	// node's, the master's and the boundaries' metrics, counted whether
	// or not MetricsAddr serves them (the console charts the node's).
	mreg *prometheus.Registry

	// Reload delivers reload requests (SIGHUP): the binary at this
	// process's path is executed in its place and takes every listening
	// socket over (reload.go); nil: none. ReloadDrain bounds a reload's
	// wait for requests in flight (0: DefaultReloadDrain).
	Reload      <-chan struct{}
	ReloadDrain time.Duration

	// reg holds every listener, for a reload to hand over (set by Serve);
	// reconciled is closed when the node's start-up repair is done.
	reg        *handoff.Registry
	reconciled chan struct{}
}

// EnsureToken returns the API token in <dataDir>/pki/api-token, creating it
// (32 random bytes, hex, mode 0600) on first start.
func EnsureToken(dataDir string) (string, error) {
	path := tokenPath(dataDir)
	if b, err := os.ReadFile(path); err == nil {
		if tok := strings.TrimSpace(string(b)); tok != "" {
			os.Chmod(path, 0o600)
			return tok, nil
		}
	}
	tok, err := newToken()
	if err != nil {
		return "", err
	}
	return tok, writeToken(dataDir, tok)
}

func tokenPath(dataDir string) string { return filepath.Join(dataDir, "pki", "api-token") }

// newToken is 32 random bytes in hex.
func newToken() (string, error) { return secretfile.NewToken() }

// writeToken puts tok in <dataDir>/pki/api-token (mode 0600, atomically),
// where the CLI on this machine reads it.
func writeToken(dataDir, tok string) error {
	if err := os.MkdirAll(filepath.Join(dataDir, "pki"), 0o700); err != nil {
		return err
	}
	path := tokenPath(dataDir)
	if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == tok {
		return os.Chmod(path, 0o600)
	}
	return secretfile.Write(path, []byte(tok+"\n"))
}

// ensureCA loads or makes the master's CA under <dataDir>/pki. Masters
// sharing a PostgreSQL store share one CA (kept in the store with the API
// token), so a client's trust holds whichever of them leads.
func ensureCA(ctx context.Context, st *store.Store, dataDir string) (*pki.CA, error) {
	dir := filepath.Join(dataDir, "pki")
	if st.Dialect() != "postgres" {
		return pki.EnsureCA(dir)
	}
	v, err := st.SharedSecret(ctx, "ca", func() (string, error) {
		c, k, err := pki.NewCA()
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(map[string]string{"cert": string(c), "key": string(k)})
		return string(b), err
	})
	if err != nil {
		return nil, err
	}
	var pair map[string]string
	if err := json.Unmarshal([]byte(v), &pair); err != nil {
		return nil, fmt.Errorf("the CA in the store is corrupt: %w", err)
	}
	if err := pki.WriteCA(dir, []byte(pair["cert"]), []byte(pair["key"])); err != nil {
		return nil, err
	}
	return pki.ParseCA([]byte(pair["cert"]), []byte(pair["key"]))
}

// lockDataDir takes an exclusive lock on <dataDir>/lock so two daemons never
// manage the same sandboxes. The lock goes with the process, kill -9 too;
// across a reload it is handed over (reg), never let go.
func lockDataDir(dataDir string, reg *handoff.Registry) (*os.File, error) {
	if reg == nil {
		reg = handoff.New(nil)
	}
	return reg.File(filepath.Join(dataDir, "lock"), func() (*os.File, error) { return takeLock(dataDir) })
}

// takeLock takes <dataDir>/lock, or says who holds it. When the daemon
// that wrote sandstormd.pid is gone but the lock is still held, it waits
// up to lockHandback for it: a daemon killed (kill -9, a crash) while it
// was starting a command leaves a child between fork and exec, which has
// a copy of every descriptor until its exec closes the close-on-exec ones
// — the lock's among them. Seen in CI (TestRunscUpgrade, at f016ec5): a
// restart right after a kill -9 that landed as the node started `runsc
// checkpoint` found the lock held by the dead daemon's PID, and free 50 ms
// later. A holder that is alive is refused at once.
func takeLock(dataDir string) (*os.File, error) {
	path := filepath.Join(dataDir, "lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	try := func() bool { return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil }
	if try() {
		return f, nil
	}
	pid := 0
	if b, err := os.ReadFile(filepath.Join(dataDir, "sandstormd.pid")); err == nil {
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if pid > 1 && !alive(pid) {
		for deadline := time.Now().Add(lockHandback); time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			if try() {
				return f, nil
			}
		}
		f.Close()
		return nil, fmt.Errorf("the sandstormd that used %s (PID %d) has exited, but after %v a process it started still holds %s: see which with `fuser -v %s`, and stop it by its PID", dataDir, pid, lockHandback, path, path)
	}
	f.Close()
	who := "another sandstormd"
	if pid > 1 {
		// A stop takes a moment (requests in flight answered, the
		// gateway handed back): one just asked for may be under way.
		who = fmt.Sprintf("another sandstormd (PID %d; stop it with: kill %d, and wait until it has exited: tail --pid=%d -f /dev/null)", pid, pid, pid)
	}
	return nil, fmt.Errorf("%s is using %s (lock held); or start this one with another --data-dir", who, dataDir)
}

// lockHandback bounds takeLock's wait for a lock its dead holder's child
// still has: that child lets go at its exec, within milliseconds.
var lockHandback = 5 * time.Second

// NewBackend returns the backend o names, with its state under o.DataDir.
func NewBackend(o Options) (sandbox.Backend, error) {
	switch o.Backend {
	case "gvisor":
		if o.Compression != "" && !slices.Contains(gvisor.Compressions, o.Compression) {
			return nil, fmt.Errorf("--snapshot-compression %q: use %s", o.Compression, strings.Join(gvisor.Compressions, " or "))
		}
		b, err := gvisor.New(filepath.Join(o.DataDir, "runsc"), o.Runsc, o.Platform)
		if err != nil {
			return nil, err
		}
		b.Compression = o.Compression
		return b, nil
	case "process":
		return process.New(filepath.Join(o.DataDir, "process"))
	default:
		return nil, fmt.Errorf("unknown backend %q: use gvisor or process", o.Backend)
	}
}

func parsePorts(s string) (int, int, error) {
	lo, hi, ok := strings.Cut(s, "-")
	a, err1 := strconv.Atoi(lo)
	b, err2 := strconv.Atoi(hi)
	if !ok || err1 != nil || err2 != nil || a < 1 || b > 65535 || a > b {
		return 0, 0, fmt.Errorf("gateway ports %q: want a range like 20000-29999", s)
	}
	return a, b, nil
}

// checkEphemeral refuses a gateway port range that overlaps the kernel's
// ephemeral ports (net.ipv4.ip_local_port_range) outside those reserved
// (net.ipv4.ip_local_reserved_ports): every outgoing connection on the
// node takes its local port from there, so a gateway listener would find
// its port taken now and then ("bind: address already in use"; seen with
// 200 concurrent creates whose API connections held ports in the range).
func checkEphemeral(lo, hi int) error {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return nil // not Linux's procfs: nothing to check against
	}
	var elo, ehi int
	if _, err := fmt.Sscan(string(b), &elo, &ehi); err != nil {
		return nil
	}
	reserved := map[int]bool{}
	if r, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_reserved_ports"); err == nil {
		for _, part := range strings.Split(strings.TrimSpace(string(r)), ",") {
			a, z, _ := strings.Cut(part, "-")
			x, err1 := strconv.Atoi(a)
			y, err2 := strconv.Atoi(z)
			if z == "" {
				y, err2 = x, nil
			}
			if err1 == nil && err2 == nil {
				for p := max(x, lo); p <= min(y, hi); p++ {
					reserved[p] = true
				}
			}
		}
	}
	for p := max(lo, elo); p <= min(hi, ehi); p++ {
		if !reserved[p] {
			return fmt.Errorf("--gateway-ports %d-%d overlaps the kernel's ephemeral ports %d-%d (net.ipv4.ip_local_port_range), which outgoing connections take their ports from: a gateway listener could find its port taken. Pick a range below %d (the default 20000-29999 is), or reserve it: sysctl -w net.ipv4.ip_local_reserved_ports=%d-%d", lo, hi, elo, ehi, elo, lo, hi)
		}
	}
	return nil
}

// Check refuses the combinations of options that cannot run, before
// anything is started or written, each saying what to give instead.
func Check(o Options) error {
	switch {
	case !o.Master && !o.Node:
		return errors.New("say what to run: --master, --node, or both (one process)")
	case !o.Master && o.NodeListen == "" && o.Join == "":
		return errors.New("serve --node without --master needs --node-listen HOST:PORT (its master pairs with it there and calls it) or --join https://MASTER (it dials its master, from behind NAT)")
	case !o.Master && o.Store != "":
		return errors.New("--store is the master's: a node keeps its own state in <data-dir>/state.db")
	case o.Join != "" && o.Master:
		return errors.New("--join is for a node apart from its master (serve --node): a master does not join another")
	case o.Join != "" && o.NodeListen != "":
		return errors.New("--join and --node-listen exclude each other: a node either dials its master (--join, from behind NAT) or is dialled by it (--node-listen)")
	case o.IngressListen != "" && (o.Master || o.NodeListen == ""):
		return errors.New("--ingress-listen is for a node its master dials (serve --node --node-listen): the master serves its own sandboxes' traffic on its API, and a node behind NAT cannot be reached by its peers")
	case (o.IngressCert == "") != (o.IngressKey == ""):
		return errors.New("--ingress-cert and --ingress-key go together")
	case o.Join != "" && !strings.HasPrefix(o.Join, "https://"):
		return fmt.Errorf("--join %q: give the master's API URL, https://HOST:PORT", o.Join)
	case o.CAFingerprint != "" && !isHex64(o.CAFingerprint):
		return fmt.Errorf("--ca-fingerprint %q: want the SHA-256 of the master's CA as 64 hex digits, as POST /v1/nodes/join-tokens answers it", o.CAFingerprint)
	case o.CAFingerprint != "" && o.Join == "":
		return errors.New("--ca-fingerprint goes with --join https://MASTER")
	case o.JoinToken != "" && o.Join == "":
		return errors.New("--join-token goes with --join https://MASTER")
	}
	if o.Node {
		if _, _, err := parsePorts(o.GatewayPorts); err != nil {
			return err
		}
	}
	_, err := ingressDNSPlan(o)
	return err
}

func isHex64(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == 32
}

// Serve runs the daemon until ctx ends. Sandboxes keep running after it
// returns; the next Serve over the same data dir adopts them.
func Serve(ctx context.Context, o Options) (retErr error) {
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	if err := Check(o); err != nil {
		return err
	}
	if o.NodeName == "" {
		o.NodeName = "local"
	}
	// First, before any child process is started: the sockets a reload
	// handed this process are made close-on-exec here (handoff.Adopt).
	reg, err := handoff.Adopt(log)
	if err != nil {
		return fmt.Errorf("reload: %w; start sandstormd again (a fresh start takes the sandboxes over as after a stop)", err)
	}
	o.reg = reg
	if o.ReloadDrain <= 0 {
		o.ReloadDrain = DefaultReloadDrain
	}
	o.reconciled = make(chan struct{})
	if os.Geteuid() != 0 {
		return errors.New("sandstormd serve needs root: it creates network namespaces, veths, mounts and runsc sandboxes")
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return err
	}
	// If the kernel must kill for memory, it kills a sandbox (their score
	// is raised, layout.SandboxOOMScoreAdj), never the daemon that can
	// recover from it.
	if err := memguard.ProtectSelf(node.DaemonOOMScoreAdj); err != nil {
		// Lowering needs CAP_SYS_RESOURCE; without it the sandboxes' raised
		// score still puts them first.
		log.Info("sandstormd's OOM score stays as it is (lowering it needs CAP_SYS_RESOURCE); sandboxes still go first, their score is raised", "err", err)
	}
	lock, err := lockDataDir(o.DataDir, reg)
	if err != nil {
		return err
	}
	defer lock.Close()
	// A stop (not a reload, which never returns here) takes the readiness
	// file away and tells systemd.
	defer os.Remove(filepath.Join(o.DataDir, readyFile))
	defer sdnotify.SdNotify(false, sdnotify.SdNotifyStopping)
	// <data-dir>/sandstormd.pid: how a person or a script stops this daemon
	// (kill PID), rather than by its name.
	pidFile := filepath.Join(o.DataDir, "sandstormd.pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(pidFile)
	st, err := store.OpenIn(o.DataDir, o.Store)
	if err != nil {
		return err
	}
	defer st.Close()
	o.mreg = metrics.NewRegistry()
	if o.MetricsAddr != "" {
		srv, addr, err := metrics.Listen(o.MetricsAddr, o.mreg, func(network, addr string) (net.Listener, error) {
			return o.reg.Listen(network, addr, nil)
		})
		if err != nil {
			return err
		}
		defer srv.Close()
		log.Info("metrics", "url", "http://"+addr.String()+"/metrics")
	}
	if !o.Master {
		return serveNode(ctx, o, st, log)
	}
	return serveMaster(ctx, o, st, log)
}

// serveMaster runs the master (and the node in its process, with
// --node): its token, its CA and the API's HTTPS, the wait for the leader
// lease on a shared PostgreSQL store, then the fleet and the API until ctx
// ends.
func serveMaster(ctx context.Context, o Options, st *store.Store, log *slog.Logger) (retErr error) {
	token, err := apiToken(ctx, st, o.DataDir)
	if err != nil {
		return fmt.Errorf("API token: %w", err)
	}
	ca, err := ensureCA(ctx, st, o.DataDir)
	if err != nil {
		return fmt.Errorf("CA: %w", err)
	}
	tlsCfg, err := apiTLS(ca, o.Listen, o.HostDomain)
	if err != nil {
		return err
	}
	listen := func() (net.Listener, error) {
		ln, err := o.reg.Listen("tcp", o.Listen, nil)
		if err != nil {
			return nil, fmt.Errorf("API listen: %w (another sandstormd there? give this one another --listen, or stop that one)", err)
		}
		return tls.NewListener(ln, tlsCfg), nil
	}
	streams := newStreamSet()
	// A master sharing a PostgreSQL store answers on its API address from the
	// start, standing by until it leads (standby.go), then serves its API.
	var (
		apiLn      net.Listener
		apiSw      *switchHandler
		standbySrv *http.Server
		standbyErr = make(chan error, 1)
	)
	if st.Dialect() == "postgres" {
		if apiLn, err = listen(); err != nil {
			return err
		}
		apiSw = &switchHandler{}
		standbySrv = drainable(&http.Server{Handler: streams.wrap(apiSw), ReadHeaderTimeout: 10 * time.Second, TLSNextProto: enrol.TunnelNextProto()})
		go func() { standbyErr <- serveDrainable(standbySrv, apiLn) }()
		defer shutdown(standbySrv)
		lease, err := standBy(ctx, st, o, apiSw, token, log)
		if err != nil {
			return err
		}
		if lease == nil {
			return nil // ctx ended while standing by
		}
		defer lease.Release()
		// A leader that loses its lease stops at once: two masters must
		// never both decide (the lease's comment says when it is lost).
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		go func() {
			select {
			case <-lease.Lost():
				cancel(errLeaseLost)
			case <-ctx.Done():
			}
		}()
		defer func() {
			if context.Cause(ctx) == errLeaseLost && retErr == nil {
				retErr = errLeaseLost
			}
		}()
	}
	// The console's live view: what every node reports (this one too, from a hub of its own).
	hub := events.New(0)
	var local nodeapi.Node // nil unless this process runs a node (not a nil *Side)
	var nd *node.Node
	if o.Node {
		var stopNode func()
		var sam node.SAM
		nodeHub := events.New(0)
		nd, sam, stopNode, err = startNode(ctx, o, st, nodeHub, log)
		if err != nil {
			return err
		}
		defer stopNode()
		l := &nodeside.Side{N: nd, St: st, Events: nodeHub, Policy: sam.Policy, Flows: sam.Flows}
		local = l
		announce(ctx, o, l, st, log)
	}
	api, err := masterAPI(ctx, o, st, ca, token, local, hub, log)
	if err != nil {
		return err
	}
	ln := apiLn
	if ln == nil {
		if ln, err = listen(); err != nil {
			return err
		}
	}
	log.Info("sandstormd serving", "pid", os.Getpid(), "api", "https://"+ln.Addr().String(), "console", "https://"+ln.Addr().String()+"/ (its token: the token_file)", "ca", filepath.Join(o.DataDir, "pki", pki.CAFile), "ca_fingerprint", ca.Fingerprint(), "node", o.Node,
		"data_dir", o.DataDir, "token_file", filepath.Join(o.DataDir, "pki", "api-token"), "store", st.Dialect())
	srv, errc := standbySrv, standbyErr
	if apiSw != nil {
		apiSw.set(api) // the standby's server goes on serving, as the master now
	} else {
		srv = drainable(&http.Server{Handler: streams.wrap(api), ReadHeaderTimeout: 10 * time.Second, TLSNextProto: enrol.TunnelNextProto()})
		go func() { errc <- serveDrainable(srv, ln) }()
	}
	return serveUntilDone(ctx, o, log, []*http.Server{srv}, errc, streams, nd, "sandstormd stopped")
}

// masterAPI starts the fleet over store st (local: the node in this
// process, or nil) and the E2B service, and returns the master's API over
// them; both run until ctx ends.
func masterAPI(ctx context.Context, o Options, st *store.Store, ca *pki.CA, token string, local nodeapi.Node, hub *events.Hub, log *slog.Logger) (http.Handler, error) {
	// A paired node gets an image's template as the layers it lacks,
	// found in the layer store by their tree digests.
	layers := layercache.Index{Dir: filepath.Join(o.DataDir, "layers")}
	// Every node's ingress follows the fleet's routes, pushed at each
	// change (internal/routes); svc and fl are set before it runs.
	var (
		svc *e2b.Service
		fl  *fleet.Fleet
	)
	pub := routes.NewPublisher(routes.FromStore(st, func(id string) (string, string) { return svc.AccessToken(id), svc.TrafficToken(id) }),
		func() []nodeapi.Node { return fl.Nodes() }, log)
	fl, err := fleet.New(ctx, fleet.Config{Store: st, CA: ca, Local: local, Log: log, Events: hub, Layer: layers.Layer, Changed: pub.Changed, Reconnected: pub.Forget,
		Resume: func(node, id string) { svc.ResumeAsked(node, id) }})
	if err != nil {
		return nil, err
	}
	o.mreg.MustRegister(metrics.NodeHealthCollector(func() []metrics.NodeHealth { return nodeHealth(fl) }))
	// The E2B API; each sandbox's envd token is an HMAC of its ID keyed
	// by the API token, which the masters of one database share.
	// One sandbox service for /v1 and /e2b: their creates, owners and
	// pauses are one, and so are its per-sandbox locks.
	box, err := secrets.OpenBox(filepath.Join(o.DataDir, secrets.KeyFile))
	if err != nil {
		return nil, err
	}
	sbx := &sandboxes.Service{Store: st, Fleet: fl, Secrets: box, Log: log, Changed: pub.Changed}
	// One template service too: images' layers kept once, by diffID, and
	// shared by every template made from them (rootfs.Flatten links
	// their files); builds' RUN steps as o.BuildPrincipal.
	tpl := &templates.Service{Store: st, Fleet: fl, Sandboxes: sbx, DataDir: o.DataDir, Log: log, BuildPrincipal: o.BuildPrincipal, Mirrors: o.RegistryMirrors,
		Guard:  &dialguard.Guard{SandboxIfPrefix: node.VethPrefix},
		Images: &imagetemplate.Puller{Layers: &ociimage.Store{Dir: layers.Dir}, Log: log}}
	svc = e2b.New(e2b.Config{Store: st, Fleet: fl, Sandboxes: sbx, Domain: o.HostDomain, TokenKey: []byte("envd:" + token), Log: log,
		Templates: tpl, MaxUpload: o.MaxUpload, RoutesChanged: pub.Changed})
	go svc.Run(ctx) // ends sandboxes at their timeout
	// After svc is set: a node's report may ask it for a resume.
	go fl.Run(ctx) // hears its nodes' reports; renews their certificates
	go pub.Run(ctx, routes.Resync)
	return master.Handler(master.Config{
		Store: st, Fleet: fl, Sandboxes: sbx, CA: ca, Token: token, DataDir: o.DataDir, MaxUpload: o.MaxUpload, Log: log,
		Console:        &console.Console{Sessions: console.NewSessions(token), Events: hub, TokenFile: filepath.Join(o.DataDir, "pki", "api-token")},
		E2B:            svc.API(),
		E2BUploads:     svc.Uploads(),
		SandboxTraffic: svc.Traffic(), SandboxDomain: o.HostDomain,
		Metrics:   metrics.NewMaster(o.mreg),
		Templates: tpl,
	}), nil
}

// closeUnclaimedWhenReconciled closes the sockets handed over by a reload
// that nothing asked for, once the node (if any) has repaired its
// sandboxes and so opened every gateway listener and boundary it will.
func closeUnclaimedWhenReconciled(o Options) {
	if o.reg.From().Nonce == "" {
		return
	}
	if !o.Node {
		o.reg.CloseUnclaimed()
		return
	}
	go func() {
		<-o.reconciled
		o.reg.CloseUnclaimed()
	}()
}

// apiToken is the master's API token: shared through the store by the
// masters of one PostgreSQL database (a client keeps working whichever
// leads), else <data-dir>/pki/api-token's.
func apiToken(ctx context.Context, st *store.Store, dataDir string) (string, error) {
	if st.Dialect() != "postgres" {
		return EnsureToken(dataDir)
	}
	token, err := st.SharedSecret(ctx, "api-token", newToken)
	if err == nil {
		err = writeToken(dataDir, token)
	}
	return token, err
}

// apiTLS is the API's HTTPS: a certificate from the master's CA (clients
// trust <data-dir>/pki/ca.pem, as the CLI does by default, not the system's
// roots). Nodes that dial in present their certificates on this listener
// (GET /v1/nodes/tunnel); they say so in ALPN (RFC 7301), and only they
// are asked for one: a browser or curl is never sent a certificate
// request.
func apiTLS(ca *pki.CA, listen, sandboxDomain string) (*tls.Config, error) {
	hosts := pki.ServerHosts(listen)
	if sandboxDomain != "" {
		// The E2B SDK addresses a sandbox's envd as
		// 49983-<id>.<domain> (internal/e2b).
		hosts = append(hosts, "*."+sandboxDomain)
	}
	tlsCfg, err := ca.ServerConfig(hosts)
	if err != nil {
		return nil, fmt.Errorf("API certificate: %w", err)
	}
	tunnelCfg := tlsCfg.Clone()
	tunnelCfg.ClientAuth, tunnelCfg.ClientCAs, tunnelCfg.NextProtos = tls.RequireAndVerifyClientCert, ca.Pool(), []string{enrol.TunnelALPN}
	tlsCfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		if slices.Contains(h.SupportedProtos, enrol.TunnelALPN) {
			return tunnelCfg, nil
		}
		return nil, nil
	}
	return tlsCfg, nil
}

// shutdown stops srv, giving requests in flight 5 s.
func shutdown(srv *http.Server) {
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
}

// serveNode runs a node apart from its master (serve --node): its own
// store, its sandboxes, and on --node-listen the endpoint its master pairs
// with and then calls over mutual TLS (enrol.Endpoint). It opens no
// public API: until it is paired it answers only the pairing calls.
func serveNode(ctx context.Context, o Options, st *store.Store, log *slog.Logger) error {
	hub := events.New(0)
	nd, sam, stopNode, err := startNode(ctx, o, st, hub, log)
	defer stopNode()
	if err != nil {
		return err
	}
	// The trees of the templates its master gives it, by digest, and the
	// image layers they are made of: fetched once, kept while a template
	// uses them.
	local := &nodeside.Side{N: nd, St: st, OwnTemplates: true, Rootfs: rootfs.Cache{Dir: filepath.Join(o.DataDir, "rootfs")},
		LayerCache: layercache.Cache{Dir: filepath.Join(o.DataDir, "layer-cache")}, Events: hub, Log: log, Policy: sam.Policy, Flows: sam.Flows}
	announce(ctx, o, local, st, log)
	if o.Join != "" {
		j := &enrol.Joiner{Name: o.NodeName, Master: strings.TrimRight(o.Join, "/"), Fingerprint: o.CAFingerprint, Token: o.JoinToken,
			PKIDir: filepath.Join(o.DataDir, "pki"), Node: local, Log: log}
		if err := j.Join(ctx); err != nil {
			return err
		}
		log.Info("sandstormd node dialling its master", "pid", os.Getpid(), "node", o.NodeName, "master", o.Join)
		jctx, stopJoin := context.WithCancel(ctx)
		joined := make(chan struct{})
		go func() { j.Run(jctx); close(joined) }()
		closeUnclaimedWhenReconciled(o)
		serving(o, log)
		for {
			select {
			case <-joined:
				stopJoin()
				log.Info("sandstormd node stopped; sandboxes keep running and are adopted at the next start")
				return nil
			case <-o.Reload:
				// The tunnel to the master is cut by the exec; the next
				// binary dials again.
				if err := handover(ctx, o, log, nil, nil, nd); !errors.Is(err, errReloadRefused) {
					stopJoin()
					return err
				}
			}
		}
	}
	ep, err := enrol.NewEndpoint(o.NodeName, filepath.Join(o.DataDir, "pki"), local, log)
	if err != nil {
		return err
	}
	// The fleet's routes, which the master pushes: every node keeps them
	// (its peers are admitted by them), an ingress serves from them.
	local.Routes = ingress.NewTable()
	ep.AllowPeer = local.Routes.AllowPeer
	raw, err := o.reg.Listen("tcp", o.NodeListen, nil)
	if err != nil {
		return fmt.Errorf("--node-listen: %w", err)
	}
	streams := newStreamSet()
	srv := drainable(&http.Server{Handler: streams.wrap(ep.Handler()), ReadHeaderTimeout: 10 * time.Second})
	errc := make(chan error, 2)
	go func() { errc <- serveDrainable(srv, tls.NewListener(raw, ep.TLSConfig())) }()
	servers := []*http.Server{srv}
	if o.IngressListen != "" {
		isrv, err := startIngress(o, local, ep, streams, errc, log)
		if err != nil {
			return err
		}
		servers = append(servers, isrv)
	}
	if ep.Paired() {
		log.Info("sandstormd node serving its master", "pid", os.Getpid(), "node", o.NodeName, "listen", raw.Addr().String(), "data_dir", o.DataDir)
	} else {
		log.Info("sandstormd node waiting to be paired: give its master this address and the code in the pairing-code file", "pid", os.Getpid(), "node", o.NodeName,
			"listen", raw.Addr().String(), "pairing_code_file", ep.CodePath())
	}
	return serveUntilDone(ctx, o, log, servers, errc, streams, nd, "sandstormd node stopped")
}

// serveUntilDone is the end of a master's or a node's start: it says the
// daemon is serving, then serves srv until ctx ends (a shutdown; the
// sandboxes keep running), srv fails (errc), or a reload hands everything
// to the next binary (one refused leaves this one serving).
func serveUntilDone(ctx context.Context, o Options, log *slog.Logger, srvs []*http.Server, errc <-chan error, streams *streamSet, nd *node.Node, stopped string) error {
	closeUnclaimedWhenReconciled(o)
	serving(o, log)
	for {
		select {
		case <-ctx.Done():
			for _, srv := range srvs {
				shutdown(srv)
			}
			log.Info(stopped + "; sandboxes keep running and are adopted at the next start")
			return nil
		case err := <-errc:
			return err
		case <-o.Reload:
			if err := handover(ctx, o, log, srvs, streams, nd); !errors.Is(err, errReloadRefused) {
				return err
			}
		}
	}
}

// startNode brings up the node of this machine over store st: backend,
// network pool, boundaries, the node itself and its loops, and the repair
// after a restart, which runs on behind the caller. stop undoes it, in
// reverse order; it is valid (and must be called) on error too.
func startNode(ctx context.Context, o Options, st *store.Store, hub *events.Hub, log *slog.Logger) (nd *node.Node, sam node.SAM, stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	nm := metrics.NewNode(o.mreg)
	be, closeBackend, err := startBackend(ctx, o, nm, log)
	if err != nil {
		return nil, sam, stop, err
	}
	stops = append(stops, closeBackend)
	pool, err := netns.ParsePool(o.Subnet)
	if err != nil {
		return nil, sam, stop, err
	}
	bind, err := netip.ParseAddr(o.GatewayBind)
	if err != nil {
		return nil, sam, stop, fmt.Errorf("gateway address %q: %w", o.GatewayBind, err)
	}
	pmin, pmax, err := parsePorts(o.GatewayPorts)
	if err != nil {
		return nil, sam, stop, err
	}
	if err := checkEphemeral(pmin, pmax); err != nil {
		return nil, sam, stop, err
	}
	var stopSAM func()
	sam, stopSAM, err = samConfig(o, pool, log)
	if err != nil {
		return nil, sam, stop, err
	}
	stops = append(stops, stopSAM)
	envdBin, err := envdBinary(o.Envd)
	if err != nil {
		return nil, sam, stop, err
	}
	if envdBin == "" {
		log.Warn("commands and files in sandboxes are off: no sandstorm-envd beside sandstormd (make build puts it in bin/), and no --envd")
	}
	nd, err = node.New(node.Config{
		Name: o.NodeName, DataDir: o.DataDir, Backend: be, Store: st, Pool: pool,
		GatewayBind: bind, PortMin: pmin, PortMax: pmax, HostListen: o.HostListen, HostDomain: o.HostDomain,
		MemReserveMiB: o.MemReserve, DefaultMemoryMiB: o.SandboxMemory, DiskReserveMiB: o.DiskReserve, MaxWakes: o.MaxWakes, MaxStarts: o.MaxStarts, Admission: o.Admission, Ready: o.Ready,
		Timers: o.Timers, Zswap: o.Zswap, SAM: sam, Log: log, Events: hub, Envd: envdBin, Metrics: nm,
		Listen: o.reg.Listen, ListenPacket: o.reg.ListenPacket,
	})
	if err != nil {
		return nil, sam, stop, err
	}
	o.mreg.MustRegister(metrics.NodeCollector(nd.MetricsState))
	plan, err := nd.BeginReconcile(ctx)
	if err != nil {
		return nil, sam, stop, err // ErrFirewall: fail closed, no sandbox runs without its firewall
	}
	// The API opens at once and the repair after a restart runs behind it
	// (issue 7: a sandbox whose runsc hangs must not keep the API closed);
	// GET /v1/node says how many sandboxes are still being repaired.
	reconciled := make(chan struct{})
	go func() {
		defer close(reconciled)
		if err := nd.FinishReconcile(ctx, plan); err != nil {
			// Per-sandbox problems are reported, not fatal: the rest serve.
			log.Error("reconcile", "err", err)
		}
		if o.reconciled != nil {
			close(o.reconciled)
		}
	}()
	nd.Run()
	stops = append(stops, func() {
		<-reconciled
		nd.Close()
	})
	return nd, sam, stop, nil
}

// startBackend makes the node's runtime (runsc, unless --backend says
// otherwise) and what it needs of this process: the subreaper, zswap.
// closeBackend undoes it.
func startBackend(ctx context.Context, o Options, nm *metrics.Node, log *slog.Logger) (be sandbox.Backend, closeBackend func(), err error) {
	closeBackend = func() {}
	if be, err = NewBackend(o); err != nil {
		return nil, closeBackend, err
	}
	if gb, ok := be.(*gvisor.Backend); ok {
		gb.Observe = nm.Runsc
		gb.Log = log // it logs the sandboxes it had to kill by pid
		closeBackend = func() { gb.Close() }
		v, _ := gvisor.Version(ctx, gb.Runsc)
		if v != gvisor.PinnedVersion {
			log.Warn("runsc is not the version this sandstormd pins; snapshots only restore on the runsc that wrote them", "runsc", gb.Runsc, "version", v, "pinned", gvisor.PinnedVersion)
		}
		log.Info("runtime", "runsc", gb.Runsc, "version", v, "platform", gb.Platform)
	}
	if o.Backend == "gvisor" {
		if err := gvisor.StartReaper(); err != nil {
			log.Warn("cannot become subreaper of runsc sandboxes; deletes will wait for init to reap them", "err", err)
		}
	}
	if o.Zswap {
		if !reclaim.SwapActive() {
			return nil, closeBackend, errors.New("--zswap needs an active swap area to squeeze frozen sandboxes into, e.g.: fallocate -l 4G /swapfile && chmod 600 /swapfile && mkswap /swapfile && swapon /swapfile")
		}
		wasOn, err := reclaim.EnableZswap()
		if err != nil {
			return nil, closeBackend, err
		}
		if !wasOn {
			log.Info("zswap: enabled (/sys/module/zswap/parameters/enabled)")
		}
	}
	return be, closeBackend, nil
}

// samConfig builds what the node's boundaries need: the policy (reloaded on
// change; none = deny everything), the dial to sam-node, and their metrics
// (on the process's registry, served by Serve only when asked for: a
// listener is one more thing a sandbox might reach).
func samConfig(o Options, pool netns.Pool, log *slog.Logger) (node.SAM, func(), error) {
	sam := node.SAM{Firewall: netns.DefaultFirewall(node.VethPrefix), Flows: egresslog.New(0)}
	// Every address an allowed name resolves to is checked before it is
	// dialled: never this node's sandbox subnet, nor any route into a
	// sandbox veth (another sandstormd's subnet included).
	sam.Guard = &dialguard.Guard{SandboxNets: []netip.Prefix{pool.Prefix}, SandboxIfPrefix: node.VethPrefix}
	if o.Resolver != "" {
		r, err := boundary.Resolver(o.Resolver)
		if err != nil {
			return sam, func() {}, err
		}
		sam.Resolve = r
	}
	var stops []func()
	stop := func() {
		for _, f := range stops {
			f()
		}
	}
	if o.Policy == PolicyFromSAMNode {
		path, ok := strings.CutPrefix(o.SAMNode, "unix://")
		if !ok {
			return sam, stop, fmt.Errorf("--policy %s needs --sam-node unix:///path/to/sam-node.sock: the policy is the one that sam-node has from the control plane", PolicyFromSAMNode)
		}
		f := policy.NewFollower(samNodePolicy(path), log)
		f.Start(time.Second)
		stops = append(stops, f.Stop)
		sam.Policy = f.Current
	} else if o.Policy != "" {
		w, err := policy.NewWatcher(o.Policy, log)
		if err != nil {
			return sam, stop, fmt.Errorf("--policy: %w", err)
		}
		w.Start(time.Second)
		stops = append(stops, w.Stop)
		sam.Policy = w.Current
	} else {
		log.Warn("no --policy: every sandbox's boundary denies everything")
	}
	if o.SAMNode != "" {
		path, ok := strings.CutPrefix(o.SAMNode, "unix://")
		if !ok {
			return sam, stop, fmt.Errorf("--sam-node %q: want unix:///path/to/sam-node.sock", o.SAMNode)
		}
		sam.Mesh = func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
		// The boundaries' refusals, itemised and reported to sam-node,
		// which passes them on to the mesh's console (internal/sam/refusals).
		sam.Refusals = refusals.NewTable(refusals.MaxRows)
		fctx, stopForward := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			refusals.Forward(fctx, sam.Refusals, refusals.BoundaryEvery, refusals.ToSAMNode(refusals.UnixClient(path), "http://sam-node"), "sam-node", log)
		}()
		stops = append(stops, func() { stopForward(); <-done })
	}
	sam.Metrics = boundary.NewMetrics(o.mreg)
	box, roots, err := secretsConfig(o)
	if err != nil {
		return sam, stop, err
	}
	sam.Secrets, sam.SecretRoots = box, roots
	if sam.Ingress, err = ingressRoute(o, roots); err != nil {
		return sam, stop, err
	}
	return sam, stop, nil
}

// secretsConfig is the data dir's secrets key (internal/secrets: made on
// first use, 0600) and the roots that verify the servers secrets go to:
// the system's, and --secrets-ca's.
func secretsConfig(o Options) (*secrets.Box, *x509.CertPool, error) {
	box, err := secrets.OpenBox(filepath.Join(o.DataDir, secrets.KeyFile))
	if err != nil {
		return nil, nil, err
	}
	if o.SecretsCA == "" {
		return box, nil, nil
	}
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	b, err := os.ReadFile(o.SecretsCA)
	if err != nil {
		return nil, nil, fmt.Errorf("--secrets-ca: %w", err)
	}
	if !roots.AppendCertsFromPEM(b) {
		return nil, nil, fmt.Errorf("--secrets-ca %s: no PEM certificate in it", o.SecretsCA)
	}
	return box, roots, nil
}

// PolicyFromSAMNode is the --policy that takes the policy from the local
// sam-node, which has the mesh's one policy from the control plane: one
// policy for the fleet, and no file to copy to every machine.
const PolicyFromSAMNode = "sam-node"

// samNodePolicy fetches the policy document from sam-node's agent socket
// (policy.DocumentPath), with the version it has as If-None-Match.
func samNodePolicy(sock string) policy.Fetch {
	hc := &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	return func(ctx context.Context, etag string) ([]byte, string, bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://sam-node"+policy.DocumentPath, nil)
		if err != nil {
			return nil, "", false, err
		}
		if etag != "" {
			req.Header.Set("If-None-Match", etag)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, "", false, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		switch {
		case err != nil:
			return nil, "", false, err
		case resp.StatusCode == http.StatusNotModified:
			return nil, etag, false, nil
		case resp.StatusCode != http.StatusOK:
			return nil, "", false, fmt.Errorf("sam-node's policy: %s: %s", resp.Status, strings.TrimSpace(string(body)))
		}
		return body, resp.Header.Get("ETag"), true, nil
	}
}

// envdBinary is the envd binary for flag --envd: "none" for none, a path
// that must exist, or by default sandstorm-envd beside this executable
// when it is there.
func envdBinary(flag string) (string, error) {
	switch flag {
	case "none":
		return "", nil
	case "":
		exe, err := os.Executable()
		if err != nil {
			return "", nil
		}
		p := filepath.Join(filepath.Dir(exe), "sandstorm-envd")
		if _, err := os.Stat(p); err != nil {
			return "", nil
		}
		return p, nil
	}
	if _, err := os.Stat(flag); err != nil {
		return "", fmt.Errorf("--envd %s: %w (build it with make build, or --envd none for no commands and files)", flag, err)
	}
	return flag, nil
}

// nodeHealth is the fleet's view of its nodes as the master's metrics
// take it.
func nodeHealth(fl *fleet.Fleet) []metrics.NodeHealth {
	hs := fl.Health()
	out := make([]metrics.NodeHealth, len(hs))
	for i, h := range hs {
		out[i] = metrics.NodeHealth{Name: h.Name, Lost: h.Lost, LastReport: h.LastReport}
	}
	return out
}
