#!/usr/bin/env bash
# The demo command (README): installs what is missing, builds, and runs the demo on the testbed as root.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "the demo needs root (network namespaces, eBPF)"; exit 1; }
bash install/deps.sh
bash install/build.sh
exec node_modules/.bin/tsx test/demo.ts
