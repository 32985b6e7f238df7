// Command sam-node is the mesh's node next to the agents: the
// OpenAI-compatible facade and MCP aggregator that sandbox boundaries
// forward agents' requests to. See package internal/meshnode.
//
//	sam-node --config node.yaml --policy policy.yaml \
//	  --listen unix:///run/sam-node.sock --admin-addr 127.0.0.1:9601
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "sam-node:", err)
		os.Exit(1)
	}
}
