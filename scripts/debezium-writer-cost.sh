#!/usr/bin/env bash
# Writer cost of the Debezium-compatible table, side by side with the outbox's own table and the
# naive table, in one run of pgbench (16 clients): what a business transaction pays to write one
# event. Each transaction is `UPDATE accounts` on a random one of 10,000 rows plus one INSERT:
#   own       the SQL contract's INSERT into the outbox table
#   debezium  Debezium's documented INSERT into its table, adopted (`outbox migrate
#             --adopt-debezium`: an AFTER INSERT trigger copies the row into the outbox)
#   dbz-bare  the same INSERT into the same table without the trigger: what it costs under
#             Debezium today
#   naive     the seed articles' naive table (crates/outbox-bench/queries/naive_outbox.sql)
# The variants alternate over ROUNDS rounds (a CHECKPOINT before each); the figure is the median
# TPS per variant. Usage: scripts/debezium-writer-cost.sh [DATABASE_URL] (DURATION and ROUNDS
# from the environment, default 10 s and 3).
set -euo pipefail
cd "$(dirname "$0")/.."
url=${1:-${OUTBOX_TEST_DATABASE_URL:-postgres://root@127.0.0.1:5432/test}}
duration=${DURATION:-10}
rounds=${ROUNDS:-3}
clients=16
bin=${OUTBOX_BIN:-${CARGO_TARGET_DIR:-target}/debug/outbox}
s="wcost_$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"
work=$(mktemp -d)
cleanup() { psql -q "$url" -c "DROP SCHEMA IF EXISTS ${s} CASCADE; DROP SCHEMA IF EXISTS ${s}_app CASCADE" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

"$bin" migrate --database-url "$url" --schema "$s" >/dev/null
psql -q -v ON_ERROR_STOP=1 "$url" <<SQL
CREATE SCHEMA ${s}_app;
CREATE TABLE ${s}_app.accounts (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
INSERT INTO ${s}_app.accounts (id) SELECT generate_series(1, 10000);
-- Debezium's documented outbox table (its docs' example, plus the optional tracing column).
CREATE TABLE ${s}_app.outbox (
    id uuid NOT NULL PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    payload jsonb,
    tracingspancontext varchar(256)
);
CREATE TABLE ${s}_app.outbox_bare (LIKE ${s}_app.outbox INCLUDING ALL);
$(sed "s/{schema}/${s}_app/g" crates/outbox-bench/queries/naive_outbox.sql)
VACUUM ANALYZE ${s}_app.accounts;
SQL
"$bin" migrate --database-url "$url" --schema "$s" --adopt-debezium "${s}_app.outbox" >/dev/null

head='\set a random(1, 10000)
\set k random(1, 1000)
BEGIN;
UPDATE '"${s}"'_app.accounts SET balance = balance + 1 WHERE id = :a;'
tail='COMMIT;'
payload="'{\"amount\": 12, \"currency\": \"EUR\"}'"
printf '%s\nINSERT INTO %s.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES (%s, %s, %s, %s::jsonb);\n%s\n' \
  "$head" "$s" "'order'" "'o-' || :k" "'OrderCreated'" "$payload" "$tail" > "$work/own.sql"
for t in outbox outbox_bare; do
  printf '%s\nINSERT INTO %s_app.%s (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), %s, %s, %s, %s::jsonb);\n%s\n' \
    "$head" "$s" "$t" "'order'" "'o-' || :k" "'OrderCreated'" "$payload" "$tail" > "$work/$t.sql"
done
cp "$work/outbox.sql" "$work/debezium.sql"
cp "$work/outbox_bare.sql" "$work/dbz-bare.sql"
printf '%s\nINSERT INTO %s_app.naive_outbox (aggregate_type, aggregate_id, event_type, payload) VALUES (%s, %s, %s, %s::jsonb);\n%s\n' \
  "$head" "$s" "'order'" "'o-' || :k" "'OrderCreated'" "$payload" "$tail" > "$work/naive.sql"

variants=(own debezium dbz-bare naive)
for r in $(seq 1 "$rounds"); do
  for i in "${!variants[@]}"; do
    v=${variants[$(( (i + r) % ${#variants[@]} ))]}
    psql -q "$url" -c CHECKPOINT >/dev/null 2>&1 || true
    tps=$(pgbench -n -M prepared -c "$clients" -j 2 -T "$duration" -f "$work/$v.sql" "$url" 2>/dev/null \
      | awk '/^tps/ {print $3; exit}')
    echo "$v $tps" >> "$work/results"
  done
done
# The copy must have kept up: every adopted INSERT is in the outbox.
copied=$(psql -Atq "$url" -c "SELECT (SELECT count(*) FROM ${s}_app.outbox) - (SELECT count(*) FROM ${s}.outbox WHERE aggregate_type = 'order' AND event_type = 'OrderCreated' AND id IN (SELECT id FROM ${s}_app.outbox))")
echo "writer cost, pgbench $clients clients, ${duration}s x $rounds rounds, median TPS (UPDATE accounts + one event):"
for v in "${variants[@]}"; do
  med=$(awk -v v="$v" '$1 == v {print $2}' "$work/results" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  all=$(awk -v v="$v" '$1 == v {printf "%s ", $2}' "$work/results")
  echo "  $v: $med  (rounds: $all)"
done
echo "adopted rows missing from the outbox: $copied"
[ "$copied" = 0 ]
