package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/node/layout"
	"sandstorm/internal/node/warm"
	"sandstorm/internal/runtimes"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
)

// CloneResult is what Clone made and how long it took.
type CloneResult struct {
	Parent      store.Sandbox
	Children    []store.Sandbox
	ParentPause time.Duration
	ChildTimes  []time.Duration
}

// Clone makes count children of the running sandbox ref from its memory:
// the parent is paused, checkpointed with runsc checkpoint --leave-running
// (one image for all children), its volume copied, and resumed; then each
// child is created from that image as a new sandbox — its own name
// (<parent>-<n>), address, veth, boundary and principal (principal, or the
// parent's with ".<n>"), a copy of the parent's volume — and reseeded
// (reseed, or the template's warm one; one is required, since every child
// starts from the parent's random state). The parent's connections are
// not carried over: in a child their endpoints keep the parent's address,
// which the child's veth does not route and the node's reverse-path filter
// drops (netns firewall, spoofed_source). Children are made one after
// another; one that fails ends the clone, and those made so far stay.
//
// gen is the master's number for the clone (0: none): every child carries
// it, as a create's sandbox does.
func (n *Node) Clone(ctx context.Context, ref string, count int, principal string, reseed *api.Reseed, gen int64) (CloneResult, error) {
	c := &cloning{n: n, count: count, principal: principal, gen: gen}
	cl, err := c.check(ctx, ref, reseed)
	if err != nil {
		return c.res, err
	}
	var suffix [4]byte
	rand.Read(suffix[:])
	c.stage = filepath.Join(string(n.h.Dir(c.parent.ID)), "clone-"+hex.EncodeToString(suffix[:]))
	defer os.RemoveAll(c.stage)
	defer n.kept.Unpin(c.stage)
	// A parent in the snapshot tier (an E2B snapshot) is not woken.
	staged, err := c.fromSnapshot(ctx)
	if err != nil {
		return c.res, err
	}
	if !staged {
		if err := n.Wake(ctx, c.parent.ID); err != nil {
			return c.res, err
		}
		// A parent that has not finished starting has not installed what
		// its reseed needs (a handler for the signal: without one, its
		// default action kills every child — issue 15, found cloning a
		// sandbox right after its create). Ready is what the template
		// says: its warm probe, else its first port accepting.
		if err := c.ready(ctx, c.parent); err != nil {
			return c.res, fmt.Errorf("%w: sandbox %s is not ready to clone (%v): clone it once it serves", errdefs.ErrConflict, c.parent.Name, err)
		}
		pause, err := c.fork(ctx, cl)
		if err != nil {
			return c.res, err
		}
		c.res.ParentPause = pause
		n.log.Info("clone: parent checkpointed", "id", c.parent.ID, "pause_ms", pause.Milliseconds(), "count", count)
	}
	if err := c.children(ctx); err != nil {
		return c.res, err
	}
	c.res.Parent, _ = n.st.GetSandbox(ctx, c.parent.ID)
	// A child is made once it serves as its parent did: one whose process
	// died after its reseed (a signal it does not handle, say) is a
	// failure of the clone, said in its answer, not a success.
	var dead []string
	for _, child := range c.res.Children {
		if err := c.ready(ctx, child); err != nil {
			dead = append(dead, fmt.Sprintf("%s (%v)", child.Name, err))
		}
	}
	if len(dead) > 0 {
		return c.res, fmt.Errorf("clone %s: %d of %d children do not serve after their reseed: %s", c.parent.Name, len(dead), count, strings.Join(dead, "; "))
	}
	return c.res, nil
}

// cloning is one clone of a sandbox (Clone).
type cloning struct {
	n         *Node
	count     int
	principal string
	gen       int64
	parent    store.Sandbox
	t         store.Template
	reseed    api.Reseed
	// stage holds the clone's image and the parent's volume's copy.
	stage string
	res   CloneResult
}

// check refuses a clone that cannot be made as asked: a bad count or
// principal, no way to reseed, a backend that cannot checkpoint a
// running sandbox, no disk for the image. It reads the parent and its
// template.
func (c *cloning) check(ctx context.Context, ref string, reseed *api.Reseed) (sandbox.Cloner, error) {
	n := c.n
	if c.count < 1 || c.count > api.MaxClone {
		return nil, fmt.Errorf("%w: count %d: clone 1 to %d at a time", errdefs.ErrBadInput, c.count, api.MaxClone)
	}
	if c.principal != "" && !api.ValidPrincipal(c.principal) {
		return nil, fmt.Errorf("%w: principal %q: use 1-128 of a-z, A-Z, 0-9 and '._-'", errdefs.ErrBadInput, c.principal)
	}
	var err error
	if c.parent, err = n.Get(ctx, ref); err != nil {
		return nil, err
	}
	if c.t, err = n.st.GetTemplate(ctx, c.parent.Template); err != nil {
		return nil, err
	}
	if reseed == nil && c.t.Warm != nil {
		reseed = &c.t.Warm.Reseed
	}
	if reseed == nil || (reseed.Signal == "" && len(reseed.Command) == 0) {
		return nil, fmt.Errorf("%w: say how to reseed the children (reseed.signal, e.g. SIGUSR1, or reseed.command; on the CLI --reseed-signal or --reseed-command): each starts from %s's memory, random state included, and template %s has no warm reseed", errdefs.ErrBadInput, c.parent.Name, c.t.Name)
	}
	if reseed.Signal != "" {
		if _, ok := api.ReseedSignal(reseed.Signal); !ok {
			return nil, fmt.Errorf("%w: reseed signal %q: use one of %v", errdefs.ErrBadInput, reseed.Signal, api.ReseedSignals())
		}
	}
	c.reseed = *reseed
	cl, ok := n.be.(sandbox.Cloner)
	if !ok || !n.be.Capabilities().Checkpoint {
		return nil, fmt.Errorf("%w: the %s backend cannot checkpoint a running sandbox", errdefs.ErrNotSupported, n.be.Name())
	}
	if err := n.adm.Disk("a clone's image", n.h.ImageMiB(c.parent.ID)); err != nil {
		return nil, err
	}
	return cl, nil
}

// children makes the clone's children one after another, each created
// from the image as a new sandbox; one that fails ends the clone, and
// those made so far stay.
func (c *cloning) children(ctx context.Context) error {
	n, parent := c.n, c.parent
	ct := c.t
	ct.Warm = &api.Warm{Reseed: c.reseed}
	parentPrincipal := PrincipalOf(parent)
	for k := 1; len(c.res.Children) < c.count; k++ {
		name := childName(parent.Name, k)
		if _, err := n.st.GetSandbox(ctx, name); err == nil {
			continue // taken, by an earlier clone
		}
		p := c.principal
		if p == "" {
			p = parentPrincipal + "." + strconv.Itoa(k)
		}
		began := time.Now()
		child, err := n.create(ctx, c.t, name, p, parent.MemoryMiB, c.gen, parent.Egress, nil, func(sb store.Sandbox) error {
			return c.restoreChild(sb, ct)
		})
		n.tiers.CountCreate("clone", err)
		if err != nil {
			c.res.Parent, _ = n.st.GetSandbox(context.Background(), parent.ID)
			return fmt.Errorf("clone %s: child %d of %d (%s): %w", parent.Name, len(c.res.Children)+1, c.count, name, err)
		}
		child, _ = n.st.UpdateSandbox(context.Background(), child.ID, func(s *store.Sandbox) error {
			s.Note = fmt.Sprintf("cloned from %s (%s)", parent.Name, parent.ID)
			return nil
		})
		c.res.Children = append(c.res.Children, child)
		c.res.ChildTimes = append(c.res.ChildTimes, time.Since(began))
		n.log.Info("clone: child made", "parent", parent.ID, "id", child.ID, "name", name, "ms", time.Since(began).Milliseconds())
	}
	return nil
}

// ready waits, within the node's ready timeout, until sandbox sb of the
// clone's template serves: its warm probe answers, else its first port
// accepts a connection. A sandbox with no port is taken as ready while
// its process runs. It gives up at once if the process is gone.
func (c *cloning) ready(ctx context.Context, sb store.Sandbox) error {
	n, t := c.n, c.t
	port, path := 0, ""
	if t.Warm != nil {
		port, path = t.Warm.Probe.Port, t.Warm.Probe.Path
	}
	if port == 0 && len(t.Ports) > 0 {
		port = t.Ports[0]
	}
	spec := n.h.Spec(sb)
	alive := func() error {
		if st, err := n.be.State(ctx, spec); err == nil && st != sandbox.StateRunning {
			return fmt.Errorf("its process is gone (%s)", st)
		}
		return nil
	}
	if port == 0 {
		return alive()
	}
	nw, err := n.h.Net(sb.ID, sb.Slot)
	if err != nil {
		return err
	}
	target := netip.AddrPortFrom(nw.Sandbox.Addr(), uint16(port))
	pctx, cancel := context.WithTimeout(ctx, n.cfg.Ready)
	defer cancel()
	d := warm.MarkedDialer(n.cfg.SAM.Firewall.IngressMark)
	for {
		err := warm.ProbeOnce(pctx, d, target, path)
		if err == nil {
			return nil
		}
		if derr := alive(); derr != nil {
			return derr
		}
		select {
		case <-pctx.Done():
			return fmt.Errorf("port %d did not answer within %v: %v", port, n.cfg.Ready, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// childName is <parent>-<k>, shortened so it stays a valid name.
func childName(parent string, k int) string {
	s := "-" + strconv.Itoa(k)
	if len(parent)+len(s) > 63 {
		parent = parent[:63-len(s)]
	}
	return parent + s
}

// fork pauses the parent, checkpoints it into stage/image leaving it
// paused, copies its volume to stage/upper, and resumes it, under its
// transition lock (no tier change can happen meanwhile). It returns how
// long the parent was paused. A parent that was frozen is left hot (Wake
// ran before).
func (c *cloning) fork(ctx context.Context, cl sandbox.Cloner) (time.Duration, error) {
	n, parent, stage := c.n, c.parent, c.stage
	e := n.tiers.Entry(parent.ID)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := e.Acquire(actx); err != nil {
		return 0, fmt.Errorf("%w: sandbox %s (%s) is busy with another transition; try again when it is done", errdefs.ErrConflict, parent.Name, parent.ID)
	}
	defer e.Release()
	if tier := e.Tier(); tier != api.TierHot {
		return 0, fmt.Errorf("%w: sandbox %s (%s) went %s before it could be cloned; try again", errdefs.ErrConflict, parent.Name, parent.ID, tier)
	}
	if err := os.MkdirAll(stage, 0o700); err != nil {
		return 0, err
	}
	n.tiers.FreshRunsc(&parent) // its build as it runs now, under its lock
	spec := n.h.Spec(parent)
	bg := context.WithoutCancel(ctx)
	began := time.Now()
	if err := n.be.Pause(bg, spec); err != nil {
		return 0, fmt.Errorf("pause %s: %w", parent.Name, err)
	}
	resume := func() error {
		if err := n.be.Resume(bg, spec); err != nil {
			n.log.Error("clone: the parent did not resume", "id", parent.ID, "err", err)
			return fmt.Errorf("resume %s after its checkpoint: %w", parent.Name, err)
		}
		return nil
	}
	if err := cl.CheckpointRunning(bg, spec, filepath.Join(stage, "image")); err != nil {
		return 0, errors.Join(fmt.Errorf("checkpoint %s: %w", parent.Name, err), resume())
	}
	// The children restore this image with the parent's build: kept
	// until the clone ends, whatever happens to the parent meanwhile.
	n.kept.Pin(stage, runtimes.Key(parent.Runsc))
	n.kept.Stamp(filepath.Join(stage, "image"), runtimes.Key(parent.Runsc))
	// After the checkpoint, which flushes what the sentry had cached of
	// its files: the volume and the memory are from the same moment.
	if err := layout.CopyTree(bg, n.h.Dir(parent.ID).Upper(), filepath.Join(stage, "upper")); err != nil {
		return 0, errors.Join(fmt.Errorf("copy the volume of %s: %w", parent.Name, err), resume())
	}
	if err := resume(); err != nil {
		return 0, err
	}
	return time.Since(began), nil
}

// restoreChild brings up a clone's child sb: a copy of the parent's volume
// under its own overlay, its own network, boundary and bundle, then a
// restore of the clone image and the reseed (t.Warm.Reseed).
// fromSnapshot stages the clone from the parent's own image when it is
// in the snapshot tier (image and volume, copied under its lock), and
// reports whether it did; else fork checkpoints the parent afresh.
func (c *cloning) fromSnapshot(ctx context.Context) (bool, error) {
	n, parent, stage := c.n, c.parent, c.stage
	e := n.tiers.Entry(parent.ID)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := e.Acquire(actx); err != nil {
		return false, fmt.Errorf("%w: sandbox %s (%s) is busy with another transition; try again when it is done", errdefs.ErrConflict, parent.Name, parent.ID)
	}
	defer e.Release()
	d := n.h.Dir(parent.ID)
	if e.Tier() != api.TierSnapshot || !d.HasSnapshot() {
		return false, nil
	}
	p, err := n.st.GetSandbox(ctx, parent.ID) // its build, as its image was written
	if err != nil {
		return false, err
	}
	bg := context.WithoutCancel(ctx)
	if err := layout.CopyTree(bg, d.Snapshot(), filepath.Join(stage, "image")); err != nil {
		return false, fmt.Errorf("copy the snapshot image of %s: %w", parent.Name, err)
	}
	n.kept.Pin(stage, runtimes.Key(p.Runsc))
	n.kept.Stamp(filepath.Join(stage, "image"), runtimes.Key(p.Runsc))
	if err := layout.CopyTree(bg, d.Upper(), filepath.Join(stage, "upper")); err != nil {
		return false, fmt.Errorf("copy the volume of %s: %w", parent.Name, err)
	}
	n.log.Info("clone: from the parent's snapshot image", "id", parent.ID, "count", c.count)
	return true, nil
}

func (c *cloning) restoreChild(sb store.Sandbox, t store.Template) error {
	n, parent, stage := c.n, c.parent, c.stage
	bg := context.Background()
	d := n.h.Dir(sb.ID)
	if err := n.tiers.RestoreRunsc(&sb, filepath.Join(stage, "image")); err != nil {
		return err
	}
	if err := n.h.CloneVolume(bg, filepath.Join(stage, "upper"), parent.ID, sb.ID); err != nil {
		return err
	}
	if err := n.h.Prepare(sb, t, n.envd.For(n.h.Dir(parent.ID))); err != nil {
		return err
	}
	d.Mark("cloned from %s (%s): its memory and volume are the parent's at that moment, reseeded", parent.Name, parent.ID)
	spec := n.h.Spec(sb)
	if err := n.be.Restore(bg, spec, filepath.Join(stage, "image")); err != nil {
		return fmt.Errorf("restore the clone image: %w", err)
	}
	return warm.Reseed(bg, n.be, spec, t)
}
