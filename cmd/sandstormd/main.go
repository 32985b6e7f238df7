// Command sandstormd is Sandstorm's one binary: master, node and their CLI.
//
//	sandstormd serve --master --node      run the daemon
//	sandstormd doctor                     what this machine supports
//	sandstormd template …                 manage templates
//	sandstormd sandbox …                  manage sandboxes
//
// Exit status: 0 on success, 2 on a usage error (unknown command or flag,
// wrong arguments), 1 on any other error (internal/cli).
package main

import (
	"context"

	"sandstorm/internal/cli"
)

func main() { cli.Exit(context.Background(), "sandstormd", rootCmd()) }
