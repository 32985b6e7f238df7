// Command sam-box runs SAM boundaries as a host process: one (--principal)
// or many (--config), each the only way out for one agent, deciding every
// flow on the destination's name under the policy. See internal/sam/boundary.
//
//	sam-box --principal agent-a --policy policy.yaml --socket /run/agent.sock \
//	  --mesh unix:///run/sam-node.sock [--metrics-addr 127.0.0.1:9600]
package main

import (
	"sandstorm/internal/cli"
)

func main() { cli.ExitOnSignal("sam-box", rootCmd()) }
