package bench

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// Main is what the node benchmarks' mains do alike: refuse to start
// without root (sandstormd creates network namespaces, mounts and runsc
// sandboxes), run until done or interrupted (SIGINT, SIGTERM: run's ctx
// ends, and it tears down what it started), say where the results went,
// and exit 1 on an error.
func Main(name string, run func(ctx context.Context) (results string, err error)) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, name+": needs root (sandstormd creates network namespaces, mounts and runsc sandboxes)")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	path, err := run(ctx)
	stop()
	if path != "" {
		fmt.Fprintln(os.Stderr, "results:", path)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}
