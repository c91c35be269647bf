#!/usr/bin/env bash
# Builds a past release of Tether from this repository's own history, offline, for the upgrade test:
#   bash install/build-release.sh COMMIT [DIR]
# DIR (default /var/cache/tether-release/COMMIT) gets the commit's tree (git archive), its node_modules (this
# checkout's, linked, when the two lock files name the same packages; else `npm ci`), then that tree's own
# install/build.sh and install/image.sh: DIR/dist/bin (tetherd, tether, tether-ipam, tetherctl) and
# DIR/dist/image/tether.oci.tar, as that release shipped them. A finished build is kept (DIR/.done) and reused.
# Prints DIR on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

commit=${1:?usage: install/build-release.sh COMMIT [DIR]}
full=$(git rev-parse --verify --quiet "$commit^{commit}") || {
  echo "build-release: $commit is not a commit of this repository (a shallow clone? fetch its history)" >&2
  exit 1
}
dir=${2:-/var/cache/tether-release/$full}
if [ -f "$dir/.done" ] && [ "$(cat "$dir/.done")" = "$full" ]; then echo "$dir"; exit 0; fi

mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if [ -f "$dir/.done" ] && [ "$(cat "$dir/.done")" = "$full" ]; then echo "$dir"; exit 0; fi
rm -rf "$dir"
mkdir -p "$dir"
git archive --format=tar "$full" | tar -x -C "$dir"

# The lock files without their own version fields: equal means the same packages at the same versions.
same_deps=$(node -e '
  const fs = require("fs");
  const strip = (f) => { const l = JSON.parse(fs.readFileSync(f, "utf8")); delete l.version; if (l.packages?.[""]) delete l.packages[""].version; return JSON.stringify(l); };
  process.stdout.write(String(strip(process.argv[1]) === strip(process.argv[2])));' "$root/package-lock.json" "$dir/package-lock.json")
if [ "$same_deps" = true ] && [ -d "$root/node_modules" ]; then
  ln -s "$root/node_modules" "$dir/node_modules"
else
  echo "build-release: $full's package-lock.json differs from this checkout's: npm ci in $dir" >&2
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) >&2
fi
(cd "$dir" && bash install/build.sh && bash install/image.sh) >&2
echo "$full" >"$dir/.done"
echo "$dir"
