// Package meshnode is the local part of sam-node: the mesh's node next to
// the agents. It serves two things to the boundaries of the sandboxes on
// this machine, and nothing to anyone else:
//
//   - an OpenAI-compatible API (GET /v1/models, GET /v1/models/{model},
//     POST /v1/chat/completions, POST /v1/completions) that routes each
//     request by its model to a configured upstream provider;
//   - one MCP endpoint (Streamable HTTP, /mcp) that aggregates the
//     configured upstream MCP servers, and /mcp/<server> for one of them.
//
// # Who is asking
//
// Only boundaries connect to the agent listener. Every request carries
// the header X-Sam-Principal, set by the boundary from who the sandbox is
// (an agent cannot assert it: the boundary strips whatever the agent sent).
// A request without it is refused with 403. Everything an agent sees is
// decided by the policy of that principal (package policy): /v1/models lists
// only the models it is granted, tools/list only the tools it is granted, and
// a call to anything else is refused with an error the agent's model can read
// (an OpenAI-style 403 error object for a model, a tool result with isError
// for a tool), never a crash. A model or server that is not granted is refused
// before its existence is looked up, so refusals cannot be used to probe.
//
// A boundary may narrow a request to one service with X-Sam-Service:
// "inference://<model>" (the agent asked for <model>.inference.sam.alt) or
// "mcp://<server>" (it asked for <server>.mcp.sam.alt). A narrowed request
// sees only that service.
//
// # Tool names
//
// On /mcp a tool is named "<server>__<tool>": the configured server name,
// two underscores, the upstream tool's own name. Server names are DNS labels
// (a-z, 0-9, '-'), so the first "__" always ends the server name. On
// /mcp/<server> the tools keep their own names.
//
// # Providers
//
// A model may be served by several providers; they are tried in ascending
// rank (config order breaks ties). The next one is tried on a connection
// error or a 5xx answer, as long as nothing has been sent to the agent yet.
// A provider's API key is read from a file that must not be readable by group
// or others; it is sent upstream as "Authorization: Bearer" and never logged.
// The agent's own Authorization header and every X-Sam-* header are never
// forwarded upstream.
//
// # Config file
//
// YAML or JSON:
//
//	providers:
//	  - name: local-vllm
//	    url: http://127.0.0.1:8000/v1      # an OpenAI-compatible base URL
//	    models: [google/gemma-2-2b-it]
//	    rank: 0                            # lower is tried first
//	  - name: cloud
//	    url: https://llm.example.net/v1
//	    models: [google/gemma-2-2b-it, openrouter/auto]
//	    rank: 10
//	    api_key_file: /etc/sam/cloud.key   # mode 0600 or stricter
//	mcp_servers:
//	  - name: everything                   # a DNS label: a-z, 0-9, '-'
//	    command: [node, /opt/mcp/everything/dist/index.js, stdio]
//	    env: ["FOO=bar"]                   # optional, added to the node's env
//	  - name: calc
//	    url: http://127.0.0.1:3001/mcp     # Streamable HTTP
//
// # Admin
//
// Health (/healthz), readiness (/readyz: every upstream MCP server is
// connected) and Prometheus metrics (/metrics) are served by AdminHandler,
// which the caller puts on a listener sandboxes cannot reach; the agent
// handler answers those paths with 404.
package meshnode
