#!/bin/bash
# The primary's first start (docker-entrypoint-initdb.d): a role the read replica streams with, and the
# pg_hba line that lets it (the image's own "host all all all" line does not cover replication).
set -euo pipefail
: "${REPLICATION_PASSWORD:?REPLICATION_PASSWORD is not set}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" --set=password="$REPLICATION_PASSWORD" <<'SQL'
CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD :'password';
SQL
echo "host replication replicator all scram-sha-256" >> "$PGDATA/pg_hba.conf"
