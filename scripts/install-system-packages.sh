#!/usr/bin/env bash
# Installs the Debian packages ipvs-node-controller needs to build, run and test (as root).
# Packages that are already installed are left alone; nothing else on the machine is changed.
set -euo pipefail

packages=(
  nftables libnftables-dev      # nft backend: CLI and in-process libnftables
  libnftnl-dev libmnl-dev       # nft backend: map element writes as netlink batches (the addon)
  iptables                      # iptables backend (legacy and nft variants)
  libbpf-dev clang llvm bpftool # eBPF backend: loader library, BPF compiler, inspection
  pkg-config make g++ python3   # native addon build (node-gyp)
  iproute2 conntrack socat      # kernel tests: network namespaces, veth, probes; conntrack also at run time
  openssl                       # API stand-in certificates in tests and the demo
  prometheus                    # promtool and a real scrape in the metrics tests
  podman buildah runc           # the image build (npm run image) and the container tests
  debootstrap curl              # the local base images (scripts/local-base-images.sh)
  qemu-user-static binfmt-support # the arm64 image, built and run under emulation (scripts/with-arm64-emulation.sh)
  qemu-system-x86 cpio kmod busybox-static xz-utils # the VM layer: Debian's kernels booted in QEMU (scripts/vm/)
  ipvsadm ipset                 # the VM layer: real IPVS and kube-proxy's sets in the guests
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "system packages: all present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "system packages missing: ${missing[*]} (run this script as root, or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "system packages: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
