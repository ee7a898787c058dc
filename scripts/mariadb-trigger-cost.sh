#!/usr/bin/env bash
# Where the MySQL engine's writer cost goes (issue 24): the engine's message table (same columns,
# indexes, CHECK and seq ranges as crates/outbox-mysql/migrations) under a business UPDATE plus
# the plain four-column INSERT, 16 clients through mariadb-slap, variants alternated in one run,
# each with its trigger cut down further:
#
#   naive   the seed articles' table (the bench's outbox_naive: UUID key, status and its index)
#   bare    the engine's table with no trigger (fixed part and part_seq): the row itself
#   set     a trigger that only computes the partition (no table touched): a trigger's own cost
#   lock    the same plus the partition's counter row locked (SELECT … FOR UPDATE), not changed
#   upd     the same plus the counter incremented (UPDATE), its value not read back
#   engine  the engine's trigger as migrated (UPDATE … LAST_INSERT_ID, ROW_COUNT check)
#   cond    the engine's trigger behind a test: it keeps a position only for a row the binlog
#           will not carry as a row event (binlog off, sql_log_bin = 0 or a format not ROW);
#           on a server with the row binlog it only computes the partition. This is what
#           writers would pay were the relay to read commit order from the binlog
#           (docs/engine-mysql.md, "The binlog route"); run it with PORT set to a server with
#           the binlog on (scripts/mariadb-binlog-cost.sh starts one)
#   lean    the same test, with nothing else done when the binlog carries the row (the
#           partition is left to the relay, which computes it from the key)
#
# Usage: [PARTS=64] [CLIENTS=16] [VARIANTS="naive bare set lock upd engine cond lean"] [PORT=3306]
#        scripts/mariadb-trigger-cost.sh [TRANSACTIONS per client] [ROUNDS]
# Keys: 1,000 (`order-N`); accounts: 100,000 rows. Needs mariadb and mariadb-slap (Debian's
# mariadb-client) and a server on 127.0.0.1 (root, no password). Works in a database of its own,
# dropped at the end; checks that the engine variant's positions came out gapless.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
per_client="${1:-1000}"
rounds="${2:-5}"
parts="${PARTS:-64}"
clients="${CLIENTS:-16}"
port="${PORT:-3306}"
read -r -a variants <<<"${VARIANTS:-naive bare set lock upd engine cond lean}"
db="trigger_cost_$(head -c4 /dev/urandom | od -An -tx1 | tr -d ' \n')"
my() { mariadb -h 127.0.0.1 -P "$port" -u root "$@"; }
trap 'my -e "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT

# The engine's message table (0001_outbox.sql and 0003_ranges.sql), named $1, with part and
# part_seq defaulting to $2 and $3.
message_table() {
  cat <<SQL
CREATE TABLE $1 (
    seq BIGINT NOT NULL AUTO_INCREMENT, id CHAR(36) NOT NULL DEFAULT (UUID()),
    aggregate_type VARCHAR(255) NOT NULL, aggregate_id VARCHAR(255) NOT NULL,
    event_type VARCHAR(255) NOT NULL, payload JSON NOT NULL, headers JSON NOT NULL DEFAULT ('{}'),
    topic VARCHAR(255) NULL, created_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    part SMALLINT NOT NULL DEFAULT $2, part_seq BIGINT NOT NULL DEFAULT $3,
    PRIMARY KEY (seq), KEY (part, part_seq), KEY (id),
    CHECK (part >= 0 AND part_seq > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin
PARTITION BY RANGE (seq) (PARTITION s1 VALUES LESS THAN (10000000),
                          PARTITION s_max VALUES LESS THAN MAXVALUE);
SQL
}
counters() {
  echo "CREATE TABLE $1 (part SMALLINT NOT NULL PRIMARY KEY, n BIGINT NOT NULL) ENGINE = InnoDB;"
  echo "INSERT INTO $1 SELECT seq, 0 FROM seq_0_to_$((parts - 1));"
}

my <<SQL
CREATE DATABASE $db;
USE $db;
CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL) ENGINE = InnoDB;
INSERT INTO accounts SELECT seq, 0 FROM seq_1_to_100000;
CREATE TABLE naive (
    id CHAR(36) NOT NULL DEFAULT (UUID()) PRIMARY KEY, aggregate_type VARCHAR(255) NOT NULL,
    aggregate_id VARCHAR(255) NOT NULL, event_type VARCHAR(255) NOT NULL, payload JSON NOT NULL,
    status VARCHAR(16) NOT NULL DEFAULT 'PENDING',
    created_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    KEY (status, created_at)) ENGINE = InnoDB;
$(message_table bare 0 1)
$(message_table t_set -1 0)
$(message_table t_lock -1 0)
$(message_table t_upd -1 0)
$(message_table t_engine -1 0)
$(message_table t_cond -1 0)
$(message_table t_lean 0 1)
$(counters lock_n)
$(counters upd_n)
$(counters engine_n)
$(counters cond_n)
$(counters lean_n)
DELIMITER //
CREATE TRIGGER t_set_position BEFORE INSERT ON t_set FOR EACH ROW
BEGIN
    SET NEW.part = CRC32(NEW.aggregate_id) % $parts;
    SET NEW.part_seq = 1;
END//
CREATE TRIGGER t_lock_position BEFORE INSERT ON t_lock FOR EACH ROW
BEGIN
    SET NEW.part = CRC32(NEW.aggregate_id) % $parts;
    SELECT n INTO @outbox_n FROM lock_n WHERE part = NEW.part FOR UPDATE;
    SET NEW.part_seq = 1;
END//
CREATE TRIGGER t_upd_position BEFORE INSERT ON t_upd FOR EACH ROW
BEGIN
    SET NEW.part = CRC32(NEW.aggregate_id) % $parts;
    UPDATE upd_n SET n = n + 1 WHERE part = NEW.part;
    SET NEW.part_seq = 1;
END//
CREATE TRIGGER t_engine_position BEFORE INSERT ON t_engine FOR EACH ROW
BEGIN
    SET NEW.part = CRC32(NEW.aggregate_id) % $parts;
    UPDATE engine_n SET n = LAST_INSERT_ID(n + 1) WHERE part = NEW.part;
    IF ROW_COUNT() <> 1 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'no position counter for this partition';
    END IF;
    SET NEW.part_seq = LAST_INSERT_ID();
END//
CREATE TRIGGER t_cond_position BEFORE INSERT ON t_cond FOR EACH ROW
BEGIN
    SET NEW.part = CRC32(NEW.aggregate_id) % $parts;
    IF @@log_bin = 0 OR @@sql_log_bin = 0 OR @@binlog_format <> 'ROW' THEN
        UPDATE cond_n SET n = LAST_INSERT_ID(n + 1) WHERE part = NEW.part;
        IF ROW_COUNT() <> 1 THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'no position counter for this partition';
        END IF;
        SET NEW.part_seq = LAST_INSERT_ID();
    ELSE
        SET NEW.part_seq = 1;
    END IF;
END//
CREATE TRIGGER t_lean_position BEFORE INSERT ON t_lean FOR EACH ROW
BEGIN
    IF @@log_bin = 0 OR @@sql_log_bin = 0 OR @@binlog_format <> 'ROW' THEN
        SET NEW.part = CRC32(NEW.aggregate_id) % $parts;
        UPDATE lean_n SET n = LAST_INSERT_ID(n + 1) WHERE part = NEW.part;
        IF ROW_COUNT() <> 1 THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'no position counter for this partition';
        END IF;
        SET NEW.part_seq = LAST_INSERT_ID();
    END IF;
END//
DELIMITER ;
SQL

payload="'{\"order_id\": 42, \"amount_cents\": 1999, \"currency\": \"EUR\", \"lines\": [1, 2, 3]}'"
begin="SET @k = FLOOR(1 + RAND() * 100000);START TRANSACTION;UPDATE accounts SET balance = balance + 1 WHERE id = @k"
transaction() {
  echo "$begin;INSERT INTO $1 (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', CONCAT('order-', @k % 1000), 'order.placed', $payload);COMMIT"
}
declare -A table=([naive]=naive [bare]=bare [set]=t_set [lock]=t_lock [upd]=t_upd [engine]=t_engine
                  [cond]=t_cond [lean]=t_lean)
echo "MariaDB trigger cost: $clients clients, $per_client transactions each per run, $rounds rounds, $parts partitions; database $db"
my -N -e "SELECT CONCAT('server: log_bin=', @@log_bin, ' binlog_format=', @@binlog_format, ' sync_binlog=', @@sync_binlog)"
results=$(mktemp)
for r in $(seq 1 "$rounds"); do
  for v in "${variants[@]}"; do
    secs=$(mariadb-slap -h 127.0.0.1 -P "$port" -u root --create-schema="$db" \
             --concurrency="$clients" --iterations=1 \
             --number-of-queries=$((per_client * 5 * clients)) \
             --delimiter=";" --query="$(transaction "${table[$v]}")" |
           sed -n 's/.*Average number of seconds to run all queries: \([0-9.]*\).*/\1/p')
    tps=$(python3 -c "print(round($per_client * $clients / $secs))")
    echo "$v $tps" >> "$results"
    printf '  round %s  %-8s %8s tps\n' "$r" "$v" "$tps"
  done
done
python3 "$here/median_ratios.py" "$results"
rm -f "$results"
my "$db" -N -e "SELECT 'engine partitions with a gap or a repeat:', COUNT(*) FROM (SELECT part FROM t_engine GROUP BY part HAVING COUNT(DISTINCT part_seq) <> COUNT(*) OR MAX(part_seq) <> COUNT(*)) g"
