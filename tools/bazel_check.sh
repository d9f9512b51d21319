#!/usr/bin/env bash
# Checks the Bazel build of keras-elastic offline: `bazel query //...` lists the
# targets and `bazel build //...` builds them (no test runs: they need the
# Python interpreter with TensorFlow, see .bazelrc).
#
# Usage: tools/bazel_check.sh [--install] [--install-only]
#   --install       when `bazel` is missing, install Debian's bazel-bootstrap
#                   (Bazel 4.2) with apt-get first (needs root).
#   --install-only  only that: install Bazel if missing, check nothing (CI
#                   installs it while the tests run).
# Under CI (CI=true) the Bazel server is shut down at the end.
set -euo pipefail

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }

install=0
install_only=0
for arg in "$@"; do
  case "$arg" in
    --install) install=1 ;;
    --install-only) install=1; install_only=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bazel_check: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v bazel >/dev/null 2>&1; then
  if [ "$install" != 1 ]; then
    echo "bazel_check: 'bazel' is not on PATH. Install Debian's bazel-bootstrap" \
         "(apt-get install bazel-bootstrap), or run: tools/bazel_check.sh --install" >&2
    exit 1
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "bazel_check: --install runs apt-get, which needs root (run as root or" \
         "install bazel-bootstrap yourself)" >&2
    exit 1
  fi
  echo "bazel_check: installing bazel-bootstrap with apt-get"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q bazel-bootstrap >/dev/null
fi
if [ "$install_only" = 1 ]; then
  echo "bazel_check: $(command -v bazel) is installed"
  exit 0
fi

start=$(date +%s)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! targets=$(bazel query //... 2>"$log"); then
  cat "$log" >&2
  echo "bazel_check: 'bazel query //...' failed" >&2
  exit 1
fi
count=$(printf '%s\n' "$targets" | grep -c '^//' || true)
echo "bazel_check: bazel query //... lists $count targets"
printf '%s\n' "$targets" | sed 's/^/  /'

if ! bazel build //...; then
  echo "bazel_check: 'bazel build //...' failed" >&2
  exit 1
fi
echo "bazel_check: query + build of $count targets passed in $(( $(date +%s) - start )) s"

if [ "${CI:-}" = "true" ]; then
  # Leave no Bazel server running after a CI run (cleanup only: not a check).
  bazel shutdown || true
fi
