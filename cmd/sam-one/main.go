// Command sam-one is the mesh's control plane, its router and a console
// in one process, for a laptop or a first machine. See package
// internal/samone.
//
//	sam-one serve --data-dir /var/lib/sam-one --listen 127.0.0.1:7600 --router-listen /ip4/0.0.0.0/tcp/7700
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"sandstorm/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, "sam-one", rootCmd(), os.Stderr)
	stop()
	os.Exit(code)
}
