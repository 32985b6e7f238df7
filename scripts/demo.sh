#!/usr/bin/env bash
# make demo: start sandstormd (unless one already answers), build the demo
# template from Debian packages, create a sandbox, and walk it through every
# tier, waking it each time with a plain HTTP request through the gateway.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-bin/sandstormd}
export SANDSTORM_DATA_DIR=${SANDSTORM_DATA_DIR:-/var/lib/sandstorm}
export SANDSTORM_API=${SANDSTORM_API:-https://127.0.0.1:8080}
# Where a daemon started here listens: SANDSTORM_API's host:port unless
# SANDSTORM_LISTEN says otherwise (e.g. 0.0.0.0:8080).
LISTEN=${SANDSTORM_LISTEN:-${SANDSTORM_API#https://}}
LISTEN=${LISTEN%%/*}
LOG=${SANDSTORM_LOG:-$SANDSTORM_DATA_DIR/sandstormd.log}
TEMPLATE=${TEMPLATE:-web}

# Bold headings on a terminal only: a log or a pipe gets no escapes.
if [ -t 1 ]; then
	say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
else
	say() { printf '\n== %s\n' "$*"; }
fi

if [ "$(id -u)" != 0 ]; then
	echo "make demo needs root (network namespaces, mounts, runsc): sudo make demo" >&2
	exit 1
fi

# The API is HTTPS with a certificate from the daemon's own CA.
api_up() { [ -f "$SANDSTORM_DATA_DIR/pki/ca.pem" ] && curl -s -o /dev/null -m 1 --cacert "$SANDSTORM_DATA_DIR/pki/ca.pem" "$SANDSTORM_API/v1/node"; }

started=
if api_up; then
	say "sandstormd already answers at $SANDSTORM_API"
	# Not ours: its log is wherever its starter sent it, its timers its own.
	LOG="wherever its starter sent it"
else
	started=1
	say "starting sandstormd (data in $SANDSTORM_DATA_DIR, log in $LOG)"
	mkdir -p "$SANDSTORM_DATA_DIR"
	# Long idle timers so that only this script moves the sandbox.
	# SANDSTORM_SERVE_ARGS adds serve's flags (--gateway-ports, --subnet…).
	# shellcheck disable=SC2086
	nohup "$BIN" serve --master --node --data-dir "$SANDSTORM_DATA_DIR" --listen "$LISTEN" \
		--freeze-after 10m --snapshot-after 30m --detach-after 2h ${SANDSTORM_SERVE_ARGS:-} >>"$LOG" 2>&1 &
	spid=$!
	for _ in $(seq 100); do api_up && break; kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
	if ! api_up; then
		echo "sandstormd did not start at $SANDSTORM_API; see $LOG" >&2
		tail -20 "$LOG" >&2
		# Not left running behind a failure (its sandboxes, if any, stay).
		kill "$spid" 2>/dev/null && echo "(stopped the sandstormd started here, PID $spid)" >&2
		exit 1
	fi
fi
PID=$(cat "$SANDSTORM_DATA_DIR/sandstormd.pid" 2>/dev/null || echo "?")
say "sandstormd is PID $PID"
if [ -n "$started" ]; then
	echo "  (started here with long idle timers, freeze after 10m, so that only this script moves its sandbox;"
	echo "   serve's defaults are --freeze-after 30s --snapshot-after 5m --detach-after 1h)"
else
	echo "  (not started here: its own idle timers may move the sandbox between this script's steps)"
fi
# doctor exits 1 on a ✗; the demo goes on and shows what fails after it.
"$BIN" doctor | sed 's/^/  /' || echo "  (doctor found something to fix above; the demo goes on)"

say "building the '$TEMPLATE' template from Debian packages"
if "$BIN" sandbox get demo >/dev/null 2>&1; then "$BIN" sandbox rm demo >/dev/null; fi
"$BIN" template rm "$TEMPLATE" >/dev/null 2>&1 || true
"$BIN" template demo "$TEMPLATE"

say "creating sandbox 'demo'"
t0=$(date +%s%N)
"$BIN" sandbox create "$TEMPLATE" --name demo
URL=$("$BIN" sandbox get demo | python3 -c 'import json,sys; print(json.load(sys.stdin)["endpoints"]["8000"])')
body=$(curl -s --retry 50 --retry-delay 0 --retry-connrefused -m 30 "$URL/")
echo "  first answer after $(( ($(date +%s%N) - t0) / 1000000 )) ms: $body"

call() {
	local t0 t1 body wake
	t0=$(date +%s%N)
	body=$(curl -s -m 30 "$URL/")
	t1=$(date +%s%N)
	wake=$("$BIN" sandbox get demo | python3 -c 'import json,sys; s=json.load(sys.stdin); f=s.get("last_wake_from"); print("tier now %s; " % s["tier"] + ("node woke it from %s in %.1f ms" % (f, s.get("last_wake_ms",0)) if f else "no wake yet: created in %.1f ms" % s.get("last_wake_ms",0)))')
	echo "  curl $URL/ -> $body   (request took $(( (t1 - t0) / 1000000 )) ms; $wake)"
}

say "hot: a request goes straight through"
call
for op in freeze snapshot detach; do
	say "$op"
	"$BIN" sandbox "$op" demo
	"$BIN" sandbox ls | sed 's/^/  /'
	say "a request wakes it"
	call
done

# The CLI finds a daemon elsewhere than the defaults by the same variables.
ENVHINT=
if [ "$SANDSTORM_DATA_DIR" != /var/lib/sandstorm ] || [ "$SANDSTORM_API" != https://127.0.0.1:8080 ]; then
	ENVHINT="
  export SANDSTORM_DATA_DIR=$SANDSTORM_DATA_DIR SANDSTORM_API=$SANDSTORM_API"
fi

cat <<MSG

The counter kept its value through freeze and snapshot (memory state kept)
and started again at 1 after detach (a cold start from the template).

sandstormd is still running (log: $LOG). Try:${ENVHINT}
  $BIN sandbox ls
  curl $URL/
  $BIN sandbox rm demo
Stop it with: kill $PID   (its PID, from $SANDSTORM_DATA_DIR/sandstormd.pid). Its sandboxes
keep running and the next start adopts them: '$BIN sandbox rm demo' first if you want it gone.
MSG
