#!/usr/bin/env bash
# The producer examples of examples/ (TypeScript, Java, PHP, Python, and a Python application
# written for Debezium's outbox table, adopted), tested: all of them write
# outbox rows concurrently, over the same keys, into one scratch schema, while `outbox relay`
# publishes them to a scratch JetStream stream; scripts/examples_check.py then reads the stream
# with its own consumer and checks that every committed row arrived with its headers, that no
# rolled-back row did, and that each key's events arrived in commit order.
#
# DATABASE_KIND=mariadb (or mysql) runs the seeds' two languages of MySQL shops, PHP (PDO) and
# Java (JDBC, Debian's MariaDB Connector/J), the same way against MariaDB: a scratch database
# migrated by `outbox migrate --schema`, examples/schema-mysql.sql's tables, the same checks.
#
# Installs what is missing first (idempotent): Debian's php-cli, php-pgsql (php-mysql) and
# libpostgresql-jdbc-java (libmariadb-java), the npm packages of examples/typescript, and a
# Python venv with psycopg, PyMySQL and nats-py. Exits non-zero on any failure.
#
# Environment: DATABASE_KIND (postgres, or mariadb/mysql), DATABASE_URL (default
# postgres://root@127.0.0.1:5432/test, or mysql://root@127.0.0.1:3306/test: the server, whose
# scratch database the run creates and drops), NATS_URL (default nats://127.0.0.1:4222),
# TRANSACTIONS per producer (default 200), EXAMPLES_VENV (default
# /var/tmp/outbox-examples-venv), OUTBOX_BIN (default: built with cargo).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
say() { echo "examples: $* ($(( $(date +%s) - started )) s)"; }

DATABASE_KIND=${DATABASE_KIND:-postgres}
case "$DATABASE_KIND" in
  postgres)
    mysql=''
    DATABASE_URL=${DATABASE_URL:-postgres://root@127.0.0.1:5432/test}
    # `debezium`: an application written for Debezium's Outbox Event Router (its table and
    # INSERTs, examples/debezium), adopted by `outbox migrate --adopt-debezium`.
    langs=(typescript java php python debezium) ;;
  mysql | mariadb)
    mysql=1
    DATABASE_URL=${DATABASE_URL:-mysql://root@127.0.0.1:3306/test}
    langs=(java php debezium) ;;
  *) echo "examples: DATABASE_KIND must be postgres, mariadb or mysql" >&2; exit 2 ;;
esac
NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
TRANSACTIONS=${TRANSACTIONS:-200}
venv=${EXAMPLES_VENV:-/var/tmp/outbox-examples-venv}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/outbox-target}"

# --- toolchains, installed only when missing --------------------------------------------------
apt_missing=()
command -v php >/dev/null || apt_missing+=(php-cli)
command -v javac >/dev/null || apt_missing+=(openjdk-17-jdk-headless)
if [ -n "$mysql" ]; then
  { command -v php >/dev/null && php -r 'exit(extension_loaded("pdo_mysql") ? 0 : 1);'; } || apt_missing+=(php-mysql)
  jdbc_jar=/usr/share/java/mariadb-java-client.jar
  [ -f $jdbc_jar ] || apt_missing+=(libmariadb-java)
else
  { command -v php >/dev/null && php -r 'exit(extension_loaded("pdo_pgsql") ? 0 : 1);'; } || apt_missing+=(php-pgsql)
  jdbc_jar=/usr/share/java/postgresql.jar
  [ -f $jdbc_jar ] || apt_missing+=(libpostgresql-jdbc-java)
  command -v npm >/dev/null || apt_missing+=(nodejs npm)
  command -v psql >/dev/null || apt_missing+=(postgresql-client)
fi
if [ ${#apt_missing[@]} -gt 0 ]; then
  say "installing ${apt_missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_missing[@]}" >/dev/null
fi

ts=examples/typescript
if [ -z "$mysql" ] && { [ ! -d $ts/node_modules ] || [ $ts/package-lock.json -nt $ts/node_modules/.package-lock.json ]; }; then
  say "npm ci in $ts"
  (cd $ts && npm ci --no-audit --no-fund --loglevel=error)
fi

# shellcheck source=scripts/examples-common.sh
. scripts/examples-common.sh

# --- one scratch schema, stream and subject prefix per run ----------------------------------------
suffix=$(head -c 4 /dev/urandom | od -An -tx1 | tr -d ' \n')
schema=examples_$suffix
stream=EXAMPLES_$suffix
prefix=examples_$suffix
run=$(mktemp -d /var/tmp/outbox-examples.XXXXXX)
relay_pid='' gate_pid='' stream_added=''
cleanup() {
  local rc=$?
  set +e
  [ -n "$gate_pid" ] && kill "$gate_pid" 2>/dev/null
  if [ -n "$relay_pid" ]; then kill -TERM "$relay_pid" 2>/dev/null; wait "$relay_pid"; fi
  for _ in 1 2 3 4 5; do  # retried: other tests on this machine restart the database
    if [ -n "$mysql" ]; then
      "$python" scripts/examples_check.py mysql-drop --database-url "$DATABASE_URL" --schema "$schema" 2>/dev/null && break
    else
      psql -q "$DATABASE_URL" -c "DROP SCHEMA IF EXISTS $schema CASCADE" 2>/dev/null && break
    fi
    sleep 2
  done
  [ -n "$stream_added" ] && "$python" scripts/examples_check.py --nats "$NATS_URL" stream-delete --stream "$stream" >/dev/null
  if [ "$rc" -eq 0 ]; then rm -rf "$run"; else echo "examples: FAILED; logs in $run" >&2; fi
  exit "$rc"
}
trap cleanup EXIT

say "schema $schema, stream $stream on $prefix.>"
"$OUTBOX_BIN" migrate --database-url "$DATABASE_URL" --schema "$schema" >/dev/null
if [ -n "$mysql" ]; then
  "$python" scripts/examples_check.py mysql-script --database-url "$DATABASE_URL" --schema "$schema" \
    --file examples/schema-mysql.sql
  "$python" scripts/examples_check.py mysql-script --database-url "$DATABASE_URL" --schema "$schema" \
    --file examples/debezium/schema-mysql.sql
  "$OUTBOX_BIN" migrate --database-url "$DATABASE_URL" --schema "$schema" \
    --adopt-debezium "$schema.debezium_outbox" >/dev/null
  # The producers' URL names the scratch database, which holds the outbox and the ledger.
  producer_url="${DATABASE_URL%/*}/$schema"
else
  PGOPTIONS="-c search_path=$schema" psql -q -v ON_ERROR_STOP=1 "$DATABASE_URL" -f examples/schema.sql
  PGOPTIONS="-c search_path=$schema" psql -q -v ON_ERROR_STOP=1 "$DATABASE_URL" -f examples/debezium/schema.sql
  "$OUTBOX_BIN" migrate --database-url "$DATABASE_URL" --schema "$schema" \
    --adopt-debezium "$schema.debezium_outbox" >/dev/null
  producer_url=$DATABASE_URL
fi
"$python" scripts/examples_check.py --nats "$NATS_URL" stream-add --stream "$stream" --prefix "$prefix"
stream_added=1

# Build before the clock starts: tsc type-checks the TypeScript example; javac compiles the Java.
[ -n "$mysql" ] || (cd $ts && npx tsc -p .)
mkdir -p "$run/java"
javac -d "$run/java" examples/java/Producer.java

"$OUTBOX_BIN" relay --database-url "$DATABASE_URL" --schema "$schema" --sink "$NATS_URL" \
  --destination "$prefix.{event_type}" >"$run/relay.log" 2>&1 &
relay_pid=$!

# The gate holds the business table until every producer waits on it: all four languages then
# start on the same key at the same moment, however long each takes to start.
"$python" scripts/examples_check.py gate --database-url "$DATABASE_URL" --schema "$schema" \
  --producers ${#langs[@]} --ready "$run/gate.ready" >"$run/gate.log" 2>&1 &
gate_pid=$!
for _ in $(seq 1 100); do [ -f "$run/gate.ready" ] && break; sleep 0.1; done
[ -f "$run/gate.ready" ] || { echo "examples: the gate did not lock the ledger" >&2; cat "$run/gate.log" >&2; exit 1; }

export OUTBOX_SCHEMA=$schema TRANSACTIONS
say "running the ${#langs[@]} producers (${langs[*]}), $TRANSACTIONS transactions each"
pids=()
for lang in "${langs[@]}"; do
  (
    export DATABASE_URL=$producer_url
    case $lang in
      typescript) cd $ts && exec node dist/producer.js ;;
      java) exec java -cp "$jdbc_jar:$run/java" Producer ;;
      php) exec php examples/php/producer.php ;;
      python) exec "$python" examples/python/producer.py ;;
      debezium)
        if [ -n "$mysql" ]; then exec php examples/debezium/producer_mysql.php
        else exec "$python" examples/debezium/producer.py; fi ;;
    esac
  ) >"$run/$lang.out" 2>"$run/$lang.err" &
  pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
  lang=${langs[$i]}
  if ! wait "${pids[$i]}"; then
    failed=1
    echo "examples: the $lang producer failed:" >&2
    tail -n 20 "$run/$lang.err" >&2
  fi
done
gate_rc=0
wait "$gate_pid" || gate_rc=$?
gate_pid=''
cat "$run/gate.log"
[ "$failed" -eq 0 ] && [ "$gate_rc" -eq 0 ] || exit 1

say "checking the stream"
"$python" scripts/examples_check.py --nats "$NATS_URL" check --database-url "$DATABASE_URL" \
  --schema "$schema" --stream "$stream" --prefix "$prefix" --records "$run" \
  --languages ${#langs[@]} || {
  echo "examples: relay log tail:" >&2; tail -n 20 "$run/relay.log" >&2; exit 1; }
say "done"
