#!/usr/bin/env bash
# Builds what Tether ships, offline:
#   dist/bpf/*.o          the eBPF objects (clang)
#   dist/bin/tetherd      one Node single executable (esbuild bundle, `node --experimental-sea-config`,
#                         postject) that also answers as tether-operator, tetherctl and tether-install (links beside it)
#   dist/bin/tether       the CNI executables kubelet's runtime runs for every pod, built for start-up time
#                         with `bun build --compile` (the npm package bun carries the compiler); tether-ipam
#                         is a link to it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=dist
mkdir -p "$out/bin"

# 1. eBPF objects (bpf/build.sh generates vmlinux.h from the running kernel's BTF).
if [ -x bpf/build.sh ] || [ -f bpf/build.sh ]; then
  bash bpf/build.sh
fi

# 2. One CommonJS bundle. koffi stays external: its native module rides in the SEA as an asset and is
#    loaded by daemon/sys/ffi.ts; under plain node it is required from node_modules.
node_modules/.bin/esbuild cmd/node.ts --bundle --platform=node --target=node20 --format=cjs \
  --external:koffi --external:esbuild --alias:supports-color=./install/stubs/supports-color.js --alias:bufferutil=./install/stubs/absent-optional.js --alias:utf-8-validate=./install/stubs/absent-optional.js --alias:encoding=./install/stubs/absent-optional.js --minify --legal-comments=none --log-level=warning --outfile="$out/tetherd.js"
# tetherd's BFD thread runs its own bundle (daemon/bfd/threaded.ts loads it from the SEA asset).
node_modules/.bin/esbuild daemon/bfd/worker-main.ts --bundle --platform=node --target=node20 --format=cjs \
  --minify --legal-comments=none --log-level=warning --outfile="$out/bfd-worker.js"

# 3. The single executable.
koffi_node=$(ls node_modules/koffi/build/koffi/linux_x64/koffi.node)
cat > "$out/sea-config.json" <<JSON
{
  "main": "$root/$out/tetherd.js",
  "output": "$root/$out/sea-prep.blob",
  "disableExperimentalSEAWarning": true,
  "useSnapshot": false,
  "useCodeCache": true,
  "assets": { "koffi.node": "$root/$koffi_node", "bfd-worker.js": "$root/$out/bfd-worker.js" }
}
JSON
node --experimental-sea-config "$out/sea-config.json" >/dev/null 2>&1 || node --experimental-sea-config "$out/sea-config.json"
node_bin=$(command -v node)
tmp="$out/bin/.tetherd.tmp"
cp "$node_bin" "$tmp"
# postject chatters (and warns about ELF note names) on success: keep that in a log, show it on failure.
node_modules/.bin/postject "$tmp" NODE_SEA_BLOB "$out/sea-prep.blob" \
  --sentinel-fuse NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2 >"$out/postject.log" 2>&1 || { cat "$out/postject.log"; exit 1; }
chmod 0755 "$tmp"
rm -f "$out/bin/tetherd"
mv -f "$tmp" "$out/bin/tetherd"
for name in tether-operator tetherctl tether-install; do ln -sfn tetherd "$out/bin/$name"; done

# 4. The CNI executables: only the thin client (cmd/cni-plugin.ts), compiled with Bun. A runtime runs them
#    in whatever directory it is in: they read no .env or bunfig.toml from there (Bun's default would).
rm -f "$out/bin/tether" "$out/bin/tether-ipam"
node_modules/.bin/bun build --compile --minify --bytecode --no-compile-autoload-dotenv --no-compile-autoload-bunfig \
  cmd/cni-plugin.ts --outfile "$out/bin/.tether.tmp" >"$out/bun.log" 2>&1 || { cat "$out/bun.log"; exit 1; }
mv -f "$out/bin/.tether.tmp" "$out/bin/tether"
ln -sfn tether "$out/bin/tether-ipam"
echo "built $out/bin/tetherd ($(du -h "$out/bin/tetherd" | cut -f1); links tether-operator, tetherctl, tether-install; bundle $(du -h "$out/tetherd.js" | cut -f1)) and $out/bin/tether ($(du -h "$out/bin/tether" | cut -f1), Bun; link tether-ipam)"
