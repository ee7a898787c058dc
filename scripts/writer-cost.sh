#!/usr/bin/env bash
# Where a raw-SQL writer's cost goes: the plainest insert (four columns, no id) through pgbench
# into the naive table and into the outbox, alternated in one run, and into variants of the
# outbox that each take one thing away, so the gap to the naive table is split into its parts:
#
#   naive          the seed articles' table (gen_random_uuid() default, status column)
#   outbox         the outbox as `outbox migrate` makes it
#   outbox+id      the same, the id passed (gen_random_uuid()): what the SQL UUIDv7 default costs
#   flat           a plain table with the outbox's columns, defaults and indexes: what routing
#                  into the txid-ranged segment costs
#   flat-nohash    the same without the generated partition column: what hashing the key costs
#
# Usage: scripts/writer-cost.sh [DATABASE_URL] [SECONDS per round] [ROUNDS] [CLIENTS] [SHAPE]
# SHAPE `insert` (the default): one row per transaction, nothing else. SHAPE `update`: each
# transaction is a business UPDATE of a random row of a 100,000-row pgbench-like accounts table,
# then the insert (BEGIN; UPDATE; INSERT; END), the shape of `outbox bench --mode writers` and of
# the writers' acceptance line; the insert's costs are then a share of a whole transaction.
# Needs pgbench (Debian's postgresql-contrib or postgresql client packages) and an `outbox`
# binary (OUTBOX_BIN, default: the release build in CARGO_TARGET_DIR).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$(dirname "$0")/.."
url="${1:-postgres://root@127.0.0.1:5432/test}"
secs="${2:-10}"
rounds="${3:-3}"
clients="${4:-16}"
shape="${5:-insert}"
case "$shape" in insert|update) ;; *) echo "writer-cost: SHAPE is insert or update, not $shape" >&2; exit 2;; esac
target="${CARGO_TARGET_DIR:-/var/tmp/outbox-target}"
bin="${OUTBOX_BIN:-$target/release/outbox}"
schema="writer_cost_$(head -c4 /dev/urandom | od -An -tx1 | tr -d ' \n')"
work=$(mktemp -d)
cleanup() {
  psql -q "$url" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

"$bin" migrate --database-url "$url" --schema "$schema" >/dev/null
# The naive table exactly as `outbox bench` makes it.
sed "s/{schema}/$schema/g" crates/outbox-bench/queries/naive_outbox.sql | psql -q -v ON_ERROR_STOP=1 "$url"
psql -q -v ON_ERROR_STOP=1 "$url" <<SQL
CREATE SEQUENCE $schema.flat_seq CACHE 1;
CREATE TABLE $schema.flat (
    id uuid NOT NULL DEFAULT $schema.outbox_uuid_v7(),
    aggregate_type text NOT NULL, aggregate_id text NOT NULL, event_type text NOT NULL,
    payload jsonb NOT NULL, headers jsonb NOT NULL DEFAULT '{}'::jsonb, topic text,
    created_at timestamptz NOT NULL DEFAULT now(),
    txid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    seq bigint NOT NULL DEFAULT nextval('$schema.flat_seq'),
    partition smallint NOT NULL
        GENERATED ALWAYS AS (((hashtext(aggregate_id) & 2147483647) % 64)::smallint) STORED,
    CHECK (created_at BETWEEN '1900-01-01' AND '9999-12-31'));
CREATE INDEX ON $schema.flat (partition, seq) INCLUDE (txid);
CREATE INDEX ON $schema.flat (partition, txid, seq);
CREATE TABLE $schema.flat_nohash (LIKE $schema.flat INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE $schema.flat_nohash ALTER COLUMN partition SET DEFAULT 0;
CREATE INDEX ON $schema.flat_nohash (partition, seq) INCLUDE (txid);
CREATE INDEX ON $schema.flat_nohash (partition, txid, seq);
SQL

if [ "$shape" = update ]; then
  psql -q -v ON_ERROR_STOP=1 "$url" <<SQL
CREATE TABLE $schema.accounts (id integer PRIMARY KEY, balance bigint NOT NULL DEFAULT 0,
                               filler char(84) NOT NULL DEFAULT '');
INSERT INTO $schema.accounts (id) SELECT generate_series(1, 100000);
VACUUM ANALYZE $schema.accounts;
SQL
fi

payload='{"order_id": 42, "amount_cents": 1999, "currency": "EUR", "lines": [1, 2, 3]}'
insert() { # table, extra column, extra value
  printf '\\set k random(1, 1000)\n\\set a random(1, 100000)\n'
  if [ "$shape" = update ]; then
    printf 'BEGIN;\nUPDATE %s.accounts SET balance = balance + 1 WHERE id = :a;\n' "$schema"
  fi
  printf 'INSERT INTO %s.%s (%saggregate_type, aggregate_id, event_type, payload) VALUES (%s'"'"'order'"'"', '"'"'order-'"'"' || :k, '"'"'order.placed'"'"', '"'"'%s'"'"');\n' \
    "$schema" "$1" "$2" "$3" "$payload"
  if [ "$shape" = update ]; then
    printf 'END;\n'
  fi
}
insert naive_outbox "" "" > "$work/naive.sql"
insert outbox "" "" > "$work/outbox.sql"
insert outbox "id, " "gen_random_uuid(), " > "$work/outbox+id.sql"
insert flat "" "" > "$work/flat.sql"
insert flat_nohash "" "" > "$work/flat-nohash.sql"
variants=(naive outbox outbox+id flat flat-nohash)

echo "writer cost: $clients clients, ${secs} s per run, $rounds rounds, shape $shape, variants alternated; schema $schema"
for r in $(seq 1 "$rounds"); do
  for v in "${variants[@]}"; do
    tps=$(pgbench -n -c "$clients" -j 2 -T "$secs" -f "$work/$v.sql" "$url" 2>/dev/null |
          sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    echo "$v $tps" >> "$work/results"
    printf '  round %s  %-12s %10.0f tps\n' "$r" "$v" "$tps"
  done
done
python3 "$here/median_ratios.py" "$work/results"
