package tiering

import (
	"context"

	"sandstorm/internal/runtimes"
	"sandstorm/internal/store"
)

// A sandbox's row names the runsc build its memory belongs to (issue 18;
// runtimes.Keeper): set before runsc runs, so a restart finds the build
// that started it.

// setRunsc records in sb's row that it runs on build key, and lets its
// old build go.
func (m *Machine) setRunsc(sb *store.Sandbox, key runtimes.Key) error {
	if key == "" || sb.Runsc == string(key) {
		return nil
	}
	old := sb.Runsc
	if _, err := m.st.UpdateSandbox(context.Background(), sb.ID, func(s *store.Sandbox) error { s.Runsc = string(key); return nil }); err != nil {
		return err
	}
	sb.Runsc = string(key)
	m.cfg.Kept.Changed(runtimes.Key(old))
	return nil
}

// OnCurrentRunsc: sb, about to be started cold, runs on the current build.
func (m *Machine) OnCurrentRunsc(sb *store.Sandbox) error {
	return m.setRunsc(sb, m.cfg.Kept.Current())
}

// RestoreRunsc: sb, about to be restored from the image in imageDir, runs
// on the build that wrote it (runtimes.Keeper.ForRestore), or fails
// before anything is started when the node does not have it.
func (m *Machine) RestoreRunsc(sb *store.Sandbox, imageDir string) error {
	key, err := m.cfg.Kept.ForRestore(imageDir, runtimes.Key(sb.Runsc))
	if err != nil {
		return err
	}
	return m.setRunsc(sb, key)
}

// FreshRunsc sets sb's build from its row as it is now (a caller that
// read the row before a wake may hold an older one).
func (m *Machine) FreshRunsc(sb *store.Sandbox) {
	if cur, err := m.st.GetSandbox(context.Background(), sb.ID); err == nil {
		sb.Runsc = cur.Runsc
	}
}
