#!/usr/bin/env bash
# The benchmark command: installs what is missing, builds, runs each benchmark on the testbed.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "benchmarks need root"; exit 1; }
bash install/deps.sh
bash install/build.sh
# The sync benchmark compares with conntrackd (FTFW), which only the benchmark needs.
command -v conntrackd >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq conntrackd >/dev/null; }
# The load balancer benchmark measures throughput with iperf3.
command -v iperf3 >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 >/dev/null; }
# The image's size (and build time): builds dist/image/tether.oci.tar as the tests do.
node_modules/.bin/tsx test/bench/image.ts
node_modules/.bin/tsx test/bench/cni-latency.ts
node_modules/.bin/tsx test/bench/cri.ts
node_modules/.bin/tsx test/bench/node-container.ts
node_modules/.bin/tsx test/bench/ipam.ts
node_modules/.bin/tsx test/bench/config-latency.ts
node_modules/.bin/tsx test/bench/egress-failover.ts
node_modules/.bin/tsx test/bench/egress-failover-families.ts
node_modules/.bin/tsx test/bench/egress-multi.ts
node_modules/.bin/tsx test/bench/lb.ts
node_modules/.bin/tsx test/bench/lb-families.ts
node_modules/.bin/tsx test/bench/lb-switch.ts
node_modules/.bin/tsx test/bench/lb-record.ts
node_modules/.bin/tsx test/bench/health.ts
node_modules/.bin/tsx test/bench/bfd-lag.ts
node_modules/.bin/tsx test/bench/conntrack-sync-vs-conntrackd.ts
node_modules/.bin/tsx test/bench/conntrack-sync-families.ts
