#!/usr/bin/env bash
# The binlog route's drain over TLS against plaintext, on one server: the MariaDB with TLS
# required and the row binlog that scripts/services.sh starts on 127.0.0.1:3312. TLS runs log in
# as outbox_cert by its client certificate (VERIFY_IDENTITY), the pool and the binlog stream
# both; plaintext runs as root with ssl-mode=DISABLED, require_secure_transport turned off for
# the run (and on again at the end). Rounds alternate TLS and plaintext. Besides the bench's own
# figures it prints this server's CPU per message from its /proc/<pid>/stat (the bench's MariaDB
# figure sums every mariadbd on the machine).
#
#   OUTBOX_BIN=target/release/outbox ROWS=100000 ROUNDS=3 scripts/binlog-tls-bench.sh
set -euo pipefail
bin=${OUTBOX_BIN:-${CARGO_TARGET_DIR:-target}/debug/outbox}
d=${OUTBOX_TLS_DIR:-/var/tmp/outbox-tls}
dir=/var/lib/outbox-mariadb-binlog-tls
rows=${ROWS:-100000}
pid=$(cat "$dir/mysqld.pid")
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
secure() { mariadb -S "$dir/mysqld.sock" -u root -e "SET GLOBAL require_secure_transport = $1"; }
trap 'secure ON' EXIT
plain="mysql://root@127.0.0.1:3312/test?ssl-mode=DISABLED"
tls="mysql://outbox_cert@localhost:3312/test?ssl-mode=VERIFY_IDENTITY&ssl-ca=$d/ca.pem&ssl-cert=$d/client.pem&ssl-key=$d/client.key"
for round in $(seq 1 "${ROUNDS:-3}"); do
  for v in tls plain; do
    if [ "$v" = plain ]; then secure OFF; else secure ON; fi
    echo "== round $round $v (load $(cut -d' ' -f1-3 /proc/loadavg))"
    t0=$(ticks)
    "$bin" bench --database-url "${!v}" --binlog --rows "$rows" --keys 1000 --skip-naive 2>&1 \
      | grep -E "relay:|filled"
    t1=$(ticks)
    echo "   this MariaDB (fill + drain): $(( (t1 - t0) * 10000 / rows )) µs per message"
  done
done
