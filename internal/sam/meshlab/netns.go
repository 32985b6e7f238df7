package meshlab

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netns"
)

// Host is one machine of a lab: a network namespace with an address on
// the lab's LAN.
type Host struct {
	NS, Addr string
}

// Command runs bin inside the host's namespace. nsenter execs it, so the
// process's PID is the program's own and a signal reaches it.
func (h Host) Command(bin string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=/run/netns/" + h.NS, "--", bin}, args...)...)
}

// InNS runs f on an OS thread inside the namespace ns: a socket made there
// (a listener, a dial) stays in it.
func InNS(ns string, f func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := netns.GetFromName(ns)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := f()
	if err := netns.Set(orig); err != nil {
		// The thread stays locked and dies with its goroutine rather than
		// run anything else in the wrong namespace.
		return fmt.Errorf("back from %s: %w", ns, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// HTTPClient is a client whose connections are made inside the host's
// namespace, a new one each request (a process restarted in between
// leaves no stale connection behind to fail a probe).
func (h Host) HTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = InNS(h.NS, func() error {
				var d net.Dialer
				c, err = d.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}}}
}

// ip runs ip(8) with args.
func ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// nft runs nft(8) with args inside h's namespace.
func (h Host) nft(args ...string) error {
	if out, err := h.Command("nft", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("nft %s in %s: %v: %s", strings.Join(args, " "), h.NS, err, strings.TrimSpace(string(out)))
	}
	return nil
}
