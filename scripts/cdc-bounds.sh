#!/usr/bin/env bash
# What bounds a CDC relay's memory and its slot, measured on the real server (issue 43):
#
#   backlog     N messages of 1 MB (default 10,000: 10 GB of payloads) written while no relay
#               runs, in transactions of 100, then one `outbox relay --mode cdc` drains them.
#               Reports the drain's rate, the relay's CPU per message and its peak resident set
#               (VmHWM), sampled until the slot's confirmed position passes the last commit.
#   route-down  one route whose sink is down (nothing listens on its port) beside a busy one,
#               for MINUTES (default 10) under steady writers (pgbench, 200 tx/s, 1% to the down
#               route). Every 30 s: the slot's confirmed position, WAL held for the slot, the
#               relay's resident set, the parked rows. The down route's messages are parked after
#               `--cdc-park-after`, so the confirmed position keeps moving and the RSS stays flat.
#
# The busy sink is `stdout` into /dev/null: the relay's own work (decode, envelope, confirm) with
# no broker in the way. Each mode uses a scratch schema and slot of its own, dropped at the end.
#
# Usage: scripts/cdc-bounds.sh backlog [N] | route-down [MINUTES]   (env: DATABASE_URL, OUTBOX_BIN)
# Needs a server with wal_level=logical, pgbench, and a release build of `outbox`.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:?usage: scripts/cdc-bounds.sh backlog [N] | route-down [MINUTES]}"
url="${DATABASE_URL:-postgres://root@127.0.0.1:5432/test}"
target="${CARGO_TARGET_DIR:-/var/tmp/outbox-target}"
bin="${OUTBOX_BIN:-$target/release/outbox}"
schema="cdc_bounds_$(head -c4 /dev/urandom | od -An -tx1 | tr -d ' \n')"
slot="outbox_${schema}_relay"
work=$(mktemp -d)
relay_pid=
q() { psql -X -qAt "$url" -c "$1"; }
cleanup() {
  [ -n "$relay_pid" ] && kill "$relay_pid" 2>/dev/null && wait "$relay_pid" 2>/dev/null || true
  q "SELECT pg_drop_replication_slot('$slot') FROM pg_replication_slots WHERE slot_name = '$slot'" >/dev/null 2>&1 || true
  q "DROP PUBLICATION IF EXISTS outbox_$schema" >/dev/null 2>&1 || true
  q "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# Resident set now (VmRSS) and at its peak (VmHWM) of the relay, in MiB.
rss() { awk '/^VmRSS:/ {printf "%d", $2/1024}' "/proc/$relay_pid/status"; }
hwm() { awk '/^VmHWM:/ {printf "%d", $2/1024}' "/proc/$relay_pid/status"; }
# CPU seconds (user + system) the relay has spent.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$relay_pid/stat"; }
confirmed() { q "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '$slot'"; }
now() { date +%s.%N; }

"$bin" migrate --database-url "$url" --schema "$schema" --cdc >/dev/null

case "$mode" in
backlog)
  n="${2:-10000}"
  txns=$(( (n + 99) / 100 ))
  echo "cdc-bounds: writing $n messages of 1 MB in $txns transactions of 100 (no relay running)"
  t0=$(now)
  # 1,000,000 bytes of JSON string: md5 text repeated, so the table's TOAST compresses it (the WAL
  # stays small) while the relay decodes every byte.
  for _ in $(seq 1 "$txns"); do
    q "INSERT INTO $schema.outbox (aggregate_type, aggregate_id, event_type, payload)
       SELECT 'doc', 'd' || (i % 10), 'doc.stored',
              jsonb_build_object('n', i, 'data', repeat(md5(i::text), 31250))
       FROM generate_series(1, 100) AS i"
  done
  end_lsn=$(q "SELECT pg_current_wal_lsn()")
  echo "cdc-bounds: written in $(echo "$(now) - $t0" | bc) s; last commit before $end_lsn"
  t0=$(now)
  "$bin" relay --database-url "$url" --schema "$schema" --mode cdc --sink stdout: \
    >/dev/null 2>"$work/relay.log" &
  relay_pid=$!
  peak=0
  while :; do
    kill -0 "$relay_pid" 2>/dev/null || { echo "cdc-bounds: the relay exited; its log:"; tail -20 "$work/relay.log"; exit 1; }
    c=$(confirmed)
    if [ -n "$c" ] && [ "$(q "SELECT '$c'::pg_lsn >= '$end_lsn'::pg_lsn")" = t ]; then break; fi
    sleep 0.5
  done
  secs=$(echo "$(now) - $t0" | bc)
  peak=$(hwm)
  used=$(cpu)
  echo "cdc-bounds: drained $n messages of 1 MB in ${secs} s: $(echo "$n / $secs" | bc) events/s," \
    "$(echo "scale=0; $used * 1000000 / $n" | bc) us relay CPU per message;" \
    "peak relay RSS ${peak} MiB (bound asked: 128 MiB)"
  [ "$peak" -le 128 ] || { echo "cdc-bounds: peak RSS over 128 MiB"; exit 1; }
  ;;
route-down)
  minutes="${2:-10}"
  # A port nothing listens on: the route's sink is down for the whole run.
  down_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$bin" relay --database-url "$url" --schema "$schema" --mode cdc \
    --route "event_type=down.*; sink=nats://127.0.0.1:$down_port; name=down" \
    --route "sink=stdout:; name=busy" \
    >/dev/null 2>"$work/relay.log" &
  relay_pid=$!
  cat >"$work/busy.sql" <<SQL
\set k random(1, 1000)
INSERT INTO $schema.outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', 'o' || :k, 'order.created', '{"amount": 1}');
SQL
  cat >"$work/down.sql" <<SQL
\set k random(1, 10)
INSERT INTO $schema.outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('pay', 'p' || :k, 'down.created', '{"amount": 1}');
SQL
  secs=$(( minutes * 60 ))
  echo "cdc-bounds: route 'down' to 127.0.0.1:$down_port (nothing listens) beside 'busy' for $minutes min, 200 tx/s"
  pgbench -n "$url" -c 4 -j 1 -R 200 -T "$secs" -f "$work/busy.sql@99" -f "$work/down.sql@1" \
    >"$work/pgbench.log" 2>&1 &
  bench_pid=$!
  printf '%6s  %14s  %12s  %8s  %8s  %7s\n' "t (s)" "confirmed" "held (KiB)" "RSS MiB" "CPU s" "parked"
  start=$(date +%s)
  while kill -0 "$bench_pid" 2>/dev/null; do
    sleep 30
    kill -0 "$relay_pid" 2>/dev/null || { echo "cdc-bounds: the relay exited; its log:"; tail -20 "$work/relay.log"; exit 1; }
    c=$(confirmed)
    held=$(q "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint / 1024 FROM pg_replication_slots WHERE slot_name = '$slot'")
    parked=$(q "SELECT count(*) FROM $schema.outbox_parked")
    printf '%6s  %14s  %12s  %8s  %8s  %7s\n' "$(( $(date +%s) - start ))" "$c" "$held" "$(rss)" "$(cpu)" "$parked"
  done
  wait "$bench_pid" || { echo "cdc-bounds: pgbench failed:"; tail -5 "$work/pgbench.log"; exit 1; }
  written=$(q "SELECT count(*) FROM $schema.outbox")
  echo "cdc-bounds: $written messages written; peak relay RSS $(hwm) MiB; relay CPU $(cpu) s" \
    "($(echo "scale=0; $(cpu) * 1000000 / $written" | bc) us per message written)"
  ;;
*) echo "cdc-bounds: unknown mode $mode (backlog or route-down)" >&2; exit 2 ;;
esac
