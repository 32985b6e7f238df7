// Command sam-bench measures what an agent pays to reach the mesh: it
// issues the same request many times through a boundary's SOCKS5 socket
// (or, for the baseline, straight to the node's Unix socket), records every
// request with the machine and commit, and renders runs as a Markdown table.
//
//	sam-bench run --socket /run/agent.sock --target http://mesh.sam.alt/v1/models \
//	    --requests 500 --concurrency 4 --scrape http://127.0.0.1:9600/metrics --out results/x.json
//	sam-bench run --target-unix /run/node.sock --target http://localhost/v1/models \
//	    --header X-Sam-Principal=agent-a --requests 500 --concurrency 4 --out results/base.json
//	sam-bench report results/*.json > table.md
package main

import "sandstorm/internal/cli"

func main() { cli.ExitOnSignal("sam-bench", rootCmd()) }
