#!/usr/bin/env bash
# The image's base, made here from Debian 12 packages with no registry: `debootstrap --variant=minbase`
# from the Debian mirror apt already uses on this machine, brought up to bookworm-updates and
# bookworm-security, stripped of what a container never reads, and written as a tar with fixed mtimes,
# owners and order so the same packages give the same bytes.
#   bash install/image-base.sh            prints the path of the cached tarball (builds it when missing)
# The cache (TETHER_IMAGE_CACHE, default /var/cache/tether-image) is keyed by a hash of this script, the
# package list, the architecture and SOURCE_DATE_EPOCH: a second run takes no time. The key does not
# change when Debian publishes updates: TETHER_IMAGE_REBUILD_BASE=1 rebuilds from the mirror.
set -euo pipefail

# What tetherd needs at run time besides libc: libbpf.so.1 (loaded through koffi), nft (the gateway pod's
# NAT, run through nsenter from util-linux; util-linux is Essential in bookworm, listed to say it is
# needed). iproute2 (ip, tc, ss) is for debugging a node from the container and costs about 6 MB.
PACKAGES=(libbpf1 nftables util-linux iproute2)
SUITE=bookworm
ARCH=${TETHER_IMAGE_ARCH:-$(dpkg --print-architecture)}
SDE=${SOURCE_DATE_EPOCH:-0}
# Exported so the tools that honour it (dpkg, shadow's pwconv) see the same value however this is called.
export SOURCE_DATE_EPOCH=$SDE
CACHE=${TETHER_IMAGE_CACHE:-/var/cache/tether-image}

fail() { echo "image-base: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "needs root (debootstrap, chroot)"
command -v debootstrap >/dev/null || fail "debootstrap is not installed (bash install/deps.sh installs it)"
[ "$ARCH" = "$(dpkg --print-architecture)" ] ||
  fail "TETHER_IMAGE_ARCH=$ARCH differs from this machine's $(dpkg --print-architecture): debootstrap's second stage runs the target's binaries, which needs qemu-user-static and binfmt_misc (not set up here) or a native builder"

# The mirrors apt uses, as apt itself resolves them (one-line and deb822 sources alike).
mirror_for() {
  apt-get indextargets --format '$(RELEASE) $(REPO_URI)' 'Identifier: Packages' 2>/dev/null |
    awk -v s="$1" '$1 == s { print $2; exit }'
}
MIRROR=$(mirror_for "$SUITE")
UPDATES=$(mirror_for "$SUITE-updates")
SECURITY=$(mirror_for "$SUITE-security")
[ -n "$MIRROR" ] || fail "apt has no source for suite $SUITE (/etc/apt/sources.list*); run apt-get update or add one"

key=$( { cat "$0"; echo "${PACKAGES[*]} $SUITE $ARCH $SDE"; } | sha256sum | cut -c1-16)
out="$CACHE/base-$SUITE-$ARCH-$key.tar"
mkdir -p "$CACHE"
# Two builds at once (two test runs) share the cache: one builds, the other waits and reuses.
exec 9>"$CACHE/base.lock"
flock 9
if [ -s "$out" ] && [ -z "${TETHER_IMAGE_REBUILD_BASE:-}" ]; then echo "$out"; exit 0; fi

work=$(mktemp -d "$CACHE/work.XXXXXX")
root="$work/rootfs"
cleanup() {
  # A failed run may leave the chroot's /proc mounted: unmount before removing, never follow it.
  mountpoint -q "$root/proc" 2>/dev/null && umount -l "$root/proc"
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

t0=$(date +%s)
echo "image-base: debootstrap --variant=minbase $SUITE ($ARCH) with ${PACKAGES[*]}" >&2
include=$(IFS=,; echo "${PACKAGES[*]}")
debootstrap --variant=minbase --arch="$ARCH" --components=main --include="$include" \
  "$SUITE" "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 || { tail -30 "$work/debootstrap.log" >&2; fail "debootstrap failed (log above)"; }

# debootstrap installs the suite as released; point releases and security fixes come from the other two.
{
  echo "deb $MIRROR $SUITE main"
  [ -z "$UPDATES" ] || echo "deb $UPDATES $SUITE-updates main"
  [ -z "$SECURITY" ] || echo "deb $SECURITY $SUITE-security main"
} >"$root/etc/apt/sources.list"
mount -t proc proc "$root/proc"
chroot_apt() { chroot "$root" env DEBIAN_FRONTEND=noninteractive LC_ALL=C apt-get -qq -o Dpkg::Use-Pty=0 "$@"; }
chroot_apt update >"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; fail "apt-get update in the base failed"; }
chroot_apt -y upgrade >>"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; fail "apt-get upgrade in the base failed"; }
chroot_apt clean
umount "$root/proc"

# What the image was made of, kept beside the tarball (and in it) for whoever audits the image.
chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' | sort >"$work/packages.txt"

# Strip what a container never reads. Copyright files stay (the licences travel with the binaries).
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/usr/share/man "$root"/usr/share/info "$root"/usr/share/groff "$root"/usr/share/lintian \
  "$root"/usr/share/bug "$root"/usr/share/linda
find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
# Files that record when or where the build ran, not what it holds.
find "$root/var/log" -type f -delete
rm -f "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old "$root"/var/cache/ldconfig/aux-cache \
  "$root"/etc/resolv.conf "$root"/etc/hostname "$root"/etc/*- "$root"/var/lib/dpkg/lock* \
  "$root"/var/cache/apt/archives/lock "$root"/var/lib/apt/lists/lock
rm -rf "$root"/tmp/* "$root"/var/tmp/* "$root"/run/*
# The runtime provides hostname and resolv.conf; empty machine-id as systemd expects in images.
: >"$root/etc/hostname"
[ ! -e "$root/etc/machine-id" ] || : >"$root/etc/machine-id"
# shadow's third field is the day the password last changed: the build day, or empty when pwconv saw
# SOURCE_DATE_EPOCH=0. Empty (no password aging; every account here is locked) whichever way it ran.
sed -i -E "s/^([^:]*:[^:]*:)[0-9]*:/\1:/" "$root/etc/shadow"
mkdir -p "$root/usr/share/tether"
cp "$work/packages.txt" "$root/usr/share/tether/base-packages.txt"

# Fixed order, owners and mtimes; no atime/ctime in the pax headers.
tar -C "$root" --sort=name --format=posix --numeric-owner \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  --mtime="@$SDE" -cf "$work/base.tar" .
mv -f "$work/packages.txt" "${out%.tar}.packages"
mv -f "$work/base.tar" "$out"
# Bases of earlier keys (an older script or package list) are dead weight: keep only this one.
for old in "$CACHE/base-$SUITE-$ARCH-"*.tar; do
  [ "$old" = "$out" ] || rm -f "$old" "${old%.tar}.packages"
done
echo "image-base: $out ($(du -h "$out" | cut -f1), sha256 $(sha256sum "$out" | cut -c1-16), $(($(date +%s) - t0)) s)" >&2
echo "$out"
