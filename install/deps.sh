#!/usr/bin/env bash
# Installs what building, testing and the demo need on a fresh Debian machine, only when it is missing:
# Debian packages (clang/llvm/libbpf/bpftool for eBPF, iproute2/nftables/conntrack for the kernel tests,
# the reference CNI plugins, Redis, BIRD 2 for the route-export announcement test, HAProxy as the external
# load balancer of the health-check test, kubectl for the manifests; for the node as Kubernetes makes it:
# containerd and runc (kubelet's runtime, driven over CRI), debootstrap, buildah and umoci (the image, built
# offline from Debian packages), gcc and libc6-dev (the static pause program), Go 1.19 and libcni's source
# (golden tests of the installer against libcni itself); Prometheus for its promtool (the monitoring
# component's alert rules and dashboard queries, test/unit/monitoring.test.ts)) and the npm dependencies
# from the lock file.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(clang llvm libbpf-dev libbpf1 bpftool iproute2 util-linux nftables conntrack containernetworking-plugins redis-server bird2 haproxy iputils-ping procps tcpdump
  containerd runc debootstrap buildah umoci gcc libc6-dev golang-1.19-go golang-github-appc-cni-dev prometheus)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# kubectl builds the install manifests (kubectl kustomize); Debian ships it as kubernetes-client.
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm ci when node_modules is absent or older than the lock file.
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "installing npm dependencies (npm ci)"
  npm ci --no-audit --no-fund --loglevel=error
fi

# bpffs is not mounted at boot on our machines; pins live there.
if [ "$(stat -f -c %T /sys/fs/bpf 2>/dev/null)" != "bpf_fs" ]; then
  mkdir -p /sys/fs/bpf
  mount -t bpf bpf /sys/fs/bpf
fi
