package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"sandstorm/internal/runtimes"
)

// checkRunscKept says which runsc builds the node keeps in
// <data-dir>/runsc-versions and why (its last decision, kept.json), and
// checks each as the node does before it runs one — owned by root,
// writable by no one else, its bytes hashing to its name — without
// changing anything. A build that fails would be refused at the next
// start, and the sandboxes whose memory it holds started cold.
func checkRunscKept(ctx context.Context, cfg Config) Check {
	if cfg.DataDir == "" {
		return Check{OK: true, Absent: true, Detail: "no data directory given", Fix: "pass the data directory sandstormd uses"}
	}
	dir := filepath.Join(cfg.DataDir, "runsc-versions")
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return Check{OK: true, Absent: true, Detail: "no runsc build kept yet in " + dir + " (the node keeps a copy of each runsc it runs, from its first start)",
			Fix: "nothing to do: sandstormd serve --node makes it"}
	}
	ins, rep, err := runtimes.Inspect(dir)
	if err != nil {
		return Check{Detail: err.Error(), Fix: "the directory must be root's and 0700: chown root:root " + dir + " && chmod 0700 " + dir}
	}
	why := map[runtimes.Key]string{}
	if rep != nil {
		for _, k := range rep.Kept {
			why[k.Key] = k.Why
		}
	}
	var lines, bad []string
	for _, in := range ins {
		w := why[in.Key]
		if w == "" {
			w = "not needed at the node's last look; removed at its next start"
		}
		if in.Err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", in.Key, in.Err))
			continue
		}
		lines = append(lines, fmt.Sprintf("%s (%s): %s", in.Key, in.Version, w))
	}
	var missing []string
	if rep != nil {
		for _, m := range rep.Missing {
			missing = append(missing, fmt.Sprintf("%s (%d running, %d images)", m.Key, m.Running, m.Images))
		}
		for k, r := range rep.Refused {
			bad = append(bad, fmt.Sprintf("%s was refused at the node's last start: %s", k, r))
		}
	}
	detail := fmt.Sprintf("%d runsc build(s) kept in %s", len(lines), dir)
	if len(lines) > 0 {
		detail += ": " + strings.Join(lines, "; ")
	}
	if len(bad) > 0 {
		return Check{Detail: detail + "; not trusted: " + strings.Join(bad, "; "),
			Fix: "a build whose bytes changed is never run: its snapshots start cold. To keep their memory, put back the same build (its SHA-256 must start with the last 16 hex digits of its key) as <key>/runsc, root's, mode 0755"}
	}
	if len(missing) > 0 {
		return Check{Detail: detail + "; missing, and needed by sandboxes: " + strings.Join(missing, "; "),
			Fix: "put the build back in " + dir + "/<key>/runsc with its build.json, or let those sandboxes start cold (their memory is lost)"}
	}
	return Check{OK: true, Detail: detail}
}
