#!/bin/bash
# A hot standby of the primary: cloned with pg_basebackup on its first start (an empty data directory),
# then streaming. Arguments go to postgres (-c settings: a standby needs at least the primary's
# max_connections and max_locks_per_transaction). Runs as the postgres user; PGPASSWORD is the
# replicator's password, which the WAL receiver also reads from the environment.
set -euo pipefail
: "${PRIMARY_HOST:?PRIMARY_HOST is not set}"
: "${PGDATA:?PGDATA is not set}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  until pg_isready -q -h "$PRIMARY_HOST" -U replicator -d postgres; do sleep 2; done
  # A clone that failed half-way leaves files behind: start from an empty directory each time.
  rm -rf "${PGDATA:?}"/* "${PGDATA:?}"/.[!.]* 2>/dev/null || true
  pg_basebackup -h "$PRIMARY_HOST" -U replicator -D "$PGDATA" -X stream -R --checkpoint=fast --progress
  chmod 0700 "$PGDATA"
fi
exec postgres "$@"
