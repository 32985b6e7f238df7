package node

import (
	"context"
	"fmt"
	"path/filepath"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/node/livemove"
	"sandstorm/internal/runtimes"
	"sandstorm/internal/sandbox"
	"sandstorm/internal/store"
)

// Upgrades of runsc that keep memory (issue 18): the node keeps every
// build it has used, under <data-dir>/runsc-versions, and each sandbox's
// row names the build its memory belongs to (store column runsc);
// runtimes.Keeper decides which build runs what and removes the builds
// nothing needs. n.spec(sb) hands the row's build to the backend, so
// every command for the sandbox — state, pause, resume, checkpoint, exec,
// kill, delete — runs it. What is here is the node's side: its rows.

// installRunsc keeps the backend's runsc build (copied in if new), makes
// the backend run the kept copy, and gives rows from before builds were
// kept the current build (the one their sandboxes most likely run on: a
// node upgraded to this version with the same runsc). A backend without a
// binary runtime has nothing to keep (n.kept stays nil).
func (n *Node) installRunsc() error {
	br, ok := n.be.(sandbox.BinaryRuntime)
	if !ok {
		return nil
	}
	ctx := context.Background()
	dir := filepath.Join(n.cfg.DataDir, "runsc-versions")
	set, err := runtimes.Open(ctx, dir, br.Binary(), br.VersionOf, n.log)
	if err != nil {
		return fmt.Errorf("keep the runsc build: %w", err)
	}
	br.UseBinary(set.Current().Path)
	n.kept = runtimes.NewKeeper(runtimes.KeeperConfig{Set: set, Rows: n.runscRows, Snapshots: n.snapshotDirs, Log: n.log})
	cur := set.Current()
	n.log.Info("runsc build", "key", cur.Key, "version", cur.Version, "sha256", cur.SHA256, "path", cur.Path, "from", br.Binary(), "kept", len(set.Keys()))
	rows, err := n.st.ListSandboxes(ctx, n.cfg.Name)
	if err != nil {
		return err
	}
	for _, sb := range rows {
		if sb.Runsc != "" || sb.Tier == api.TierDetached && sb.Transition == "" {
			continue
		}
		if _, err := n.st.UpdateSandbox(ctx, sb.ID, func(s *store.Sandbox) error {
			if s.Runsc == "" {
				s.Runsc = string(cur.Key)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// runscRows is the builds the node's rows name (runtimes.KeeperConfig).
func (n *Node) runscRows(ctx context.Context) ([]runtimes.Row, error) {
	rows, err := n.st.ListSandboxes(ctx, n.cfg.Name)
	if err != nil {
		return nil, err
	}
	out := make([]runtimes.Row, 0, len(rows))
	for _, sb := range rows {
		out = append(out, runtimes.Row{ID: sb.ID, Key: runtimes.Key(sb.Runsc), Image: sb.Tier == api.TierSnapshot})
	}
	return out, nil
}

// snapshotDirs is every sandbox's snapshot directory on disk
// (runtimes.KeeperConfig).
func (n *Node) snapshotDirs() map[string]string {
	dirs, _ := filepath.Glob(filepath.Join(n.cfg.DataDir, "sandboxes", "*", "snapshot"))
	out := make(map[string]string, len(dirs))
	for _, dir := range dirs {
		out[filepath.Base(filepath.Dir(dir))] = dir
	}
	return out
}

// setRunsc records in sb's row that it runs on build key (before runsc
// runs, so a restart finds the build that started it), and lets its old
// build go.
func (n *Node) setRunsc(sb *store.Sandbox, key runtimes.Key) error {
	if key == "" || sb.Runsc == string(key) {
		return nil
	}
	old := sb.Runsc
	if _, err := n.st.UpdateSandbox(context.Background(), sb.ID, func(s *store.Sandbox) error { s.Runsc = string(key); return nil }); err != nil {
		return err
	}
	sb.Runsc = string(key)
	n.kept.Changed(runtimes.Key(old))
	return nil
}

// onCurrentRunsc: sb, about to be started cold, runs on the current build.
func (n *Node) onCurrentRunsc(sb *store.Sandbox) error { return n.setRunsc(sb, n.kept.Current()) }

// restoreRunsc: sb, about to be restored from the image in imageDir, runs
// on the build that wrote it (runtimes.Keeper.ForRestore), or fails
// before anything is started when the node does not have it.
func (n *Node) restoreRunsc(sb *store.Sandbox, imageDir string) error {
	key, err := n.kept.ForRestore(imageDir, runtimes.Key(sb.Runsc))
	if err != nil {
		return err
	}
	return n.setRunsc(sb, key)
}

// freshRunsc sets sb's build from its row as it is now (a caller that
// read the row before a wake may hold an older one).
func (n *Node) freshRunsc(sb *store.Sandbox) {
	if cur, err := n.st.GetSandbox(context.Background(), sb.ID); err == nil {
		sb.Runsc = cur.Runsc
	}
}

// RunscBuilds is every runsc build the node keeps, and why (GET /v1/node
// "runsc"); nil without kept builds.
func (n *Node) RunscBuilds(ctx context.Context) []api.RunscBuild { return n.kept.Builds(ctx) }

// backendRuntime is the backend's RuntimeVersion ("" if it cannot say).
func (n *Node) backendRuntime() string {
	if b, ok := n.be.(interface{ RuntimeVersion() string }); ok {
		return b.RuntimeVersion()
	}
	return ""
}

// canRestore refuses a move whose image this node has no runsc for:
// with kept builds, the very build that wrote it on this node's platform.
// Refused before anything is received, so the sandbox stays whole on the
// node it was leaving.
func (n *Node) canRestore(m livemove.Manifest) error {
	if err := n.kept.CanRestore(runtimes.Key(m.Runsc), m.Runtime, n.backendRuntime()); err != nil {
		return fmt.Errorf("%w: move of %s to node %s: %v; move it to a node that has that build, or let it start cold where it is", errdefs.ErrPrecondition, m.Name, n.cfg.Name, err)
	}
	return nil
}
