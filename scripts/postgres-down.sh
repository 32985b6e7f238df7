#!/usr/bin/env bash
# Stops the PostgreSQL cluster scripts/postgres-up.sh started, if it did
# (the file named by POSTGRES_STARTED says so); one that was already
# running before is left running.
set -euo pipefail
f=${POSTGRES_STARTED:?set POSTGRES_STARTED to the file postgres-up.sh wrote}
[ -f "$f" ] || exit 0
read -r ver cluster <"$f"
pg_ctlcluster "$ver" "$cluster" stop
rm -f "$f"
echo "PostgreSQL $ver/$cluster stopped (make test started it)"
