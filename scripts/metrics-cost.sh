#!/usr/bin/env bash
# What metrics cost, measured side by side in one run (docs/operations.md, "What a scrape
# costs"): the drain rate of a backlog with /metrics scraped every second against none
# (alternating runs, same backlog, same relay settings; the drain watched through the positions'
# running totals, the relay's CPU read from /proc), and the time of one scrape with a
# million rows pending (the relay's broker down, so they stay pending).
#
#   scripts/metrics-cost.sh [ROWS] [RUNS]      # default 200000 rows, 2 runs of each
#
# Needs PostgreSQL (OUTBOX_TEST_DATABASE_URL, default postgres://root@127.0.0.1:5432/test),
# psql, nats-server on the PATH for the million-row scrape, curl, and a release build
# (cargo build --release -p outbox-cli). Leaves nothing behind.
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${1:-200000}
RUNS=${2:-2}
DB=${OUTBOX_TEST_DATABASE_URL:-postgres://root@127.0.0.1:5432/test}
BIN=${OUTBOX_BIN:-${CARGO_TARGET_DIR:-target}/release/outbox}
PSQL=(psql -q -X -v ON_ERROR_STOP=1 "$DB")
export OUTBOX_LOG=warn
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

fill() { # schema rows
    "$BIN" migrate --database-url "$DB" --schema "$1" >/dev/null 2>&1 || true
    "${PSQL[@]}" -c "INSERT INTO $1.outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'k' || (g % 1000), 'placed', jsonb_build_object('n', g, 'pad', repeat('x', 200))
        FROM generate_series(1, $2) AS g"
}

pending() { "$BIN" status --database-url "$DB" --schema "$1" --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pending"])'; }

# Published so far: the positions' running totals (64 index probes; reads no message), so
# watching the drain five times a second costs the database next to nothing.
published() {
    "${PSQL[@]}" -At -c "SELECT coalesce(sum(published), 0) FROM (SELECT DISTINCT ON (partition)
        published FROM $1.outbox_positions ORDER BY partition, id DESC) AS p"
}

# CPU seconds (user + system) the process has used so far.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }
# CPU seconds every PostgreSQL process has used so far (the relay's sessions live through a
# drain; the short psql sessions that watch it are not counted).
pg_cpu() {
    local total=0 p
    for p in $(pgrep -x postgres); do total=$(awk -v t="$total" -v hz="$(getconf CLK_TCK)" '{ print t + ($14 + $15) / hz }' "/proc/$p/stat" 2>/dev/null || echo "$total"); done
    echo "$total"
}

drain() { # schema rows scrape(0|1) -> "seconds relay-cpu-seconds postgres-cpu-seconds"
    local schema=$1 rows=$2 scrape=$3 port args=() t0 t1 used scraper= pg0 pg1
    pg0=$(pg_cpu)
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    [ "$scrape" = 1 ] && args=(--metrics-addr "127.0.0.1:$port")
    t0=$(date +%s.%N)
    "$BIN" relay --database-url "$DB" --schema "$schema" --sink stdout: "${args[@]}" >/dev/null &
    local relay=$!
    pids+=("$relay")
    if [ "$scrape" = 1 ]; then
        (while sleep 1; do curl -s -o /dev/null "127.0.0.1:$port/metrics" || true; done) &
        scraper=$!; pids+=("$scraper")
    fi
    while [ "$(published "$schema")" -lt "$rows" ]; do sleep 0.2; done
    t1=$(date +%s.%N)
    used=$(cpu "$relay")
    pg1=$(pg_cpu)
    [ -n "$scraper" ] && { kill "$scraper"; wait "$scraper" 2>/dev/null || true; }
    kill "$relay"; wait "$relay" 2>/dev/null || true
    python3 -c "print(f'{$t1 - $t0:.2f} {$used:.2f} {$pg1 - $pg0:.2f}')"
}

# The stdout sink (to /dev/null): the cheapest broker there is, so the relay's own work (claim,
# record, metrics) is the whole cost and any overhead of the metrics shows at its largest.
echo "== drain of $ROWS rows through the stdout sink, alternating runs without and with a scrape a second"
for i in $(seq 1 "$RUNS"); do
    for scrape in 0 1; do
        s="mcost_${i}_${scrape}_$$"
        fill "$s" "$ROWS"
        read -r secs relay_cpu pg < <(drain "$s" "$ROWS" "$scrape")
        echo "run $i scrape=$scrape: $secs s, $(python3 -c "print(round($ROWS / $secs))") rows/s, CPU per row: relay $(python3 -c "print(round($relay_cpu / $ROWS * 1e6, 1))") us, PostgreSQL $(python3 -c "print(round($pg / $ROWS * 1e6, 1))") us"
        "${PSQL[@]}" -c "DROP SCHEMA $s CASCADE"
    done
done

echo "== one scrape with 1,000,000 rows pending (the relay's broker stopped: they stay pending)"
s="mcost_big_$$"
"$BIN" migrate --database-url "$DB" --schema "$s" >/dev/null
nport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
nats-server -a 127.0.0.1 -p "$nport" >/dev/null 2>&1 &
nats=$!; pids+=("$nats")
sleep 1
"$BIN" relay --database-url "$DB" --schema "$s" --sink "nats://127.0.0.1:$nport" \
    --metrics-addr "127.0.0.1:$mport" --unready-after 1s >/dev/null 2>&1 &
relay=$!; pids+=("$relay")
until curl -sf -o /dev/null "127.0.0.1:$mport/readyz"; do sleep 0.2; done
kill "$nats"; wait "$nats" 2>/dev/null || true
fill "$s" 1000000
until [ "$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$mport/readyz")" = 503 ]; do sleep 0.5; done
"${PSQL[@]}" -c "VACUUM ANALYZE $s.outbox" >/dev/null
echo "pending by \`outbox status\`: $(pending "$s")"
times=()
for i in $(seq 1 20); do
    times+=("$(curl -s -o /tmp/mcost-scrape.$$ -w '%{time_total}' "127.0.0.1:$mport/metrics")")
    sleep 0.5
done
grep -E '^outbox_(pending_messages|pending_capped|oldest_pending_age_seconds|store_query_duration_seconds|published_total)' /tmp/mcost-scrape.$$ || true
printf '%s\n' "${times[@]}" | sort -n | python3 -c '
import sys
t = [float(x) * 1000 for x in sys.stdin]
print(f"scrape (HTTP, store query and render), ms: min {t[0]:.1f}, median {t[len(t)//2]:.1f}, max {t[-1]:.1f} over {len(t)} scrapes")'
kill "$relay"; wait "$relay" 2>/dev/null || true
rm -f /tmp/mcost-scrape.$$
"${PSQL[@]}" -c "DROP SCHEMA $s CASCADE"
