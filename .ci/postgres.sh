#!/usr/bin/env bash
# Start a throw-away PostgreSQL server for the tests (perf_db on PostgreSQL, concurrent tuning workers).
#   source .ci/postgres.sh      -> exports PATHTUNE_TEST_PG_URL and defines pg_stop (call it at exit)
# Runs the server as the non-root user `postgres` (created if missing) on 127.0.0.1:$PG_PORT with a data
# dir under /tmp; installs Debian's postgresql if initdb is missing.
set -euo pipefail

PG_PORT="${PG_PORT:-55432}"
PG_DB="${PG_DB:-pathtune_test}"

pg_bin() {
    local name="$1"
    if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return; fi
    local found
    found="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
    [ -n "$found" ] && [ -x "$found/$name" ] && { echo "$found/$name"; return; }
    return 1
}

if ! pg_bin initdb >/dev/null; then
    echo ".ci/postgres.sh: installing PostgreSQL (apt-get)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
INITDB="$(pg_bin initdb)"
PG_CTL="$(pg_bin pg_ctl)"
id postgres >/dev/null 2>&1 || useradd --system --create-home --shell /bin/bash postgres

PG_DIR="$(mktemp -d /tmp/pathtune-pg.XXXXXX)"
chown postgres "$PG_DIR"
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi; }

as_pg "'$INITDB' -D '$PG_DIR/data' -U postgres --auth=trust -E UTF8 >'$PG_DIR/initdb.log' 2>&1"
as_pg "'$PG_CTL' -D '$PG_DIR/data' -l '$PG_DIR/server.log' -w -t 60 \
    -o \"-p $PG_PORT -k '$PG_DIR' -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off\" start >/dev/null"
as_pg "psql -h 127.0.0.1 -p $PG_PORT -U postgres -d postgres -qc 'CREATE DATABASE $PG_DB'"

export PATHTUNE_TEST_PG_URL="postgresql+psycopg://postgres@127.0.0.1:$PG_PORT/$PG_DB"
export PATHTUNE_TEST_PG_DIR="$PG_DIR"

pg_stop() {
    as_pg "'$PG_CTL' -D '$PG_DIR/data' -m fast -w stop >/dev/null 2>&1" || true
    rm -rf "$PG_DIR"
}
echo ".ci/postgres.sh: PostgreSQL on 127.0.0.1:$PG_PORT, database $PG_DB ($PG_DIR)" >&2
