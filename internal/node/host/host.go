// Package host is a sandbox's place on a Sandstorm node's machine: its
// directory (internal/node/layout), its network namespace and veth in the
// node's address pool, the spec runsc runs it from, and its boundary — and
// laying all of that out before runsc starts or restores it, and taking it
// down again. It holds no sandbox state of its own: the node's tiers and
// lifecycle decide when; a Host does it.
package host

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/netns"
	"sandstorm/internal/node/boundaries"
	"sandstorm/internal/node/layout"
	"sandstorm/internal/node/secretbind"
	"sandstorm/internal/node/warm"
	"sandstorm/internal/runtimes"
	"sandstorm/internal/sam/boundary"
	"sandstorm/internal/sam/egress"
	"sandstorm/internal/sam/inject"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/secrets"
	"sandstorm/internal/store"
)

// Names of kernel objects: "ss-<id>" namespaces and "ssv<id>" host veths
// (3 + 12 = 15 bytes, the limit for an interface name). VethPrefix also
// tells the firewall and the boundaries' address guard what a sandbox's
// link is; the benchmarks look for both.
const (
	NetnsPrefix = "ss-"
	VethPrefix  = "ssv"
)

// Config is a node's machine.
type Config struct {
	DataDir string
	Backend sandbox.Backend
	Pool    netns.Pool
	// Kept is the node's runsc builds (nil: the backend runs no binary
	// runtime): a sandbox's spec names the build its row says.
	Kept *runtimes.Keeper
	// Bounds is the node's boundaries; Activity what a sandbox's
	// boundary tells the node of its flows out.
	Bounds   *boundaries.Set
	Activity func(id string) boundary.Activity
	// DefaultMemoryMiB is the memory limit of a sandbox whose template
	// and request set none.
	DefaultMemoryMiB int64
	// Secrets seals the bindings of sandboxes created with secrets (nil:
	// such a create is refused); SecretRoots verify the servers those
	// secrets go to (nil: the system's roots).
	Secrets     *secrets.Box
	SecretRoots *x509.CertPool
	Log         *slog.Logger
}

// Host lays sandboxes out on a node's machine and takes them down.
type Host struct{ cfg Config }

// New is the host of cfg.
func New(cfg Config) *Host { return &Host{cfg: cfg} }

// Dir is sandbox id's directory.
func (h *Host) Dir(id string) layout.Dir {
	return layout.Dir(filepath.Join(h.cfg.DataDir, "sandboxes", id))
}

// Net is the network of a sandbox in address slot slot.
func (h *Host) Net(id string, slot int) (netns.Net, error) {
	host, sb, err := h.cfg.Pool.Addrs(slot)
	if err != nil {
		return netns.Net{}, err
	}
	return netns.Net{Name: NetnsPrefix + id, HostIf: VethPrefix + id, Host: host, Sandbox: sb}, nil
}

// Spec is what the backend runs sb from: its bundle, namespace, console
// log and runsc build.
func (h *Host) Spec(sb store.Sandbox) sandbox.Spec {
	d := h.Dir(sb.ID)
	return sandbox.Spec{ID: sb.ID, Bundle: d.Bundle(), Netns: filepath.Join(netns.Dir, NetnsPrefix+sb.ID), LogPath: d.Log(),
		Runtime: h.cfg.Kept.PathOf(runtimes.Key(sb.Runsc))}
}

// Address is sb's own address ("" if its slot has none).
func (h *Host) Address(sb store.Sandbox) string {
	nw, err := h.Net(sb.ID, sb.Slot)
	if err != nil {
		return ""
	}
	return nw.Sandbox.Addr().String()
}

// LimitMiB is the memory limit a new sandbox of t gets: override, else
// the template's, else the node's default.
func (h *Host) LimitMiB(t store.Template, override int) int64 {
	switch {
	case override > 0:
		return int64(override)
	case t.MemoryMiB > 0:
		return int64(t.MemoryMiB)
	}
	return h.cfg.DefaultMemoryMiB
}

// LimitOf is sb's memory limit (stored at create; older rows: the
// template's or the default).
func (h *Host) LimitOf(sb store.Sandbox, t store.Template) int64 {
	if sb.MemoryMiB > 0 {
		return int64(sb.MemoryMiB)
	}
	return h.LimitMiB(t, 0)
}

// Prepare lays out everything a sandbox runs in before runsc starts or
// restores it: LayOut, then its boundary. A cold start, a warm start and
// a clone's child differ only after it.
func (h *Host) Prepare(sb store.Sandbox, t store.Template, envdDir string) error {
	if err := h.LayOut(sb, t, envdDir); err != nil {
		return err
	}
	return h.BoundaryUp(sb)
}

// LayOut is Prepare without the boundary (what a pooled sandbox has before
// a create gives it a principal): the overlay of the template's rootfs and
// its volume, its network namespace and veth (addresses put back), its
// resolver, and the bundle's OCI spec with its own hostname and netns.
// envdDir is the envd build its spec mounts: the current one for a cold
// start, the image's for a restore.
func (h *Host) LayOut(sb store.Sandbox, t store.Template, envdDir string) error {
	d := h.Dir(sb.ID)
	if err := d.MountRootfs(t.Rootfs); err != nil {
		return err
	}
	nw, err := h.Net(sb.ID, sb.Slot)
	if err != nil {
		return err
	}
	if err := netns.Create(nw); err != nil {
		return err
	}
	if err := d.WriteResolvConf(nw.Host.Addr()); err != nil {
		return err
	}
	return d.WriteSpec(t, h.LimitOf(sb, t), sb.Name, nw.Path(), envdDir)
}

// NamesOf is a new sandbox's name (its own, else sb-<id>) and principal
// (its own, else its template's), or why one is not valid.
func NamesOf(id, name, principal string, t store.Template) (string, string, error) {
	if name == "" {
		name = warm.PooledName(id)
	}
	if !api.ValidName(name) {
		return "", "", fmt.Errorf("%w: name %q: use 1-63 of a-z, 0-9 and '-'", errdefs.ErrBadInput, name)
	}
	if principal == "" {
		principal = t.Principal
	}
	if principal != "" && !api.ValidPrincipal(principal) {
		return "", "", fmt.Errorf("%w: principal %q: use 1-128 of a-z, A-Z, 0-9 and '._-'", errdefs.ErrBadInput, principal)
	}
	return name, principal, nil
}

// PrincipalOf is who sb is: its own principal, else its name.
func PrincipalOf(sb store.Sandbox) string {
	if sb.Principal != "" {
		return sb.Principal
	}
	return sb.Name
}

// BoundaryUp starts sb's boundary (boundaries.Set.Up) on the host end of
// its veth (which must exist) and on <sandbox dir>/agent.sock.
func (h *Host) BoundaryUp(sb store.Sandbox) error {
	nw, err := h.Net(sb.ID, sb.Slot)
	if err != nil {
		return err
	}
	// Its own egress rules, from its first flow; rules that no longer
	// parse keep the boundary down (fail closed), never up without them.
	rules, err := ParseEgress(sb.Egress)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	// Its secrets likewise: bindings that do not open keep it down.
	sec, err := secretbind.Load(string(h.Dir(sb.ID)), sb.ID, h.cfg.Secrets, h.cfg.SecretRoots)
	if err != nil {
		return err
	}
	return h.cfg.Bounds.Up(boundaries.Sandbox{ID: sb.ID, Principal: PrincipalOf(sb), Net: nw,
		Socket: h.Dir(sb.ID).AgentSock(), Activity: h.cfg.Activity(sb.ID), Egress: rules, Secrets: sec})
}

// ExportSecrets is sandbox id's bindings opened, for a live move
// (secretbind.Export); ImportSecrets seals on this node those a move
// brought (secretbind.Import).
func (h *Host) ExportSecrets(id string) (json.RawMessage, error) {
	return secretbind.Export(string(h.Dir(id)), id, h.cfg.Secrets)
}

func (h *Host) ImportSecrets(id string, plain json.RawMessage) error {
	return secretbind.Import(string(h.Dir(id)), id, h.cfg.Secrets, plain)
}

// CloneVolume gives clone child the volume its parent had at the clone
// (upper, from the clone's stage) and the parent's bound secrets, sealed
// for the child: its volume trusts the parent's CA, and its memory and
// environment hold the parent's markers.
func (h *Host) CloneVolume(ctx context.Context, upper, parent, child string) error {
	if err := layout.CopyTree(ctx, upper, h.Dir(child).Upper()); err != nil {
		return err
	}
	plain, err := h.ExportSecrets(parent)
	if err != nil {
		return err
	}
	return h.ImportSecrets(child, plain)
}

// InstallSecrets gives new sandbox sb (of template t) its bound secrets
// before its first start (secretbind.Install): its CA in its volume's
// trust store, its bindings sealed beside it.
func (h *Host) InstallSecrets(sb store.Sandbox, t store.Template, bindings []inject.Binding) error {
	if h.cfg.Secrets == nil {
		return fmt.Errorf("%w: this node keeps no secrets (no secrets key)", errdefs.ErrNotSupported)
	}
	d := h.Dir(sb.ID)
	return secretbind.Install(string(d), t.Rootfs, d.Upper(), sb.ID, h.cfg.Secrets, bindings)
}

// ParseEgress is a sandbox's egress rules as its boundary applies them
// (nil: none).
func ParseEgress(e *api.Egress) (*egress.Rules, error) {
	if e == nil {
		return nil, nil
	}
	r, err := egress.Parse(e.AllowOut, e.DenyOut)
	if err != nil {
		return nil, fmt.Errorf("its egress rules: %w", err)
	}
	return r, nil
}

// BoundaryDown closes sandbox id's boundary.
func (h *Host) BoundaryDown(id string) { h.cfg.Bounds.Down(id) }

// Teardown removes the boundary, container, namespace, veth and rootfs
// mount of sb; with all, also its directory (volume and snapshot). Each
// step runs even if an earlier one failed; the errors are joined.
func (h *Host) Teardown(ctx context.Context, sb store.Sandbox, all bool) error {
	var errs []error
	h.cfg.Bounds.Down(sb.ID)
	if err := h.cfg.Backend.Remove(ctx, h.Spec(sb)); err != nil {
		errs = append(errs, err)
	}
	if nw, err := h.Net(sb.ID, sb.Slot); err == nil {
		if err := netns.Delete(nw); err != nil {
			errs = append(errs, err)
		}
	}
	d := h.Dir(sb.ID)
	if err := d.UnmountRootfs(); err != nil {
		errs = append(errs, err)
	}
	if all {
		if err := os.RemoveAll(string(d)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Protect sets the OOM score of a sandbox that just started or woke.
func (h *Host) Protect(sb store.Sandbox) {
	if s, ok := h.cfg.Backend.(sandbox.OOMScorer); ok {
		if err := s.SetOOMScore(context.Background(), h.Spec(sb), layout.SandboxOOMScoreAdj); err != nil {
			h.cfg.Log.Warn("cannot set the OOM score of a sandbox", "id", sb.ID, "err", err)
		}
	}
}

// HeldMiB is what sandbox id takes from MemAvailable
// (admission.Config.Held): its memory cgroup's usage less its page cache
// (sandbox.MemoryReporter.Taken says why).
func (h *Host) HeldMiB(id string) (int64, bool) {
	r, ok := h.cfg.Backend.(sandbox.MemoryReporter)
	if !ok {
		return 0, false
	}
	b, err := r.Taken(context.Background(), sandbox.Spec{ID: id})
	if err != nil {
		return 0, false
	}
	return b >> 20, true
}

// Usage reads sandbox id's memory cgroup (MiB); ok false when the
// backend cannot say.
func (h *Host) Usage(id string) (int64, sandbox.MemStat, bool) {
	r, ok := h.cfg.Backend.(sandbox.MemoryReporter)
	if !ok {
		return 0, sandbox.MemStat{}, false
	}
	ms, err := r.Memory(context.Background(), sandbox.Spec{ID: id})
	if err != nil {
		return 0, ms, false
	}
	return ms.UsageBytes >> 20, ms, true
}

// ImageMiB estimates the checkpoint image of a sandbox: at most what its
// memory cgroup holds (the image is its memory, compressed by runsc).
func (h *Host) ImageMiB(id string) int64 {
	held, _, ok := h.Usage(id)
	if !ok || held <= 0 {
		return 64
	}
	return held
}

// ErrFull: no address slot or gateway port left on the node.
var ErrFull = errdefs.Refine(errdefs.ErrNoRoom, "node full")
