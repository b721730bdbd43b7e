#!/usr/bin/env bash
# The whole suite: as the current user; then, when run as root, the sandbox suites again as an
# unprivileged user (CAPSULE_TEST_USER, default capsule-test, created if missing), since a
# rootless sandbox maps ids, mounts and degrades differently.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PYTHONDONTWRITEBYTECODE=1

"$VENV/bin/pytest" -q -m "not soak" tests

if [ "$(id -u)" = 0 ] && [ "${CAPSULE_SKIP_ROOTLESS:-0}" != 1 ]; then
  user=${CAPSULE_TEST_USER:-capsule-test}
  if ! id "$user" >/dev/null 2>&1; then
    echo "creating the unprivileged test user $user"
    useradd --create-home --shell /bin/sh "$user"
  fi
  # The user must reach the venv and the sources: open the parent directories for traversal.
  dir=$PWD
  while [ "$dir" != / ]; do
    if ! runuser -u "$user" -- test -x "$dir"; then
      echo "granting o+x on $dir so that $user can reach the checkout"
      chmod o+x "$dir"
    fi
    dir=$(dirname "$dir")
  done
  echo "== rootless suite, as $user"
  runuser -u "$user" -- env CAPSULE_TEST_STRICT="${CAPSULE_TEST_STRICT:-0}" PYTHONDONTWRITEBYTECODE=1 \
    HOME="$(getent passwd "$user" | cut -d: -f6)" \
    "$VENV/bin/pytest" -q -p no:cacheprovider -m "not soak" tests
fi
