#!/usr/bin/env bash
# The Debezium drop-in end to end, as a team switching would run it (docs/migrating-from-debezium.md):
# the example application written for Debezium's Outbox Event Router (examples/debezium: Python on
# PostgreSQL, PHP on MariaDB/MySQL), its table and INSERTs unchanged, two instances of it writing
# the same five accounts at once; the table adopted by `outbox migrate --adopt-debezium`; one
# `outbox relay` with `envelope=debezium` to Kafka; and a consumer written to the Event Router's
# documented output (examples/debezium/event_router_consumer.py: topic outbox.event.account, key =
# aggregateid, `id` header, payload value), which must read every committed event, no rolled-back
# one, each account's in commit order. Exits non-zero on any failure.
#
# Environment: DATABASE_KIND (postgres, or mariadb/mysql), DATABASE_URL (the server; a scratch
# schema or database is made and dropped), KAFKA_URL (default kafka://127.0.0.1:9092),
# TRANSACTIONS per application instance (default 150), EXAMPLES_VENV, OUTBOX_BIN (default: built
# with cargo).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
say() { echo "debezium-kafka: $* ($(( $(date +%s) - started )) s)"; }

DATABASE_KIND=${DATABASE_KIND:-postgres}
case "$DATABASE_KIND" in
  postgres) mysql='' DATABASE_URL=${DATABASE_URL:-postgres://root@127.0.0.1:5432/test} ;;
  mysql | mariadb) mysql=1 DATABASE_URL=${DATABASE_URL:-mysql://root@127.0.0.1:3306/test} ;;
  *) echo "debezium-kafka: DATABASE_KIND must be postgres, mariadb or mysql" >&2; exit 2 ;;
esac
KAFKA_URL=${KAFKA_URL:-kafka://127.0.0.1:9092}
bootstrap=${KAFKA_URL#kafka://}
export TRANSACTIONS=${TRANSACTIONS:-150}
venv=${EXAMPLES_VENV:-/var/tmp/outbox-examples-venv}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/outbox-target}"
# The Event Router's default topic for the application's aggregate type `account`.
topic=outbox.event.account

if [ -n "$mysql" ]; then
  { command -v php >/dev/null && php -r 'exit(extension_loaded("pdo_mysql") ? 0 : 1);'; } || {
    say "installing php-cli php-mysql"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq php-cli php-mysql >/dev/null
  }
fi
# shellcheck source=scripts/examples-common.sh
. scripts/examples-common.sh

suffix=$(head -c 4 /dev/urandom | od -An -tx1 | tr -d ' \n')
schema=debezium_$suffix
run=$(mktemp -d /var/tmp/outbox-debezium-kafka.XXXXXX)
relay_pid=''
cleanup() {
  local rc=$?
  set +e
  if [ -n "$relay_pid" ]; then kill -TERM "$relay_pid" 2>/dev/null; wait "$relay_pid"; fi
  if [ -n "$mysql" ]; then
    "$python" scripts/examples_check.py mysql-drop --database-url "$DATABASE_URL" --schema "$schema"
  else
    psql -q "$DATABASE_URL" -c "SET client_min_messages = warning; DROP SCHEMA IF EXISTS $schema CASCADE"
  fi
  if [ "$rc" -eq 0 ]; then rm -rf "$run"; else echo "debezium-kafka: FAILED; logs in $run" >&2; fi
  exit "$rc"
}
trap cleanup EXIT

say "$DATABASE_KIND, scratch $schema, topic $topic on $bootstrap"
"$OUTBOX_BIN" migrate --database-url "$DATABASE_URL" --schema "$schema" >/dev/null
if [ -n "$mysql" ]; then
  for f in examples/schema-mysql.sql examples/debezium/schema-mysql.sql; do
    "$python" scripts/examples_check.py mysql-script --database-url "$DATABASE_URL" --schema "$schema" --file $f
  done
  producer_url="${DATABASE_URL%/*}/$schema"
else
  for f in examples/schema.sql examples/debezium/schema.sql; do
    PGOPTIONS="-c search_path=$schema" psql -q -v ON_ERROR_STOP=1 "$DATABASE_URL" -f $f
  done
  producer_url=$DATABASE_URL
fi
"$OUTBOX_BIN" migrate --database-url "$DATABASE_URL" --schema "$schema" \
  --adopt-debezium "$schema.debezium_outbox" >/dev/null

# The Event Router's topic is fixed by the aggregate type, so a run starts it empty: what an
# earlier run left would read as events no application committed.
"$python" - "$bootstrap" "$topic" <<'PY'
import sys, time
from confluent_kafka.admin import AdminClient, NewTopic
admin = AdminClient({"bootstrap.servers": sys.argv[1]})
topic = sys.argv[2]
if topic in admin.list_topics(timeout=10).topics:
    admin.delete_topics([topic])[topic].result()
    time.sleep(1)
admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1)])[topic].result()
PY

"$OUTBOX_BIN" relay --database-url "$DATABASE_URL" --schema "$schema" \
  --route "sink=$KAFKA_URL; envelope=debezium" >"$run/relay.log" 2>&1 &
relay_pid=$!

say "two instances of the Debezium application, $TRANSACTIONS transactions each"
pids=()
for i in 1 2; do
  (
    export DATABASE_URL=$producer_url OUTBOX_SCHEMA=$schema
    if [ -n "$mysql" ]; then exec php examples/debezium/producer_mysql.php
    else exec "$python" examples/debezium/producer.py; fi
  ) >"$run/app$i.out" 2>"$run/app$i.err" &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "debezium-kafka: application $((i + 1)) failed:" >&2; tail -n 20 "$run/app$((i + 1)).err" >&2; exit 1; }
done

say "the Event Router consumer reads $topic"
"$python" examples/debezium/event_router_consumer.py --bootstrap "$bootstrap" --topic "$topic" \
  --records "$run" || { echo "debezium-kafka: relay log tail:" >&2; tail -n 20 "$run/relay.log" >&2; exit 1; }
say "done"
