#!/usr/bin/env bash
# Starts the real services the tests need (PostgreSQL, NATS with JetStream, Redis) when they are not
# already answering, then waits until they do. Idempotent; safe on a machine where they run.
set -euo pipefail

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  local name=$1 port=$2
  for _ in $(seq 1 60); do
    if up "$port"; then echo "services: $name is up on 127.0.0.1:$port"; return 0; fi
    sleep 1
  done
  echo "services: $name did not come up on 127.0.0.1:$port" >&2
  return 1
}

if ! up 5432; then
  echo "services: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
fi
if ! up 4222; then
  echo "services: starting NATS with JetStream"
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server
fi
if ! up 6379; then
  echo "services: starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no
fi
wait_port PostgreSQL 5432
wait_port NATS 4222
wait_port Redis 6379
