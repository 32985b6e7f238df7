// Command sam-node is the mesh's node next to the agents: the
// OpenAI-compatible facade and MCP aggregator that sandbox boundaries
// forward agents' requests to. See package internal/sam/meshnode.
//
//	sam-node --config node.yaml --policy policy.yaml \
//	  --listen unix:///run/sam-node.sock --admin-addr 127.0.0.1:9601
package main

import (
	"os"

	"sandstorm/internal/cli"
	"sandstorm/internal/memguard"
)

func main() {
	// If the node runs out of memory the kernel should kill a sandbox
	// (sandstormd raises theirs), not the mesh every agent depends on.
	// Lowering needs root; as anyone else it is simply not done.
	if os.Geteuid() == 0 {
		memguard.ProtectSelf(-900)
	}
	cli.ExitOnSignal("sam-node", rootCmd())
}
