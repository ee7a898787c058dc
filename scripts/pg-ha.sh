#!/usr/bin/env bash
# A PostgreSQL primary and a synchronous streaming standby on this machine, for the failover
# tests and `outbox verify --faults failover`: node a on 127.0.0.1:5440 and node b on
# 127.0.0.1:5441, in /var/lib/outbox-pg-ha/{a,b}, run by the postgres user with the cluster's
# own binaries (trust on loopback, as the machine's main cluster). Which node is the primary
# changes with every failover; each names the other as its synchronous standby
# (`synchronous_standby_names`), so a commit on the primary waits until the standby has it.
#
# Usage: scripts/pg-ha.sh up            make both nodes when missing, start them, wait (idempotent)
#        scripts/pg-ha.sh failover      stop the primary at once (no shutdown checkpoint), promote
#                                       the standby, rebuild the old primary as its standby
#        scripts/pg-ha.sh primary       print the primary's port
#        scripts/pg-ha.sh standby       print the standby's port
#        scripts/pg-ha.sh stop-standby | start-standby
#        scripts/pg-ha.sh url           print the multi-host URL of database `test`
set -euo pipefail

base=/var/lib/outbox-pg-ha
version=$(ls /etc/postgresql 2>/dev/null | head -n1)
bin=/usr/lib/postgresql/${version:-15}/bin
as_pg() { runuser -u postgres -- "$@"; }
port_of() { case $1 in a) echo 5440 ;; b) echo 5441 ;; esac; }
other() { case $1 in a) echo b ;; b) echo a ;; esac; }
up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# Local commits: setup statements must not wait for a standby that is not there yet.
psql_at() { PGOPTIONS='-c synchronous_commit=local' psql -h 127.0.0.1 -p "$1" -U postgres -d postgres -Atc "$2"; }
say() { echo "pg-ha: $*" >&2; }

# The settings of node $1 as its role requires; appended last, so they win over the copy of
# the other node's file that pg_basebackup brought.
node_settings() {
  local n=$1
  cat >>"$base/$n/postgresql.conf" <<EOF
# outbox-pg-ha node $n
port = $(port_of "$n")
listen_addresses = '127.0.0.1'
unix_socket_directories = '$base'
wal_level = logical
max_wal_senders = 10
max_replication_slots = 10
hot_standby = on
hot_standby_feedback = on
wal_keep_size = '512MB'
shared_buffers = '64MB'
synchronous_standby_names = 'node_$(other "$n")'
synchronous_commit = on
EOF
}

wait_ready() {
  for _ in $(seq 1 120); do
    as_pg "$bin/pg_isready" -q -h 127.0.0.1 -p "$1" && return 0
    sleep 0.5
  done
  say "node on port $1 did not come up; its log: $base/$2.log"
  tail -n 20 "$base/$2.log" >&2 || true
  return 1
}

start_node() {
  local n=$1
  up "$(port_of "$n")" && return 0
  as_pg "$bin/pg_ctl" -D "$base/$n" -l "$base/$n.log" -w -t 60 start >/dev/null
  wait_ready "$(port_of "$n")" "$n"
}

# Node $1 as a fresh streaming standby of node $2 (which must be up).
make_standby() {
  local n=$1 from=$2
  rm -rf "${base:?}/$n"
  as_pg "$bin/pg_basebackup" -h 127.0.0.1 -p "$(port_of "$from")" -U postgres -D "$base/$n" \
    -X stream -c fast -R
  node_settings "$n"
  echo "primary_conninfo = 'host=127.0.0.1 port=$(port_of "$from") user=postgres application_name=node_$n'" \
    >>"$base/$n/postgresql.auto.conf"
  start_node "$n"
}

make_primary() {
  local n=$1
  rm -rf "${base:?}/$n"
  as_pg "$bin/initdb" -D "$base/$n" -A trust -U postgres -E UTF8 >/dev/null
  printf 'local all all trust\nhost all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n' \
    >"$base/$n/pg_hba.conf"
  node_settings "$n"
  start_node "$n"
  psql_at "$(port_of "$n")" "CREATE ROLE root SUPERUSER LOGIN" >/dev/null
  psql_at "$(port_of "$n")" "CREATE DATABASE test OWNER root" >/dev/null
}

is_standby() { [ -f "$base/$1/standby.signal" ]; }

primary() { for n in a b; do is_standby "$n" || { echo "$n"; return; }; done; }
standby() { for n in a b; do is_standby "$n" && { echo "$n"; return; }; done; }

cmd=${1:-up}
case $cmd in
  up)
    mkdir -p "$base"
    chown postgres:postgres "$base"
    if [ ! -f "$base/a/PG_VERSION" ] && [ ! -f "$base/b/PG_VERSION" ]; then
      say "making the primary (node a, 127.0.0.1:5440) and its synchronous standby (node b, 127.0.0.1:5441)"
      make_primary a
      make_standby b a
    fi
    p=$(primary)
    if [ -z "$p" ]; then
      say "both nodes are standbys (an interrupted failover): promoting node a"
      rm -f "$base/a/standby.signal"
      p=a
    fi
    s=$(other "$p")
    start_node "$p"
    if [ ! -f "$base/$s/PG_VERSION" ] || ! is_standby "$s" || ! start_node "$s"; then
      say "node $s is not a healthy standby of node $p: rebuilding it"
      as_pg "$bin/pg_ctl" -D "$base/$s" -m immediate stop >/dev/null 2>&1 || true
      make_standby "$s" "$p"
    fi
    say "primary node $p on 127.0.0.1:$(port_of "$p"), synchronous standby node $s on 127.0.0.1:$(port_of "$s")"
    ;;
  failover)
    p=$(primary); s=$(standby)
    say "stopping primary node $p at once; promoting node $s"
    as_pg "$bin/pg_ctl" -D "$base/$p" -m immediate stop >/dev/null
    as_pg "$bin/pg_ctl" -D "$base/$s" -w -t 60 promote >/dev/null
    say "rebuilding node $p as the standby of node $s"
    make_standby "$p" "$s"
    ;;
  primary) port_of "$(primary)" ;;
  standby) port_of "$(standby)" ;;
  stop-standby) as_pg "$bin/pg_ctl" -D "$base/$(standby)" -m fast -w stop >/dev/null ;;
  start-standby) start_node "$(standby)" ;;
  url) echo "postgres://root@127.0.0.1:5440,127.0.0.1:5441/test?target_session_attrs=read-write" ;;
  *) echo "usage: $0 up|failover|primary|standby|stop-standby|start-standby|url" >&2; exit 2 ;;
esac
