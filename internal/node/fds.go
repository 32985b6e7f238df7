package node

import (
	"fmt"
	"os"
	"syscall"
)

// File descriptors are a node resource like memory and disk. Every sandbox
// keeps one open for each gateway port it has (the listener), and a hot or
// frozen one about six more (its boundary's listeners and DNS socket, the
// netlink and namespace handles while it starts); a node near its limit
// would otherwise fail some accept, dial or runsc start at random with
// EMFILE. Go raises the soft RLIMIT_NOFILE to the hard one at start; the
// hard one is the node's (seen here: 20,000, with no CAP_SYS_RESOURCE to
// raise it).

// fdsPerStart is what a create or wake may open before it is done.
const fdsPerStart = 16

// fdHeadroom is kept free for the API, the store and runsc's pipes.
const fdHeadroom = 256

// admitFDs refuses (ErrFull, 503) a start that would leave fewer than
// fdHeadroom descriptors free.
func (n *Node) admitFDs() error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return nil
	}
	open, err := openFDs()
	if err != nil {
		return nil
	}
	if uint64(open+fdsPerStart+fdHeadroom) > lim.Cur {
		return fmt.Errorf("%w: sandstormd has %d of its %d file descriptors open; raise its limit (e.g. LimitNOFILE= in its systemd unit, or ulimit -n before it starts) or put the sandbox on another node", ErrFull, open, lim.Cur)
	}
	return nil
}

// openFDs counts this process's open file descriptors.
func openFDs() (int, error) {
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	return len(names) - 1, err // minus the directory itself
}
