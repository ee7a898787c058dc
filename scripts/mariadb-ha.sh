#!/usr/bin/env bash
# A MariaDB primary and a GTID replica on this machine, for `outbox verify --binlog --faults
# failover` (issue 44): node a on 127.0.0.1:3310 and node b on 127.0.0.1:3311, data in
# /var/lib/outbox-mariadb-ha/{a,b}, each a mariadbd of its own run as services.sh runs the
# MariaDB with the row binlog on 3307 (--no-defaults, this script's user, root without a
# password on loopback). Which node is the primary changes with every failover; the file
# /var/lib/outbox-mariadb-ha/primary names it (a or b).
#
# Both nodes: row binlog with binlog_row_image=FULL, log_slave_updates, gtid_strict_mode,
# server_id 11 and 12, and semi-synchronous replication (built into MariaDB 10.3+) waiting
# AFTER_SYNC with no time limit: a commit is acknowledged to its client only once the replica has
# it, so a promoted replica has every acknowledged commit. The price: while no replica is
# connected (a failover's rejoin or rebuild) commits on the primary wait, as the PostgreSQL
# pair's synchronous standby makes them wait (scripts/pg-ha.sh).
#
# Usage: scripts/mariadb-ha.sh up        make both nodes when missing, start them, wait
#                                        (idempotent, fast when both are up and replicating)
#        scripts/mariadb-ha.sh failover  kill -9 the primary (no clean shutdown), promote the
#                                        replica once it has applied what it received, then make
#                                        the old primary a GTID replica of the new one; rebuilt
#                                        from a dump of the new primary if its history diverged
#        scripts/mariadb-ha.sh primary   print the primary's host:port
#        scripts/mariadb-ha.sh replica   print the replica's host:port
#        scripts/mariadb-ha.sh url       print the URL of database `test` on the primary now
set -euo pipefail

base=/var/lib/outbox-mariadb-ha
port_of() { case $1 in a) echo 3310 ;; b) echo 3311 ;; esac; }
id_of() { case $1 in a) echo 11 ;; b) echo 12 ;; esac; }
other() { case $1 in a) echo b ;; b) echo a ;; esac; }
up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
say() { echo "mariadb-ha: $*" >&2; }
sql() { mariadb -h 127.0.0.1 -P "$(port_of "$1")" -u root -N -B -e "$2"; }
# One field of SHOW SLAVE STATUS on node $1 (empty when it is no replica).
slave_field() {
  mariadb -h 127.0.0.1 -P "$(port_of "$1")" -u root -e 'SHOW SLAVE STATUS\G' 2>/dev/null |
    awk -v f="$2" -F': ' '$1 ~ "^ *"f"$" {print $2}'
}

primary() { cat "$base/primary" 2>/dev/null || echo a; }

start_node() {
  local n=$1 dir=$base/$1
  up "$(port_of "$n")" && return 0
  setsid nohup mariadbd --no-defaults --datadir="$dir/data" --user="$(id -un)" \
    --bind-address=127.0.0.1 --port="$(port_of "$n")" --socket="$dir/mysqld.sock" \
    --pid-file="$dir/mysqld.pid" --innodb-buffer-pool-size=64M --server-id="$(id_of "$n")" \
    --log-bin="$dir/data/binlog" --relay-log="$dir/data/relay" --log-slave-updates \
    --binlog-format=ROW --binlog-row-image=FULL --gtid-strict-mode=ON \
    --max-binlog-size=64M --expire-logs-days=1 \
    --rpl-semi-sync-slave-enabled=ON \
    --rpl-semi-sync-master-wait-point=AFTER_SYNC --rpl-semi-sync-master-timeout=4294967295 \
    >>"$dir/server.log" 2>&1 </dev/null &
  # Not this script's job: its kill -9 at a failover is no news to report.
  disown
  for _ in $(seq 1 120); do
    sql "$n" "SELECT 1" >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  say "node $n did not come up on 127.0.0.1:$(port_of "$n"); its log: $dir/server.log"
  tail -n 20 "$dir/server.log" >&2 || true
  return 1
}

# Ends node $1's server at once, as a crash: kill -9, no shutdown.
kill_node() {
  local n=$1 pid
  pid=$(cat "$base/$n/mysqld.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  fi
  rm -f "$base/$n/mysqld.pid"
}

fresh_node() {
  local n=$1
  kill_node "$n"
  rm -rf "${base:?}/$n"
  mkdir -p "$base/$n"
  mariadb-install-db --no-defaults --datadir="$base/$n/data" --user="$(id -un)" \
    --auth-root-authentication-method=normal --skip-test-db >"$base/$n/install.log" 2>&1
  start_node "$n"
}

# Node $1 replicates node $2 by GTID from its gtid_slave_pos, read-only. Only the primary waits
# for a semi-sync acknowledgement: a replica that did would wait for ever on its own binlog
# writes (log_slave_updates) with no replica of its own.
follow() {
  local n=$1 from=$2
  sql "$n" "STOP SLAVE; SET GLOBAL read_only = ON; SET GLOBAL rpl_semi_sync_master_enabled = OFF;
    CHANGE MASTER TO master_host = '127.0.0.1', master_port = $(port_of "$from"),
      master_user = 'root', master_password = '', master_use_gtid = slave_pos,
      master_connect_retry = 1;
    START SLAVE"
}

# Whether node $1 replicates without error and has caught up with node $2 within 20 s.
healthy_replica() {
  local n=$1 from=$2 pos
  pos=$(sql "$from" "SELECT @@gtid_binlog_pos") || return 1
  for _ in $(seq 1 80); do
    if [ -n "$(slave_field "$n" Last_IO_Errno | grep -v '^0$')" ] ||
      [ -n "$(slave_field "$n" Last_SQL_Errno | grep -v '^0$')" ]; then
      say "node $n cannot follow node $from: $(slave_field "$n" Last_IO_Error)$(slave_field "$n" Last_SQL_Error)"
      return 1
    fi
    if [ "$(slave_field "$n" Slave_IO_Running)" = Yes ] &&
      [ "$(slave_field "$n" Slave_SQL_Running)" = Yes ] &&
      [ "$(sql "$n" "SELECT MASTER_GTID_WAIT('$pos', 0)")" = 0 ]; then
      return 0
    fi
    sleep 0.25
  done
  say "node $n did not catch up with node $from within 20 s"
  return 1
}

# Node $1 made again from a dump of node $2 (a consistent snapshot with its GTID position,
# loaded without writing node $1's binlog), then its GTID replica.
rebuild() {
  local n=$1 from=$2 attempt
  # A dump does not carry an XA transaction prepared at its snapshot: the copy would stop at
  # that transaction's XA COMMIT (XAER_NOTA). The dump waits (up to 10 s) for a moment with
  # none prepared; one prepared in between still breaks it, and the rebuild is tried again
  # (under verify's XA producers a CI run needed 4 attempts, so up to 15).
  for attempt in $(seq 1 15); do
    say "rebuilding node $n from a dump of node $from (attempt $attempt)"
    # Commits on node $from wait for a replica that is not there; the dump would wait for
    # them (its snapshot) and they for it. Semi-sync is off until node $n replicates again: no
    # failover comes before this script has returned, and it returns once node $n caught up.
    sql "$from" "SET GLOBAL rpl_semi_sync_master_enabled = OFF"
    fresh_node "$n"
    for _ in $(seq 1 200); do
      [ -z "$(sql "$from" "XA RECOVER")" ] && break
      sleep 0.05
    done
    {
      # Rows as they are: the outbox's CHECKs may postdate rows the migration left unchecked.
      echo "SET sql_log_bin = 0, check_constraint_checks = 0;"
      # --force: a view left unreadable (a run's database half dropped) does not stop it.
      mariadb-dump -h 127.0.0.1 -P "$(port_of "$from")" -u root --all-databases --force \
        --single-transaction --gtid --master-data=1 --routines --triggers --events
    } | mariadb -h 127.0.0.1 -P "$(port_of "$n")" -u root
    # Nothing of the load may be in node $n's own binlog: a GTID of its own there would
    # diverge from the primary's history (gtid_strict_mode stops the replica at it).
    sql "$n" "FLUSH LOCAL PRIVILEGES; RESET MASTER"
    follow "$n" "$from"
    sql "$from" "SET GLOBAL rpl_semi_sync_master_enabled = ON"
    healthy_replica "$n" "$from" && return 0
  done
  return 1
}

# Node $1, a former primary (crashed, restarted with crash recovery), rejoins as node $2's
# GTID replica from what its own binlog holds; `gtid_strict_mode` makes the new primary refuse
# it when its binlog has a transaction the new primary lacks (one written but never
# acknowledged before the crash), and then it is rebuilt.
rejoin() {
  local n=$1 from=$2
  start_node "$n"
  # An XA transaction the crash left prepared stays prepared here (MariaDB keeps it), holding
  # its rows while the new primary resolves it its own way: the replica would stop at the first
  # transaction that touches them. Such a node is rebuilt.
  if [ -n "$(sql "$n" "XA RECOVER")" ]; then
    say "node $n holds XA transactions its crash left prepared"
    rebuild "$n" "$from"
    return
  fi
  sql "$n" "SET GLOBAL gtid_slave_pos = @@gtid_binlog_pos"
  follow "$n" "$from"
  healthy_replica "$n" "$from" || rebuild "$n" "$from"
}

cmd=${1:-up}
case $cmd in
  up)
    mkdir -p "$base"
    if [ ! -d "$base/a/data/mysql" ] || [ ! -d "$base/b/data/mysql" ]; then
      say "making the primary (node a, 127.0.0.1:3310) and its GTID replica (node b, 127.0.0.1:3311)"
      fresh_node a
      fresh_node b
      echo a >"$base/primary"
      follow b a
      sql a "SET GLOBAL rpl_semi_sync_master_enabled = ON; CREATE DATABASE IF NOT EXISTS test"
      healthy_replica b a
    fi
    p=$(primary); s=$(other "$p")
    start_node "$p"
    sql "$p" "SET GLOBAL read_only = OFF; SET GLOBAL rpl_semi_sync_master_enabled = ON"
    start_node "$s" || true
    if ! up "$(port_of "$s")" || [ "$(slave_field "$s" Slave_IO_Running)" != Yes ] ||
      ! healthy_replica "$s" "$p"; then
      say "node $s is not a healthy replica of node $p"
      rejoin "$s" "$p"
    fi
    sql "$p" "CREATE DATABASE IF NOT EXISTS test"
    say "primary node $p on 127.0.0.1:$(port_of "$p"), GTID replica node $s on 127.0.0.1:$(port_of "$s")"
    ;;
  failover)
    p=$(primary); s=$(other "$p")
    say "killing primary node $p (kill -9); promoting node $s"
    kill_node "$p"
    # What the replica received (every acknowledged commit, semi-sync) is applied first.
    sql "$s" "STOP SLAVE IO_THREAD"
    applied=no
    for _ in $(seq 1 240); do
      if [ "$(slave_field "$s" Read_Master_Log_Pos)" = "$(slave_field "$s" Exec_Master_Log_Pos)" ] &&
        [ "$(slave_field "$s" Master_Log_File)" = "$(slave_field "$s" Relay_Master_Log_File)" ]; then
        applied=yes
        break
      fi
      # A replica whose applier stopped would be promoted without what it received: refused.
      if [ "$(slave_field "$s" Slave_SQL_Running)" != Yes ]; then
        say "node $s cannot be promoted: its replication applier stopped ($(slave_field "$s" Last_SQL_Error)); node $p is down"
        exit 1
      fi
      sleep 0.25
    done
    if [ "$applied" != yes ]; then
      say "node $s did not apply what it received within 60 s; not promoted (node $p is down)"
      exit 1
    fi
    sql "$s" "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = OFF;
      SET GLOBAL rpl_semi_sync_master_enabled = ON"
    echo "$s" >"$base/primary"
    say "node $s is the primary on 127.0.0.1:$(port_of "$s"); node $p rejoins as its replica"
    rejoin "$p" "$s"
    ;;
  primary) echo "127.0.0.1:$(port_of "$(primary)")" ;;
  replica) echo "127.0.0.1:$(port_of "$(other "$(primary)")")" ;;
  url) echo "mysql://root@127.0.0.1:$(port_of "$(primary)")/test" ;;
  *) echo "usage: $0 up|failover|primary|replica|url" >&2; exit 2 ;;
esac
