// Command sam-one is the mesh's control plane, its router and a console
// in one process, for a laptop or a first machine. See package
// internal/sam/samone.
//
//	sam-one serve --data-dir /var/lib/sam-one --listen 127.0.0.1:7600 --router-listen /ip4/0.0.0.0/tcp/7700
package main

import "sandstorm/internal/cli"

func main() { cli.ExitOnSignal("sam-one", rootCmd()) }
