#!/usr/bin/env bash
# The web console in headless Chromium (playwright-core driving Debian's chromium), two scenes.
#
# 1. tests/browser/console.mjs: a scratch schema with the outbox and the inbox, a webhook
#    receiver that rejects one message until told otherwise, a relay that fails it after two
#    attempts, and `outbox console` with a token. The test compares each page with
#    `outbox status --format json`, clicks a redrive with a reason, follows the message's journey
#    to its publication, and checks the refusals; this script then checks that the key's
#    messages reached the receiver in order.
# 2. tests/browser/hostile.mjs: a second schema with every kind of hostile row, 1,200+ failed
#    messages, a key with 40 messages behind its failed head and a `payments` route whose sink
#    is down, relayed to a receiver that answers 422 echoing the row; a check per defect of the
#    console review, ending with kill -9 of the only relay. Before it, this script checks that
#    a console open to the network without a token does not start, and that `outbox status`,
#    `outbox failed` and the relay's log print no raw control character from those rows.
#
# Screenshots of every page go to $CONSOLE_SHOTS (default /var/tmp/outbox-ci-artifacts/console).
# Installs chromium and the npm package when missing. Environment: DATABASE_URL (default
# postgres://root@127.0.0.1:5432/test), OUTBOX_BIN (default: built with cargo).
set -euo pipefail
cd "$(dirname "$0")/.."
DATABASE_URL=${DATABASE_URL:-postgres://root@127.0.0.1:5432/test}
shots=${CONSOLE_SHOTS:-/var/tmp/outbox-ci-artifacts/console}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/outbox-target}"
say() { echo "console-browser: $*"; }

if ! command -v chromium >/dev/null; then
  say "installing Debian's chromium"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
b=tests/browser
if [ ! -d $b/node_modules ] || [ $b/package-lock.json -nt $b/node_modules/.package-lock.json ]; then
  (cd $b && npm ci --no-audit --no-fund --loglevel=error)
fi
if [ -z "${OUTBOX_BIN:-}" ]; then
  cargo build --quiet -p outbox-cli
  OUTBOX_BIN=$CARGO_TARGET_DIR/debug/outbox
fi

suffix=$(head -c 4 /dev/urandom | od -An -tx1 | tr -d ' \n')
schema=console_$suffix
hostile=console_hostile_$suffix
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  for s in "$schema" "${schema}_inbox" "$hostile"; do
    psql -q "$DATABASE_URL" -c "DROP SCHEMA IF EXISTS $s CASCADE" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  say "nothing listens on $1"; return 1
}

db=(--database-url "$DATABASE_URL" --schema "$schema")
"$OUTBOX_BIN" migrate "${db[@]}" >/dev/null
"$OUTBOX_BIN" migrate --inbox "${db[@]}" >/dev/null

# The receiver: 422 for a payload marked "bad" until $work/accept exists, 200 otherwise; every
# accepted body is appended to $work/received, one line each.
hook=$(free_port)
cat >"$work/receiver.py" <<'EOF'
import http.server, os, sys
work, port = sys.argv[1], int(sys.argv[2])
class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if b'"bad"' in body and not os.path.exists(os.path.join(work, "accept")):
            self.send_response(422); self.end_headers(); self.wfile.write(b"schema check: bad payload"); return
        with open(os.path.join(work, "received"), "ab") as f: f.write(body + b"\n")
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Hook).serve_forever()
EOF
python3 "$work/receiver.py" "$work" "$hook" & pids+=($!)
wait_port "$hook"

# The relay serves the console too (--console), with the same token.
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
relay_console=$(free_port)
OUTBOX_CONSOLE_TOKEN=$token "$OUTBOX_BIN" relay "${db[@]}" --sink "http://127.0.0.1:$hook/hooks" \
  --max-attempts 2 --backoff-base 200ms --console "127.0.0.1:$relay_console" \
  >"$work/relay.log" 2>&1 & pids+=($!)

# acct-1's first payload is rejected: it fails and its key's later messages wait behind it.
psql -q -v ON_ERROR_STOP=1 "$DATABASE_URL" >/dev/null <<EOF
INSERT INTO $schema.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
VALUES ('account', 'acct-1', 'credited', '{"n": 0, "bad": true}',
        '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}');
INSERT INTO $schema.outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'account', 'acct-' || (1 + i % 3), 'credited', json_build_object('n', i)
FROM generate_series(1, 12) AS i;
EOF
failed_id=""
for _ in $(seq 1 120); do
  failed_id=$("$OUTBOX_BIN" failed "${db[@]}" --format json | python3 -c 'import json,sys; f=json.load(sys.stdin); print(f[0]["id"] if f else "")')
  [ -n "$failed_id" ] && break
  sleep 0.5
done
[ -n "$failed_id" ] || { say "the bad message never failed"; cat "$work/relay.log"; exit 1; }
say "failed: $failed_id"

port=$(free_port)
OUTBOX_CONSOLE_TOKEN=$token "$OUTBOX_BIN" console "${db[@]}" --listen "127.0.0.1:$port" \
  --sample-every 1s >"$work/console.log" 2>&1 & pids+=($!)
wait_port "$port"
sleep 2  # a few chart samples

BASE=http://127.0.0.1:$port TOKEN=$token SHOTS=$shots FLAG=$work/accept FAILED_ID=$failed_id \
  OUTBOX_BIN=$OUTBOX_BIN DATABASE_URL=$DATABASE_URL SCHEMA=$schema node $b/console.mjs

# acct-1's messages reached the receiver in order, the redriven one first.
python3 - "$work/received" <<'EOF'
import json, sys
got = []  # at least once: a duplicate may come; order is judged on first arrivals
for n in (json.loads(l)["n"] for l in open(sys.argv[1]) if l.strip()):
    if n not in got:
        got.append(n)
acct1 = [n for n in got if n % 3 == 0]
assert acct1 == sorted(acct1) and acct1[:1] == [0], f"acct-1 out of order: {acct1}"
assert sorted(got) == list(range(13)), f"{len(got)} of 13 messages arrived: {sorted(got)}"
print(f"console-browser: all 13 messages arrived, acct-1 in order: {acct1}")
EOF

# The relay's own console (--console) answers the same report, behind the same token.
curl -sf -H "Authorization: Bearer $token" "http://127.0.0.1:$relay_console/?format=json" |
  python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["failed"] == 0 and r["published"] >= 13, r; print("console-browser: the relay'"'"'s --console answers: failed 0, published", r["published"])'
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$relay_console/")
[ "$code" = 401 ] || { say "the relay's console answered $code without the token"; exit 1; }

# ---- Scene 2: hostile rows, 1,200+ failures, a route down, and the relay killed. ----

# A console that would be open to the network without a token does not start.
for bad in "--listen 0.0.0.0:$(free_port)" "--listen [::]:$(free_port)" "--token="; do
  # shellcheck disable=SC2086 # one flag and its value, split on purpose
  if env -u OUTBOX_CONSOLE_TOKEN timeout 20 "$OUTBOX_BIN" console "${db[@]}" $bad >"$work/open.log" 2>&1; then
    say "outbox console $bad started (or exited 0)"; cat "$work/open.log"; exit 1
  fi
  grep -Eq "without a token|token is empty" "$work/open.log" || { say "no clear reason for $bad:"; cat "$work/open.log"; exit 1; }
done
say "a console open to the network without a token (or with an empty one) does not start"

hdb=(--database-url "$DATABASE_URL" --schema "$hostile")
"$OUTBOX_BIN" migrate "${hdb[@]}" >/dev/null
sed "s/{schema}/$hostile/g" "$b/hostile.sql" | psql -q -v ON_ERROR_STOP=1 "$DATABASE_URL" >/dev/null

# The receiver answers 422 to everything, echoing the key and the type with markup, as a
# careless service does; the payments route goes to a port where nothing listens.
hook2=$(free_port)
cat >"$work/echo422.py" <<'PY'
import http.server, sys
class Echo(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        said = lambda h: (self.headers.get(h) or "").encode("latin-1", "replace")
        body = (b"rejected key=" + said("outbox-aggregate-id") + b" type=" + said("outbox-event-type")
                + b" <script>alert('resp')</script>")
        self.send_response(422)
        self.send_header("content-type", "text/html")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
PY
python3 "$work/echo422.py" "$hook2" & pids+=($!)
wait_port "$hook2"
dead=$(free_port)
"$OUTBOX_BIN" relay "${hdb[@]}" --sink "http://127.0.0.1:$hook2/hooks" \
  --route "event_type=payment.*; sink=http://127.0.0.1:$dead/hooks; name=payments" \
  --max-attempts 5 --backoff-base 200ms >"$work/relay2.log" 2>&1 &
relay2=$!
pids+=("$relay2")
failed=0
for _ in $(seq 1 240); do
  failed=$("$OUTBOX_BIN" status "${hdb[@]}" --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["failed"])')
  [ "$failed" -ge 1216 ] && break
  sleep 0.5
done
[ "$failed" -ge 1216 ] || { say "only $failed messages failed"; tail -20 "$work/relay2.log"; exit 1; }
say "hostile scene: $failed failed messages"

# No raw control or bidi character reaches the terminal from those rows.
"$OUTBOX_BIN" status "${hdb[@]}" >"$work/status.txt"
"$OUTBOX_BIN" failed "${hdb[@]}" --limit 2000 >"$work/failed.txt"
python3 - "$work/status.txt" "$work/failed.txt" "$work/relay2.log" <<'PY'
import sys, unicodedata
HIDDEN = set("\u061c\u200b\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2060\u2066\u2067\u2068\u2069\ufeff")
for path in sys.argv[1:]:
    text = open(path, encoding="utf-8").read()
    raw = sorted({hex(ord(c)) for c in text if c != "\n" and (unicodedata.category(c) == "Cc" or c in HIDDEN)})
    assert not raw, f"{path}: raw {raw}"
    if path.endswith("failed.txt"):
        assert "⟨ESC⟩[2J" in text and "⟨U+202E⟩" in text, f"{path}: the escapes are not shown by name"
print("console-browser: outbox status, outbox failed and the relay's log show no raw control character")
PY

port2=$(free_port)
OUTBOX_CONSOLE_TOKEN=$token "$OUTBOX_BIN" console "${hdb[@]}" --listen "127.0.0.1:$port2" \
  --sample-every 1s >"$work/console2.log" 2>&1 & pids+=($!)
wait_port "$port2"
# The docs' first example: a console on loopback without a token, which a DNS-rebinding page
# reaches under a name of its own.
port3=$(free_port)
env -u OUTBOX_CONSOLE_TOKEN "$OUTBOX_BIN" console "${hdb[@]}" --listen "127.0.0.1:$port3" \
  >"$work/console3.log" 2>&1 & pids+=($!)
wait_port "$port3"
# Another site (chat, a pager) with a link to the console.
link=$(free_port)
mkdir -p "$work/site"
printf '<!doctype html><p><a id="console" href="http://127.0.0.1:%s/failed?key=bulk-0001">the failed message</a></p>\n' \
  "$port2" >"$work/site/link.html"
python3 -m http.server "$link" --bind 127.0.0.1 --directory "$work/site" >/dev/null 2>&1 & pids+=($!)
wait_port "$link"
sleep 3 # the payments route's circuit opens; a few chart samples

BASE=http://127.0.0.1:$port2 OPEN_BASE=http://127.0.0.1:$port3 TOKEN=$token SHOTS=$shots RELAY_PID=$relay2 \
  LINK_BASE=http://localhost:$link OUTBOX_BIN=$OUTBOX_BIN DATABASE_URL=$DATABASE_URL \
  SCHEMA=$hostile node "$b/hostile.mjs"
