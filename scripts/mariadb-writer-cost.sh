#!/usr/bin/env bash
# What ordering writers by key costs on MariaDB/MySQL, before the MySQL store is designed
# (issue 24): a business UPDATE plus one outbox row per transaction, 16 clients, through
# mariadb-slap, the variants alternated in one run:
#
#   naive   the seed articles' table (UUID primary key, status column and its index)
#   plain   an insert-only outbox row (AUTO_INCREMENT position, UUID unique key), nothing else
#   keyed   the same plus a per-key counter row upserted in the writer's transaction
#           (INSERT … ON DUPLICATE KEY UPDATE n = n + 1, then the row takes n): gapless per key
#           in commit order, since a rollback undoes it, as raw-SQL writers would be told to do
#   trigger the same counter kept by a BEFORE INSERT trigger, so the plain four-column insert
#           gets it without a second statement
#   part    a counter per partition (PARTS, by CRC32 of the key) kept by a BEFORE INSERT trigger:
#           gapless per partition in commit order, so a reader that has passed position n of a
#           partition knows no row at or below n can still commit there (no snapshot needed),
#           and writers of one partition, not only of one key, wait for each other's commit
#
# Usage: [PARTS=64] [PORT=3306] scripts/mariadb-writer-cost.sh [TRANSACTIONS per client] [ROUNDS]
# (PARTS: how many partitions the part variant counts in; PORT: the server's, on 127.0.0.1).
# Needs the mariadb client and mariadb-slap (Debian's mariadb-client), and a server on
# 127.0.0.1 (root, no password). scripts/mariadb-binlog-cost.sh runs this against a private
# server twice, with the binlog off and on. Works in a database of its own, dropped at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
per_client="${1:-1000}"
rounds="${2:-3}"
parts="${PARTS:-64}"
port="${PORT:-3306}"
clients=16
db="writer_cost_$(head -c4 /dev/urandom | od -An -tx1 | tr -d ' \n')"
my() { mariadb -h 127.0.0.1 -P "$port" -u root "$@"; }
trap 'my -e "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT

my <<SQL
CREATE DATABASE $db;
USE $db;
CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB;
INSERT INTO accounts SELECT seq, 0 FROM seq_1_to_10000;
CREATE TABLE naive (id BINARY(16) PRIMARY KEY, aggregate_type VARCHAR(255) NOT NULL,
  aggregate_id VARCHAR(255) NOT NULL, event_type VARCHAR(255) NOT NULL, payload JSON NOT NULL,
  status VARCHAR(16) NOT NULL DEFAULT 'pending',
  created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), published_at TIMESTAMP(6) NULL,
  KEY naive_pending (status, created_at)) ENGINE=InnoDB;
CREATE TABLE outbox (seq BIGINT AUTO_INCREMENT PRIMARY KEY, id BINARY(16) NOT NULL,
  aggregate_type VARCHAR(255) NOT NULL, aggregate_id VARCHAR(255) NOT NULL,
  event_type VARCHAR(255) NOT NULL, payload JSON NOT NULL, headers JSON NOT NULL DEFAULT '{}',
  created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), key_seq BIGINT NULL,
  UNIQUE KEY (id)) ENGINE=InnoDB;
CREATE TABLE outbox_keys (aggregate_id VARCHAR(255) PRIMARY KEY, n BIGINT NOT NULL) ENGINE=InnoDB;
CREATE TABLE outbox_t LIKE outbox;
CREATE TABLE outbox_keys_t LIKE outbox_keys;
CREATE TABLE outbox_p LIKE outbox;
ALTER TABLE outbox_p ADD COLUMN part SMALLINT NOT NULL DEFAULT 0, ADD KEY (part, key_seq);
CREATE TABLE outbox_parts (part SMALLINT PRIMARY KEY, n BIGINT NOT NULL) ENGINE=InnoDB;
INSERT INTO outbox_parts SELECT seq, 0 FROM seq_0_to_$((parts - 1));
DELIMITER //
CREATE TRIGGER outbox_t_key_seq BEFORE INSERT ON outbox_t FOR EACH ROW
BEGIN
  INSERT INTO outbox_keys_t (aggregate_id, n) VALUES (NEW.aggregate_id, 1)
    ON DUPLICATE KEY UPDATE n = n + 1;
  SET NEW.key_seq = (SELECT n FROM outbox_keys_t WHERE aggregate_id = NEW.aggregate_id);
END//
CREATE TRIGGER outbox_p_seq BEFORE INSERT ON outbox_p FOR EACH ROW
BEGIN
  SET NEW.part = CRC32(NEW.aggregate_id) % $parts;
  UPDATE outbox_parts SET n = LAST_INSERT_ID(n + 1) WHERE part = NEW.part;
  SET NEW.key_seq = LAST_INSERT_ID();
END//
DELIMITER ;
SQL

payload="'{\"order_id\": 42, \"amount_cents\": 1999, \"currency\": \"EUR\", \"lines\": [1, 2, 3]}'"
begin="SET @k = FLOOR(1 + RAND() * 1000);START TRANSACTION;UPDATE accounts SET balance = balance + 1 WHERE id = @k"
row="UNHEX(REPLACE(UUID(), '-', '')), 'order', CONCAT('order-', @k), 'order.placed', $payload"
declare -A tx=(
  [naive]="$begin;INSERT INTO naive (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($row);COMMIT"
  [plain]="$begin;INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($row);COMMIT"
  [keyed]="$begin;INSERT INTO outbox_keys VALUES (CONCAT('order-', @k), 1) ON DUPLICATE KEY UPDATE n = n + 1;INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, key_seq) VALUES ($row, (SELECT n FROM outbox_keys WHERE aggregate_id = CONCAT('order-', @k)));COMMIT"
  [trigger]="$begin;INSERT INTO outbox_t (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($row);COMMIT"
  [part]="$begin;INSERT INTO outbox_p (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($row);COMMIT"
)
variants=(naive plain keyed trigger part)
echo "MariaDB writer cost: $clients clients, $per_client transactions each per run, $rounds rounds, $parts partitions; database $db"
results=$(mktemp)
for r in $(seq 1 "$rounds"); do
  for v in "${variants[@]}"; do
    statements=$(tr ';' '\n' <<<"${tx[$v]}" | wc -l)
    secs=$(mariadb-slap -h 127.0.0.1 -P "$port" -u root --create-schema="$db" --concurrency=$clients \
             --iterations=1 --number-of-queries=$((per_client * statements * clients)) \
             --delimiter=";" --query="${tx[$v]}" |
           sed -n 's/.*Average number of seconds to run all queries: \([0-9.]*\).*/\1/p')
    tps=$(python3 -c "print(round($per_client * $clients / $secs))")
    echo "$v $tps" >> "$results"
    printf '  round %s  %-8s %8s tps\n' "$r" "$v" "$tps"
  done
done
python3 "$here/median_ratios.py" "$results"
rm -f "$results"
# Per-key order held: every key's counter values are 1..n with no gap or repeat.
my "$db" -N -e "SELECT 'keys with a gap or a repeat in key_seq:', COUNT(*) FROM (SELECT aggregate_id FROM outbox_t GROUP BY aggregate_id HAVING COUNT(DISTINCT key_seq) <> COUNT(*) OR MAX(key_seq) <> COUNT(*)) g"
# Per-partition positions held: each partition's are 1..n, with no gap or repeat.
my "$db" -N -e "SELECT 'partitions with a gap or a repeat:', COUNT(*) FROM (SELECT part FROM outbox_p GROUP BY part HAVING COUNT(DISTINCT key_seq) <> COUNT(*) OR MAX(key_seq) <> COUNT(*)) g"
