package process

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"sandstorm/internal/sandbox"
)

// record is the per-container state file, <stateDir>/<id>.json. It is all a
// new Backend over the same stateDir needs to find a container again after
// the daemon restarted.
type record struct {
	ID string `json:"id"`
	// Pid is the host PID of the container's init (PID 1 inside its PID
	// namespace). 0 while Start has created the cgroup but not yet the
	// process: the record exists first so that a crash mid-Start leaves
	// something List reports and Remove cleans up.
	Pid int `json:"pid"`
	// StartTime is field 22 of /proc/<pid>/stat (clock ticks after boot).
	// A PID alone may have been reused by an unrelated process after the
	// container died; PID plus start time may not.
	StartTime uint64 `json:"start_time"`
	// Cgroup is the absolute path of the container's cgroup v2 leaf.
	Cgroup string `json:"cgroup"`
	// Rootfs is the absolute, symlink-free root directory of the process.
	Rootfs  string    `json:"rootfs"`
	Netns   string    `json:"netns"`
	Started time.Time `json:"started"`
}

func (b *Backend) recordPath(id string) string {
	return filepath.Join(b.stateDir, id+".json")
}

// readRecord returns the record for id; os.ErrNotExist (wrapped) if none.
func (b *Backend) readRecord(id string) (*record, error) {
	data, err := os.ReadFile(b.recordPath(id))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("parse state file %s: %w", b.recordPath(id), err)
	}
	if r.ID != id {
		return nil, fmt.Errorf("state file %s names container %q", b.recordPath(id), r.ID)
	}
	return &r, nil
}

// writeRecord replaces the record atomically: readers see the old or the
// new file, never a torn one, and after a crash the file is one or the
// other (the data and the directory entry are fsynced).
func (b *Backend) writeRecord(r *record) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(b.stateDir, "."+r.ID+".json.tmp-*")
	if err != nil {
		return fmt.Errorf("write state file: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(append(data, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, b.recordPath(r.ID))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write state file: %w", err)
	}
	return syncDir(b.stateDir)
}

func (b *Backend) removeRecord(id string) error {
	if err := os.Remove(b.recordPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return syncDir(b.stateDir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// procStat holds the fields of /proc/<pid>/stat this package uses.
type procStat struct {
	State     byte   // R, S, D, Z, T, ...
	StartTime uint64 // clock ticks after boot
}

// readProcStat reads /proc/<pid>/stat (sandbox.ReadStat).
func readProcStat(pid int) (procStat, error) {
	state, start, ok := sandbox.ReadStat("/proc/" + strconv.Itoa(pid) + "/stat")
	if !ok {
		return procStat{}, fmt.Errorf("no process %d, or a malformed /proc/%d/stat", pid, pid)
	}
	return procStat{State: state, StartTime: start}, nil
}

// alive reports whether pid is still the process that had startTime and
// has not exited (a zombie has exited; it only waits to be reaped).
func alive(pid int, startTime uint64) bool {
	if pid <= 0 {
		return false
	}
	st, err := readProcStat(pid)
	if err != nil {
		return false
	}
	return st.StartTime == startTime && st.State != 'Z' && st.State != 'X'
}
