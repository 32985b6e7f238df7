package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sandstorm/api"
	"sandstorm/internal/netns"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
)

// Reconcile makes the node's view match what is really on the machine, at
// start-up (after a clean stop or a kill -9 at any moment):
//   - a running container is adopted as hot, a paused one as frozen;
//   - a complete snapshot image on disk makes the sandbox snapshot (its
//     stopped container and namespace are cleaned);
//   - a sandbox whose processes are gone and that has no image becomes
//     detached (its next request cold-starts it), with a note saying so;
//   - a delete that was in progress is finished;
//   - containers, namespaces, veths and sandbox directories that belong to
//     no sandbox are removed.
//
// It also installs the firewall and opens the gateway listeners.
func (n *Node) Reconcile(ctx context.Context) error {
	if err := netns.EnsureFirewall(vethPrefix); err != nil {
		return err
	}
	all, err := n.st.ListSandboxes(ctx, n.cfg.Name)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	var errs []error
	for _, sb := range all {
		known[sb.ID] = true
		if err := n.reconcileOne(ctx, sb); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", sb.ID, err))
		}
	}
	n.removeOrphans(ctx, known)
	return errors.Join(errs...)
}

func (n *Node) reconcileOne(ctx context.Context, sb store.Sandbox) error {
	spec := n.spec(sb)
	d := n.dir(sb.ID)
	e := n.entry(sb.ID)
	e.lastActive.Store(sb.LastActive.UnixMilli())
	e.flushed.Store(sb.LastActive.UnixMilli())
	if sb.Transition == transitionDelete {
		n.teardown(ctx, sb, true)
		n.forget(sb.ID)
		return n.st.DeleteSandbox(ctx, sb.ID)
	}
	// A checkpoint cut short leaves an incomplete image: never restore it.
	os.RemoveAll(d.snapTmp())

	st, err := n.be.State(ctx, spec)
	if err != nil {
		n.log.Warn("reconcile: state unknown, treating as stopped", "id", sb.ID, "err", err)
		st = sandbox.StateStopped
	}
	var to api.Tier
	note := sb.Note
	switch {
	case st == sandbox.StateRunning:
		to = api.TierHot
	case st == sandbox.StatePaused:
		to = api.TierFrozen
	case d.hasSnapshot():
		to = api.TierSnapshot
		n.be.Remove(ctx, spec)
		if nw, err := n.Net(sb.ID, sb.Slot); err == nil {
			netns.Delete(nw)
		}
	default:
		to = api.TierDetached
		if sb.Tier != api.TierDetached {
			note = fmt.Sprintf("its processes were gone when the node restarted (was %s); the next request cold-starts it", sb.Tier)
		}
		n.teardown(ctx, sb, false)
	}
	if to != sb.Tier || sb.Transition != "" {
		n.log.Info("reconcile", "id", sb.ID, "stored", sb.Tier, "transition", sb.Transition, "found", to)
	}
	if _, err := n.commit(sb.ID, to, func(s *store.Sandbox) { s.Note = note }); err != nil {
		return err
	}
	return n.listen(sb)
}

// removeOrphans deletes what this node made for sandboxes it no longer has.
func (n *Node) removeOrphans(ctx context.Context, known map[string]bool) {
	ids, _ := n.be.List(ctx)
	for _, id := range ids {
		if known[id] {
			continue
		}
		n.log.Warn("reconcile: removing orphaned container", "id", id)
		spec := sandbox.Spec{ID: id, Netns: filepath.Join(netns.Dir, netnsPrefix+id)}
		if err := n.be.Remove(ctx, spec); err != nil {
			n.log.Error("reconcile: remove orphaned container", "id", id, "err", err)
		}
	}
	names, _ := netns.List(netnsPrefix)
	for _, name := range names {
		id := strings.TrimPrefix(name, netnsPrefix)
		if known[id] {
			continue
		}
		n.log.Warn("reconcile: removing orphaned network namespace", "netns", name)
		netns.Delete(netns.Net{Name: name, HostIf: vethPrefix + id})
	}
	links, _ := netns.ListLinks(vethPrefix)
	for _, l := range links {
		if !known[strings.TrimPrefix(l, vethPrefix)] {
			netns.DeleteLink(l)
		}
	}
	dirs, _ := os.ReadDir(filepath.Join(n.cfg.DataDir, "sandboxes"))
	for _, de := range dirs {
		if known[de.Name()] {
			continue
		}
		d := n.dir(de.Name())
		n.log.Warn("reconcile: removing orphaned sandbox directory", "dir", string(d))
		d.unmountRootfs()
		os.RemoveAll(string(d))
	}
}
