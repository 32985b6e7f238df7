#!/usr/bin/env bash
# Starts Debian's PostgreSQL cluster (apt-get install -y postgresql) and
# gives the invoking user a superuser role of its own name, so that tests
# and a local master can connect over the Unix socket with peer
# authentication: postgres:///postgres?host=/var/run/postgresql
# Idempotent; run as root. Stop it with: pg_ctlcluster <version> main stop
set -euo pipefail
read -r ver cluster _ < <(pg_lsclusters -h | head -1) || {
	echo "postgres-up: no PostgreSQL cluster; install it: apt-get install -y postgresql" >&2
	exit 1
}
# POSTGRES_STARTED, if set, is a file that records that this script started
# the cluster (it was not running), for scripts/postgres-down.sh to stop it
# again: make test leaves the machine as it found it.
if ! pg_lsclusters -h | awk '{print $4}' | head -1 | grep -q online; then
	pg_ctlcluster "$ver" "$cluster" start
	[ -z "${POSTGRES_STARTED:-}" ] || echo "$ver $cluster" >"$POSTGRES_STARTED"
fi
user=$(id -un)
for _ in $(seq 1 50); do
	runuser -u postgres -- psql -qAtc 'SELECT 1' >/dev/null 2>&1 && break
	sleep 0.1
done
if [ "$(runuser -u postgres -- psql -qAtc "SELECT count(*) FROM pg_roles WHERE rolname='$user'")" = 0 ]; then
	runuser -u postgres -- psql -qc "CREATE ROLE \"$user\" SUPERUSER LOGIN"
fi
echo "PostgreSQL $ver/$cluster is up: postgres:///postgres?host=/var/run/postgresql (as $user)"
