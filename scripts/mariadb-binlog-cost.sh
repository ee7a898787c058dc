#!/usr/bin/env bash
# What the binlog costs the MySQL engine's writers (issue 24): scripts/mariadb-writer-cost.sh
# run twice against one private MariaDB server, first with the binlog off, then restarted with
# it on (row format, sync_binlog = 1, as MySQL 8.0 ships), every other setting the same.
# With the binlog on, a transaction keeps its row locks through the binlog's write and sync,
# so the partition counter row (docs/engine-mysql.md) is held longer; this measures by how much.
#
# Usage: [COST=writer|trigger] [BINLOG="off on"] scripts/mariadb-binlog-cost.sh [TRANSACTIONS per client] [ROUNDS]
# COST=trigger runs scripts/mariadb-trigger-cost.sh instead (its variants, `cond` among them:
# the trigger that keeps positions only for rows the binlog will not carry).
# Needs mariadb-install-db and mariadbd (Debian's mariadb-server) beside the writer-cost
# script's needs. The server listens on 127.0.0.1:$PORT (default 3308) with its data in a
# temporary directory, and is stopped and removed at the end. The machine's own server on 3306
# is not touched.
set -euo pipefail
per_client="${1:-1000}"
rounds="${2:-3}"
port="${PORT:-3308}"
cost_script="mariadb-${COST:-writer}-cost.sh"
read -r -a binlog_states <<<"${BINLOG:-off on}"
here="$(cd "$(dirname "$0")" && pwd)"
dir="$(mktemp -d /var/tmp/outbox-binlog-cost.XXXXXX)"
pid=""
stop() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
  fi
}
trap 'stop; rm -rf "$dir"' EXIT

mariadb-install-db --no-defaults --datadir="$dir/data" --user="$(id -un)" \
  --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1

start() {
  mariadbd --no-defaults --datadir="$dir/data" --user="$(id -un)" --bind-address=127.0.0.1 \
    --port="$port" --socket="$dir/mysqld.sock" --pid-file="$dir/mysqld.pid" \
    --innodb-buffer-pool-size=512M --innodb-flush-log-at-trx-commit=1 "$@" \
    >>"$dir/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    if mariadb -h 127.0.0.1 -P "$port" -u root -e 'SELECT 1' >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.2
  done
  echo "the private MariaDB server did not start; its log:" >&2
  tail -20 "$dir/server.log" >&2
  exit 1
}

for binlog in "${binlog_states[@]}"; do
  if [ "$binlog" = on ]; then
    start --log-bin="$dir/binlog" --binlog-format=ROW --sync-binlog=1 --server-id=1
  else
    start --skip-log-bin
  fi
  echo "== binlog $binlog: $(mariadb -h 127.0.0.1 -P "$port" -u root -N -e \
    "SELECT CONCAT('log_bin=', @@log_bin, ' sync_binlog=', @@sync_binlog, ' binlog_format=', @@binlog_format)")"
  PORT="$port" "$here/$cost_script" "$per_client" "$rounds"
  stop
done
