#!/bin/sh
# The PostgreSQL server binaries the tests start a private server with (initdb,
# pg_ctl, postgres): found where shardcat.testing.postgres looks, else installed
# from Debian's packages.
set -eu
for dir in "${SHARDCAT_PG_BIN:-}" "$(pg_config --bindir 2>/dev/null || true)" \
           "$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/x)")" \
           /usr/lib/postgresql/*/bin; do
    if [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/postgres" ]; then
        exit 0
    fi
done
echo "PostgreSQL server binaries not found: installing them (apt-get install postgresql)" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends postgresql
