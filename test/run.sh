#!/usr/bin/env bash
# The test command (README): installs what is missing, builds, then runs every uvu suite group as root:
# unit tests, kernel tests in network namespaces, and testbed scenarios. Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then echo "tests need root (network namespaces, eBPF)"; echo "0 passed, 1 failed"; exit 1; fi
bash install/deps.sh || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }
bash install/build.sh || { echo "build failed"; echo "0 passed, 1 failed"; exit 1; }
# The image (dist/image/tether.oci.tar) the unit image test unpacks and the container tests run.
bash install/image.sh || { echo "image failed"; echo "0 passed, 1 failed"; exit 1; }
node_modules/.bin/tsc --noEmit -p . || { echo "type check failed"; echo "0 passed, 1 failed"; exit 1; }

# Leftovers of an earlier run that was killed would confuse kernel tests: remove them first.
node_modules/.bin/tsx test/testbed/sweep.ts 2>/dev/null || true

passed=0
failed=0
logdir=$(mktemp -d /tmp/tether-test.XXXXXX)
for group in test/unit test/cni test/ipam test/kernel test/testbed; do
  [ -d "$group" ] || continue
  ls "$group"/*.test.ts >/dev/null 2>&1 || continue
  name=$(basename "$group")
  echo "== $group"
  # Testbed nodes run tetherd in the DaemonSet's container (install/'s manifest, the image, containerd + runc).
  containers=0; [ "$name" = testbed ] && containers=1
  TETHER_TESTBED_CONTAINERS=$containers NODE_DISABLE_COLORS=1 FORCE_COLOR=0 node_modules/.bin/uvu -r tsx/cjs -r "$PWD/test/lib/process-guard.js" "$group" '\.test\.ts$' 2>&1 | tee "$logdir/$name.log"
  total=$(sed -n 's/^ *Total: *\([0-9]*\).*/\1/p' "$logdir/$name.log" | tail -1)
  ok=$(sed -n 's/^ *Passed: *\([0-9]*\).*/\1/p' "$logdir/$name.log" | tail -1)
  skipped=$(sed -n 's/^ *Skipped: *\([0-9]*\).*/\1/p' "$logdir/$name.log" | tail -1)
  if [ -z "$total" ] || [ -z "$ok" ]; then
    echo "!! $group did not finish (no uvu summary): counted as one failure"
    { echo "== $group did not finish; its last lines:"; tail -n 40 "$logdir/$name.log"; } >> "$logdir/digest"
    failed=$((failed + 1))
    continue
  fi
  grep -A 12 '^ *FAIL  "' "$logdir/$name.log" | sed "s|^|$name: |" >> "$logdir/digest" || true
  # uvu's Total can leave out a test that failed (seen: Total 84, Passed 83, Skipped 1 with one FAIL), so
  # the FAIL lines count too: the larger of the two is this group's failures.
  fails=$(grep -c '^ *FAIL  "' "$logdir/$name.log" || true)
  counted=$((total - ok - ${skipped:-0}))
  [ "$fails" -gt "$counted" ] && counted=$fails
  passed=$((passed + ok))
  failed=$((failed + counted))
done
# What failed, again at the end, where a log cut to its first and last lines still shows it.
if [ -s "$logdir/digest" ]; then echo; echo "== failures"; cat "$logdir/digest"; fi
rm -rf "$logdir"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
