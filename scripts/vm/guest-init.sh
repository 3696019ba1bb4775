#!/bin/sh
# PID 1 of a VM layer guest, after the initramfs switch_rooted into the host's root filesystem
# (read-only 9p under a tmpfs overlay; nothing written here reaches the host). Mounts what a
# node has, makes the Debian kernel's own module tree /lib/modules/$(uname -r), loads the modules
# the tests need, then runs the command the runner left in the results share (scripts/vm/run.mjs)
# with its stdout on ttyS1 and its stderr on ttyS2, writes its exit status beside it and powers off.
# Kernel command line values reach here as environment variables: ivc_modules (the module tree on
# the host's root).
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
off() {
  sync
  echo o >/proc/sysrq-trigger
  sleep 30
}
say() { echo "guest-init: $*" >/dev/console; }
mount -t proc proc /proc
mount -t sysfs sysfs /sys
[ -e /dev/null ] || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run
# /tmp stays the host's, under the overlay (writes stay in the guest): a checkout there, as CI's
# may be, must be found.
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
release=$(uname -r)
mkdir -p "/lib/modules/$release"
mount --bind "$ivc_modules" "/lib/modules/$release" || say "no module tree at $ivc_modules"
mkdir -p /run/ivc-results
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 results /run/ivc-results; then
  say "the results share did not mount"
  off
fi
hostname ivc-guest
ip link set lo up
# What the backends, kube-proxy's IPVS and the tests use; autoloading covers the rest. One
# modprobe for all: a process costs about a second in this guest.
modprobe -a ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh nf_conntrack nf_nat nf_tables nft_chain_nat nft_ct \
  nft_nat nft_masq nft_redir nft_compat nft_fib_inet nft_fib_ipv4 nft_fib_ipv6 nft_reject_inet \
  ip_tables ip6_tables iptable_nat ip6table_nat iptable_filter ip6table_filter iptable_mangle \
  ip6table_mangle iptable_raw ip6table_raw ipt_MASQUERADE xt_MASQUERADE xt_mark xt_comment \
  xt_conntrack xt_addrtype xt_multiport xt_set xt_nat xt_tcpudp xt_statistic xt_physdev xt_CT \
  ip_set ip_set_hash_ip ip_set_hash_ipport ip_set_hash_net ip_set_hash_ipportip \
  ip_set_hash_ipportnet nf_conntrack_netlink bridge br_netfilter veth dummy virtio_rng \
  2>>/run/ivc-results/modules-missing
# The command's stdout and stderr go to serial ports of their own, raw (no \r added).
stty -F /dev/ttyS1 raw -echo 2>/dev/null
stty -F /dev/ttyS2 raw -echo 2>/dev/null
echo booted >/run/ivc-results/booted
sh /run/ivc-results/command </dev/null >/dev/ttyS1 2>/dev/ttyS2
echo $? >/run/ivc-results/status.tmp
mv /run/ivc-results/status.tmp /run/ivc-results/status
umount /run/ivc-results
off
