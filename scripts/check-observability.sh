#!/usr/bin/env bash
# The observability files CI checks (wired into .ci/run by its owner): the Prometheus alert
# rules (`promtool check rules`), their unit tests (`promtool test rules`: every rule has
# tests), and the Grafana dashboard (every panel's queries name only exported metrics, per
# docs/operations.md, or per live scrapes when OUTBOX_SCRAPE_DIR holds the `*.prom` files the
# observability tests save). Installs promtool (Debian's `prometheus` package; nothing starts the
# server) when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null 2>&1; then
    echo "installing promtool (Debian package prometheus)"
    apt-get update -q >/dev/null
    # The package's service is not started: containers here have no init system, and nothing
    # below needs a server.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null
fi

promtool check rules deploy/prometheus/alerts.yml
# `promtool test rules` resolves rule_files relative to the test file.
promtool test rules deploy/prometheus/alerts.test.yml

scrapes=()
if [ -n "${OUTBOX_SCRAPE_DIR:-}" ] && compgen -G "$OUTBOX_SCRAPE_DIR/*.prom" >/dev/null; then
    for f in "$OUTBOX_SCRAPE_DIR"/*.prom; do scrapes+=(--scrape "$f"); done
fi
python3 scripts/check_dashboard.py "${scrapes[@]}" deploy/grafana/outbox.json
