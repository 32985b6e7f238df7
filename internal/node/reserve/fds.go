package reserve

import (
	"os"
	"syscall"
)

// ProcessFDs is how many file descriptors this process has open and may
// (admission.Config.FDs). Go raises the soft RLIMIT_NOFILE to the hard
// one at start; the hard one is the node's (seen here: 20,000, with no
// CAP_SYS_RESOURCE to raise it).
func ProcessFDs() (int, uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, err
	}
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	return len(names) - 1, lim.Cur, err // minus the directory itself
}
