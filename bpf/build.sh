#!/usr/bin/env bash
# Compiles every bpf/*.bpf.c into dist/bpf/*.bpf.o. Idempotent: regenerates vmlinux.h from the running
# kernel's BTF (Debian's uapi headers are too old for the adjust_room DECAP flags) and rebuilds all.
# Usage: bash bpf/build.sh [outdir]   (default outdir: <repo>/dist/bpf; CLANG=... overrides the compiler)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/../dist/bpf}"
clang="${CLANG:-clang}"

missing=()
command -v "$clang" >/dev/null 2>&1 || missing+=("clang")
command -v bpftool >/dev/null 2>&1 || missing+=("bpftool")
[ -f /usr/include/bpf/bpf_helpers.h ] || missing+=("libbpf-dev (bpf/bpf_helpers.h)")
if [ ${#missing[@]} -gt 0 ]; then
  echo "bpf/build.sh: missing ${missing[*]}; install with: apt-get install -y clang llvm libbpf-dev bpftool" >&2
  exit 1
fi
btf="${VMLINUX_BTF:-/sys/kernel/btf/vmlinux}"
if [ ! -r "$btf" ]; then
  echo "bpf/build.sh: $btf not readable; the kernel needs CONFIG_DEBUG_INFO_BTF (or set VMLINUX_BTF)" >&2
  exit 1
fi

# Write to a temp file first so an interrupted run never leaves a truncated header behind.
bpftool btf dump file "$btf" format c > "$here/vmlinux.h.tmp"
mv "$here/vmlinux.h.tmp" "$here/vmlinux.h"

mkdir -p "$out"
shopt -s nullglob
for src in "$here"/*.bpf.c; do
  obj="$out/$(basename "${src%.c}").o"
  "$clang" -O2 -g -target bpf -D__TARGET_ARCH_x86 -Wall -Werror -I"$here" -c "$src" -o "$obj.tmp"
  mv "$obj.tmp" "$obj"
  echo "built $obj"
done
