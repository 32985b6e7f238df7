package bench

import "sandstorm/internal/mountinfo"

// MountsUnder returns mount points at or below dir, deepest first: what a
// benchmark's sandboxes left mounted under its work dir, to unmount before
// the dir is removed.
func MountsUnder(dir string) []string { return mountinfo.Under(dir) }
