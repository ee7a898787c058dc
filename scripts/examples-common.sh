# Sourced by scripts/examples.sh and scripts/debezium-kafka.sh: the examples' Python venv (psycopg,
# PyMySQL, nats-py, confluent-kafka), made or brought up to date only when its requirements
# changed; the `outbox` binary (built unless OUTBOX_BIN names one); the services. Needs `venv`
# (the venv's folder) and `say`; sets `python` and `OUTBOX_BIN`.
requirements=(examples/python/requirements.txt scripts/examples_requirements.txt)
stamp=$(cat "${requirements[@]}" | sha256sum | cut -c1-16)
if [ "$(cat "$venv/.examples-stamp" 2>/dev/null)" != "$stamp" ]; then
  say "Python venv $venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${requirements[@]/#/-r}"
  echo "$stamp" >"$venv/.examples-stamp"
fi
python=$venv/bin/python

if [ -z "${OUTBOX_BIN:-}" ]; then
  cargo build --quiet -p outbox-cli
  OUTBOX_BIN=$CARGO_TARGET_DIR/debug/outbox
fi
scripts/services.sh >/dev/null
