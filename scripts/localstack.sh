#!/usr/bin/env bash
# Starts LocalStack's SQS and SNS on 127.0.0.1:4567 for *speed* measurements of the sqs:// and
# sns:// sinks (`outbox bench`, the `raw_throughput` example), installing it into a venv of the
# project's own when missing. Idempotent. Not used by the tests or CI, which run on moto
# (scripts/services.sh): moto rescans a queue for every message sent, so its rate falls with
# the queue's depth and says nothing about the sink.
#
# LocalStack 4.0.3 is the last release whose SQS provider runs on Python 3.11 (this machine's);
# it is started as a plain process (no Docker). The pins below are the versions it was released
# against where today's releases break it: cbor2 6 moved `cbor2._decoder`, pyOpenSSL 25.2
# dropped `X509.add_extensions`.
#
#   scripts/localstack.sh
#   AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_EC2_METADATA_DISABLED=true \
#     outbox bench --sink 'sqs://?region=us-east-1&endpoint=http://127.0.0.1:4567' --keys 1000
set -euo pipefail

venv=${LOCALSTACK_VENV:-/opt/localstack-venv}
port=${LOCALSTACK_PORT:-4567}
up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if up "$port"; then
  echo "localstack: already answering on 127.0.0.1:$port"
  exit 0
fi
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import localstack.services.sqs.provider' 2>/dev/null; then
  echo "localstack: installing LocalStack 4.0.3 into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet 'localstack-core[base-runtime]==4.0.3' \
    'moto-ext==5.0.20.post1' 'cbor2==5.6.5' 'pyopenssl==25.1.0' service_identity
fi
mkdir -p /var/tmp/localstack
echo "localstack: starting SQS, SNS and STS on 127.0.0.1:$port"
GATEWAY_LISTEN="127.0.0.1:$port" LOCALSTACK_HOST="127.0.0.1:$port" SERVICES=sqs,sns,sts \
  EAGER_SERVICE_LOADING=1 SKIP_SSL_CERT_DOWNLOAD=1 DISABLE_EVENTS=1 \
  FILESYSTEM_ROOT=/var/tmp/localstack \
  setsid nohup "$venv/bin/python" -m localstack.runtime.main \
  >/var/tmp/localstack.log 2>&1 </dev/null &
for _ in $(seq 1 60); do
  if curl -fs "http://127.0.0.1:$port/_localstack/health" | grep -q '"sqs": "\(available\|running\)"'; then
    echo "localstack: up on 127.0.0.1:$port"
    exit 0
  fi
  sleep 1
done
echo "localstack: did not come up on 127.0.0.1:$port (see /var/tmp/localstack.log)" >&2
exit 1
