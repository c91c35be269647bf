#!/usr/bin/env bash
# Builds the image the DaemonSet runs, offline, into an OCI archive:
#   bash install/image.sh        → dist/image/tether.oci.tar (tag ghcr.io/tether-cni/tether:<version>)
# Steps: dist/ (install/build.sh, only when dist/bin/tetherd is missing); the Debian base
# (install/image-base.sh, cached under /var/cache/tether-image); the base imported into buildah as
# localhost/tether-base:bookworm; install/Dockerfile built on it with `buildah bud`; the result pushed to
# the archive. Load it on a node with `ctr -n k8s.io images import dist/image/tether.oci.tar`.
# Timestamps are SOURCE_DATE_EPOCH (default 0) so the same inputs give the same layer digests.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "image: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "needs root (debootstrap, buildah's chroot isolation)"
for c in buildah debootstrap; do command -v "$c" >/dev/null || fail "$c is not installed (bash install/deps.sh installs it)"; done

export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}
CACHE=${TETHER_IMAGE_CACHE:-/var/cache/tether-image}
VERSION=$(node -p 'require("./package.json").version')
IMAGE=ghcr.io/tether-cni/tether:$VERSION
BASE=localhost/tether-base:bookworm
OUT=dist/image/tether.oci.tar
t0=$(date +%s)

[ -x dist/bin/tetherd ] || bash install/build.sh
for f in dist/bin/tetherd dist/bin/tether; do [ -x "$f" ] || fail "$f is missing after install/build.sh"; done
ls dist/bpf/*.o >/dev/null 2>&1 || fail "dist/bpf holds no eBPF objects (install/build.sh compiles them)"

base_tar=$(bash install/image-base.sh)
# The tarball's key and its content hash: TETHER_IMAGE_REBUILD_BASE=1 changes the content under one key.
base_key="$(basename "$base_tar" .tar)-$(sha256sum "$base_tar" | cut -c1-12)"

# buildah gets its own storage and configuration under the cache: nothing is shared with other buildah
# users on the machine, and its network configuration (buildah would otherwise create cni.lock in
# /etc/cni/net.d, the directory the node's runtime loads) lives in the cache too. No step needs a network.
mkdir -p "$CACHE/cni" "$CACHE/storage"
cat >"$CACHE/containers.conf" <<CONF
[network]
network_backend = "cni"
network_config_dir = "$CACHE/cni"
default_network = "tether-image-none"
CONF
export CONTAINERS_CONF="$CACHE/containers.conf"
# An empty registries configuration: a name that is not in local storage fails instead of being pulled.
: >"$CACHE/registries.conf"
export CONTAINERS_REGISTRIES_CONF="$CACHE/registries.conf"
export BUILDAH_ISOLATION=chroot
# overlay where the kernel has it (fast, layers shared); vfs (full copies) otherwise.
driver=vfs
grep -qw overlay /proc/filesystems && driver=overlay
bh() { buildah --root "$CACHE/storage" --runroot /run/tether-image --storage-driver "$driver" "$@"; }

# The base image is re-imported only when the tarball changed: its label carries the tarball's key.
exec 9>"$CACHE/buildah.lock"
flock 9
have=$(bh inspect --type image --format '{{index .OCIv1.Config.Labels "io.tether.base"}}' "$BASE" 2>/dev/null || true)
if [ "$have" != "$base_key" ]; then
  ctr=$(bh from --pull-never scratch)
  bh add "$ctr" "$base_tar" / >/dev/null
  bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label "io.tether.base=$base_key" --created-by "install/image-base.sh ($base_key)" "$ctr"
  bh commit --quiet --timestamp "$SOURCE_DATE_EPOCH" --rm "$ctr" "$BASE" >/dev/null
  # The base it replaces (now untagged) would otherwise stay in the cache's storage for good.
  bh rmi --prune >/dev/null 2>&1 || true
  echo "image: imported $base_key as $BASE"
fi

# The context is read while buildah copies it: if install/build.sh rewrites dist/ meanwhile (another
# build in the same tree), the image would mix two builds. Hash the inputs before and after to know.
inputs() { find dist/bin dist/bpf -maxdepth 1 \( -type f -o -type l \) -printf '%p %l\n' | sort; sha256sum dist/bin/tetherd dist/bin/tether dist/bpf/*.o; }
before=$(inputs)
# chroot isolation: the one RUN (symlinks) needs no namespaces of its own; buildah refuses --network none
# with it, so the step shares the host's network, and nothing in the Dockerfile fetches anything.
# --no-hosts and --dns=none: otherwise the RUN step leaves empty /etc/hosts and /etc/resolv.conf (its
# mount points) in the layer, where the runtime's own must be the only ones.
bh bud --quiet --isolation chroot --pull-never --layers=false --no-hosts --dns=none \
  --timestamp "$SOURCE_DATE_EPOCH" --label "org.opencontainers.image.version=$VERSION" -f install/Dockerfile -t "$IMAGE" . >/dev/null
[ "$(inputs)" = "$before" ] || fail "dist/bin or dist/bpf changed during the build (install/build.sh running at the same time?): run again"
# Pushed as an OCI layout and tarred here rather than pushed as oci-archive: buildah's archive carries
# the push's wall-clock mtimes, so two identical images would give two different archives.
layout=$(mktemp -d "$CACHE/layout.XXXXXX")
trap 'rm -rf "$layout"' EXIT
bh push --quiet "$IMAGE" "oci:$layout:$IMAGE"
# The archive is the product; the built image need not stay in the cache's storage (the base does).
bh rmi "$IMAGE" >/dev/null
mkdir -p dist/image
tar -C "$layout" --sort=name --format=ustar --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
  -cf "$OUT.tmp" oci-layout index.json blobs
mv -f "$OUT.tmp" "$OUT"

# Digests say whether two builds of the same inputs gave the same image (the manifest and layers are what
# a node pulls and compares; the archive's sha256 is the whole file's).
manifest=$(tar -xOf "$OUT" index.json | node -e 'const i=JSON.parse(require("fs").readFileSync(0,"utf8")); console.log(i.manifests[0].digest)')
layers=$(tar -xOf "$OUT" "blobs/sha256/${manifest#sha256:}" | node -e 'const m=JSON.parse(require("fs").readFileSync(0,"utf8")); console.log(m.layers.map((l)=>l.digest.slice(7,19)+" "+(l.size/1048576).toFixed(1)+" MB").join(", "))')
echo "image: $OUT ($(du -h "$OUT" | cut -f1), $(stat -c %s "$OUT") bytes) $IMAGE in $(($(date +%s) - t0)) s"
echo "image: manifest $manifest; layers $layers; archive sha256 $(sha256sum "$OUT" | cut -c1-16)"
