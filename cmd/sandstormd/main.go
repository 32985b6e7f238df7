// Command sandstormd is Sandstorm's one binary: master, node and their CLI.
//
//	sandstormd serve --master --node      run the daemon
//	sandstormd doctor                     what this machine supports
//	sandstormd template …                 manage templates
//	sandstormd sandbox …                  manage sandboxes
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "sandstormd:", err)
		os.Exit(1)
	}
}
