package node

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"path/filepath"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/node/envdlink"
	"sandstorm/internal/node/layout"
	"sandstorm/internal/sandbox"
)

// envd, the E2B API for commands and files, runs inside the sandbox:
// internal/node/envdlink holds the builds the node mounts and the link to
// one sandbox's envd; here is what the node adds (the sandbox's row, its
// wake, its busy count).

// installEnvd installs the configured envd build (envdlink.Install) and
// removes the builds no sandbox's or warm template's bundle mounts.
func installEnvd(dataDir, binary string, log *slog.Logger) (*envdlink.Builds, error) {
	var used []layout.Dir
	for _, pattern := range []string{"sandboxes", "warm"} {
		dirs, _ := filepath.Glob(filepath.Join(dataDir, pattern, "*"))
		for _, d := range dirs {
			used = append(used, layout.Dir(d))
		}
	}
	return envdlink.Install(dataDir, binary, used, log)
}

// ErrNoEnvd is a call for envd on a node that has none.
var ErrNoEnvd = errdefs.Refine(errdefs.ErrNotSupported, "this node serves no commands and files (started with --envd none, or with no sandstorm-envd beside sandstormd: make build puts it there)")

// Serve forwards r to port of sandbox id, streaming the answer back: to
// its envd as a call of path (e.g. /process.Process/Start, /files) when
// port is envd's, started in it if it is not running; else to the
// sandbox's own port as r came (E2B's https://<port>-<id>.<domain>). The
// sandbox is woken from whatever tier it is in first, as traffic wakes
// it. While the call lasts the sandbox counts as busy (a command someone
// waits on keeps it hot); a snapshot, detach or delete cuts the call
// (tiering.Machine.CutEnvd). An error is returned only when nothing was
// written.
func (n *Node) Serve(w http.ResponseWriter, r *http.Request, id string, port int, path string) error {
	if n.envd == nil && port == api.EnvdPort {
		return ErrNoEnvd
	}
	if port < 1 || port > 65535 {
		return errdefs.New(errdefs.ErrBadInput, "port %d: want 1-65535", port)
	}
	e, ok := n.tiers.Lookup(id)
	if !ok {
		return errdefs.New(errdefs.ErrNotFound, "sandbox %s: not found on node %s", id, n.cfg.Name)
	}
	defer e.Envd.Hold()()
	defer n.tiers.Touch(id)
	n.tiers.Touch(id)
	if err := n.Wake(r.Context(), id); err != nil {
		return err
	}
	cfg := envdlink.Config{Mark: n.cfg.SAM.Firewall.IngressMark, Ready: n.cfg.Ready, Log: n.log}
	if port != api.EnvdPort {
		sb, err := n.envdSandbox(r.Context(), id)
		if err != nil {
			return err
		}
		return e.Envd.ServePort(cfg, w, r, netip.AddrPortFrom(sb.Target.Addr(), uint16(port)))
	}
	return e.Envd.Serve(cfg, w, r, path, func(ctx context.Context) (envdlink.Sandbox, error) { return n.envdSandbox(ctx, id) })
}

// envdSandbox is how to reach sandbox id's envd: its own address, whether
// envd is its init, and runsc exec in it.
func (n *Node) envdSandbox(ctx context.Context, id string) (envdlink.Sandbox, error) {
	sb, err := n.st.GetSandbox(ctx, id)
	if err != nil {
		return envdlink.Sandbox{}, err
	}
	nw, err := n.h.Net(sb.ID, sb.Slot)
	if err != nil {
		return envdlink.Sandbox{}, err
	}
	t, err := n.st.GetTemplate(ctx, sb.Template)
	if err != nil {
		return envdlink.Sandbox{}, err
	}
	spec := n.h.Spec(sb)
	return envdlink.Sandbox{
		ID:     id,
		Target: netip.AddrPortFrom(nw.Sandbox.Addr(), api.EnvdPort),
		Init:   t.Process.Envd != nil,
		Exec: func(ctx context.Context, args []string) ([]byte, error) {
			x, ok := n.be.(sandbox.Execer)
			if !ok {
				return nil, errdefs.New(errdefs.ErrNotSupported, "the %s backend cannot run commands in a sandbox", n.be.Name())
			}
			return x.Exec(ctx, spec, args)
		},
	}, nil
}
