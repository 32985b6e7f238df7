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
// nothing needs. n.h.Spec(sb) hands the row's build to the backend, so
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
	n.kept = runtimes.NewKeeper(runtimes.KeeperConfig{Set: set, Rows: rowsOf(n.st, n.cfg.Name), Snapshots: snapshotsIn(n.cfg.DataDir), Log: n.log})
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

// rowsOf is the builds node's rows name (runtimes.KeeperConfig.Rows).
func rowsOf(st *store.Store, node string) func(context.Context) ([]runtimes.Row, error) {
	return func(ctx context.Context) ([]runtimes.Row, error) {
		rows, err := st.ListSandboxes(ctx, node)
		if err != nil {
			return nil, err
		}
		out := make([]runtimes.Row, 0, len(rows))
		for _, sb := range rows {
			out = append(out, runtimes.Row{ID: sb.ID, Key: runtimes.Key(sb.Runsc), Image: sb.Tier == api.TierSnapshot})
		}
		return out, nil
	}
}

// snapshotsIn is every sandbox's snapshot directory under dataDir
// (runtimes.KeeperConfig.Snapshots).
func snapshotsIn(dataDir string) func() map[string]string {
	return func() map[string]string {
		dirs, _ := filepath.Glob(filepath.Join(dataDir, "sandboxes", "*", "snapshot"))
		out := make(map[string]string, len(dirs))
		for _, dir := range dirs {
			out[filepath.Base(filepath.Dir(dir))] = dir
		}
		return out
	}
}

// RunscBuilds is every runsc build the node keeps, and why (GET /v1/node
// "runsc"); nil without kept builds.
func (n *Node) RunscBuilds(ctx context.Context) []api.RunscBuild { return n.kept.Builds(ctx) }

// runtimeOf is be's RuntimeVersion ("" if it cannot say).
func runtimeOf(be sandbox.Backend) string {
	if b, ok := be.(interface{ RuntimeVersion() string }); ok {
		return b.RuntimeVersion()
	}
	return ""
}

// canRestore refuses a move whose image this node has no runsc for:
// with kept builds, the very build that wrote it on this node's platform.
// Refused before anything is received, so the sandbox stays whole on the
// node it was leaving.
func canRestore(kept *runtimes.Keeper, be sandbox.Backend, node string, m livemove.Manifest) error {
	if err := kept.CanRestore(runtimes.Key(m.Runsc), m.Runtime, runtimeOf(be)); err != nil {
		return fmt.Errorf("%w: move of %s to node %s: %v; move it to a node that has that build, or let it start cold where it is", errdefs.ErrPrecondition, m.Name, node, err)
	}
	return nil
}
