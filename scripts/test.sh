#!/usr/bin/env bash
# The project's test command: starts the services the tests talk to, then runs every test of
# the workspace against them (cargo-nextest when installed, cargo test otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/outbox-target}"
scripts/services.sh
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
else
  cargo test --workspace --no-fail-fast "$@"
fi
