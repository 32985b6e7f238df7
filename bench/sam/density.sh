#!/usr/bin/env bash
# What a boundary costs, measured the way the SAM seed's "Scale" page does:
# one sam-node, then one sam-box process serving N boundaries (N in $STEPS),
# and sam-bench driving the same request (/v1/models, answered by the node
# itself) through the first boundary's SOCKS5 socket, with a reused flow and
# with a new flow per request, plus a run that policy must refuse, and the
# baseline straight to the node's socket. RSS of sam-box is recorded at each
# step. Results (raw observation files and table.md) go to
# bench/results/sam-<date>-<commit>/.
#
#   bench/sam/density.sh                      # STEPS=1,8,64 REQUESTS=500 CONCURRENCY=4
#   STEPS=1,8 REQUESTS=200 bench/sam/density.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-1,8,64}
REQUESTS=${REQUESTS:-500}
CONCURRENCY=${CONCURRENCY:-4}
WARMUP=${WARMUP:-20}

commit=$(git rev-parse --short HEAD)
out=${OUT:-bench/results/sam-$(date -u +%Y-%m-%d)-$commit}
work=$(mktemp -d /tmp/sam-density.XXXXXX)
mkdir -p "$out"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

echo "building sam-node, sam-box, sam-bench" >&2
for b in sam-node sam-box sam-bench; do go build -o "$work/$b" "./cmd/$b"; done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; return 1; }

max=$(echo "$STEPS" | tr ',' '\n' | sort -n | tail -1)
{
	echo "roles: [{name: r, services: [\"inference://*\"]}]"
	echo "bindings:"
	for i in $(seq "$max"); do echo "  - {principal: agent-$i, roles: [r]}"; done
} >"$work/policy.yaml"
# No provider is contacted: /v1/models is answered by the node from its config.
cat >"$work/node.yaml" <<CFG
providers:
  - {name: none, url: "http://127.0.0.1:9/v1", models: [model-a, model-b]}
CFG

"$work/sam-node" --config "$work/node.yaml" --policy "$work/policy.yaml" \
	--listen "unix://$work/node.sock" --admin-addr "127.0.0.1:$(free_port)" 2>"$work/sam-node.log" &
pids+=($!)
wait_for "$work/node.sock"

bench() { "$work/sam-bench" run -q --requests "$REQUESTS" --concurrency "$CONCURRENCY" --warmup "$WARMUP" "$@"; }

echo "baseline: straight to the node's socket" >&2
bench --target-unix "$work/node.sock" --target http://localhost/v1/models \
	--header X-Sam-Principal=agent-1 --label "step=0 baseline" --out "$out/baseline.json"

for n in $(echo "$STEPS" | tr ',' ' '); do
	echo "step $n: $n boundaries in one sam-box" >&2
	{
		echo "mesh: unix://$work/node.sock"
		echo "policy: $work/policy.yaml"
		echo "boundaries:"
		for i in $(seq "$n"); do echo "  - {principal: agent-$i, socket: $work/agent-$i.sock}"; done
	} >"$work/box-$n.yaml"
	mport=$(free_port)
	"$work/sam-box" --config "$work/box-$n.yaml" --metrics-addr "127.0.0.1:$mport" 2>"$work/sam-box-$n.log" &
	box=$!
	pids+=($box)
	wait_for "$work/agent-$n.sock"
	common=(--socket "$work/agent-1.sock" --scrape "http://127.0.0.1:$mport/metrics" --rss-pids "$box")
	bench "${common[@]}" --target http://mesh.sam.alt/v1/models --label "step=$n reused" --out "$out/step$n-reused.json"
	bench "${common[@]}" --target http://mesh.sam.alt/v1/models --new-flow --label "step=$n new-flow" --out "$out/step$n-new.json"
	bench "${common[@]}" --target http://example.com/ --new-flow --expect-deny --label "step=$n deny" --out "$out/step$n-deny.json"
	kill "$box"
	wait "$box" 2>/dev/null || true
done

"$work/sam-bench" report "$out"/*.json >"$out/table.md"
echo "results: $out" >&2
cat "$out/table.md"
