#!/usr/bin/env bash
# Makes the test CA and the certificates the TLS tests and servers use, outside the repo, in
# ${OUTBOX_TLS_DIR:-/var/tmp/outbox-tls}. Idempotent: an existing set is kept while its server
# certificate is valid for another day.
#
#   ca.pem ca.key                 the test CA (the servers trust client certificates it signed)
#   server.pem server.key         the servers' certificate: DNS localhost, IP 127.0.0.1
#   client.pem client.key         a client certificate, CN outbox_cert (PostgreSQL's cert-auth
#                                 user of that name; Mosquitto, NATS, RabbitMQ take any CN)
#   other-ca.pem                  another CA, which signed nothing the servers present (the
#                                 "wrong CA" failure tests)
#   wronghost.pem wronghost.key   signed by the CA, for wrong.example only (wrong host)
#   expired.pem expired.key       signed by the CA for localhost, expired in 2020
#   pg/server.pem pg/server.key pg/ca.pem   copies PostgreSQL may read (owned by postgres, 0600)
set -euo pipefail
dir=${OUTBOX_TLS_DIR:-/var/tmp/outbox-tls}
mkdir -p "$dir"
cd "$dir"

if [ -s server.pem ] && [ -s expired.pem ] && [ -s pg/server.key ] \
  && openssl x509 -in server.pem -noout -checkend 86400 >/dev/null 2>&1; then
  exit 0
fi
echo "tls-certs: making a test CA and certificates in $dir"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key ca.key
openssl req -x509 -new -key ca.key -days 3650 -subj "/CN=outbox test CA" -out ca.pem \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
key other-ca.key
openssl req -x509 -new -key other-ca.key -days 3650 -subj "/CN=some other CA" -out other-ca.pem \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

# sign NAME CN SAN EXTENDED_USAGE: NAME.key and NAME.pem, signed by the CA for 825 days.
sign() {
  local name=$1 cn=$2 san=$3 usage=$4
  key "$name.key"
  openssl req -new -key "$name.key" -subj "/CN=$cn" -out "$name.csr"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=%s\n%s\n' \
    "$usage" "${san:+subjectAltName=$san}" >"$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
    -extfile "$name.ext" -out "$name.pem" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}
sign server localhost "DNS:localhost,IP:127.0.0.1" serverAuth
sign client outbox_cert "" clientAuth
sign wronghost wrong.example "DNS:wrong.example" serverAuth

# An expired certificate: OpenSSL 3.0's `x509` cannot back-date, its `ca` command can.
key expired.key
openssl req -new -key expired.key -subj "/CN=localhost" -out expired.csr
mkdir -p ca-db && : >ca-db/index.txt
cat >ca-db/ca.cnf <<EOF
[ca]
default_ca = test
[test]
database = $dir/ca-db/index.txt
new_certs_dir = $dir/ca-db
serial = $dir/ca-db/serial
default_md = sha256
policy = any
copy_extensions = none
x509_extensions = ext
[any]
commonName = supplied
[ext]
basicConstraints = CA:FALSE
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost,IP:127.0.0.1
EOF
echo 01 >ca-db/serial
openssl ca -batch -config ca-db/ca.cnf -cert ca.pem -keyfile ca.key -in expired.csr \
  -startdate 20200101000000Z -enddate 20200102000000Z -out expired.pem >/dev/null 2>&1
rm -f expired.csr

# PostgreSQL refuses a key that others can read, and runs as postgres.
mkdir -p pg
cp server.pem server.key ca.pem pg/
if id postgres >/dev/null 2>&1; then chown -R postgres:postgres pg; fi
chmod 700 pg && chmod 600 pg/server.key
chmod 644 ./*.pem && chmod 600 ./*.key
echo "tls-certs: done"
