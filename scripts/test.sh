#!/usr/bin/env bash
# The project's test command: starts the services the tests talk to, then runs every test of
# the workspace against them (cargo-nextest when installed, cargo test otherwise). Tests whose
# names start with `disruptive_` restart shared services (PostgreSQL), and tests whose names
# start with `measured_` measure what a statement costs, or read the server's transactions,
# on a server nothing else is using, so both run afterwards, one at a time, when nothing else
# is running.
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/outbox-target}"
scripts/services.sh || exit 1
rc=0
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast -E 'not test(/(^|::)(disruptive|measured)_/)' "$@" || rc=$?
  cargo nextest run --workspace --no-fail-fast -E 'test(/(^|::)(disruptive|measured)_/)' --test-threads 1 "$@" || rc=$?
else
  cargo test --workspace --no-fail-fast "$@" -- --skip disruptive_ --skip measured_ || rc=$?
  cargo test --workspace --no-fail-fast "$@" disruptive_ -- --test-threads 1 || rc=$?
  cargo test --workspace --no-fail-fast "$@" measured_ -- --test-threads 1 || rc=$?
fi
exit $rc
