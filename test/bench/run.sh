#!/usr/bin/env bash
# The benchmark command: installs what is missing, builds, runs each benchmark on the testbed.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "benchmarks need root"; exit 1; }
bash install/deps.sh
bash install/build.sh
node_modules/.bin/tsx test/bench/cni-latency.ts
node_modules/.bin/tsx test/bench/ipam.ts
node_modules/.bin/tsx test/bench/egress-failover.ts
