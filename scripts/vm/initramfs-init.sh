#!/bin/busybox sh
# /init of the VM layer's initramfs (scripts/vm/kernels.mjs builds it): loads the modules that
# mount the host's root filesystem (virtio-9p, read-only), puts a tmpfs overlay on top of it and
# switch_roots into it, running scripts/vm/guest-init.sh of the checkout (ivc_init= on the kernel
# command line, which the kernel passes here as an environment variable). Any failure powers off:
# the runner finds no exit status and reports the console's last lines.
/bin/busybox --install -s /bin
export PATH=/bin
fail() {
  echo "initramfs: $*" >&2
  echo o >/proc/sysrq-trigger
  sleep 5
  exit 1
}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
while read -r m; do
  insmod "/modules/$m" || fail "insmod $m failed"
done </modules/order
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /lower || fail "mounting the host's root (9p) failed"
mount -t tmpfs -o mode=0755 overlay-upper /upper || fail "tmpfs for the overlay failed"
mkdir -p /upper/upper /upper/work
mount -t overlay -o lowerdir=/lower,upperdir=/upper/upper,workdir=/upper/work overlay /newroot || fail "overlay failed"
[ -n "$ivc_init" ] || fail "no ivc_init= on the kernel command line"
[ -f "/newroot$ivc_init" ] || fail "$ivc_init is not in the host's root filesystem"
umount /proc /sys
mount --move /dev /newroot/dev || umount /dev
exec switch_root /newroot /bin/sh "$ivc_init"
