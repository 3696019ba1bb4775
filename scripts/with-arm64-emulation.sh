#!/usr/bin/env bash
# Runs a command with arm64 executables runnable on this (amd64) machine through QEMU user
# emulation: Debian's qemu-user-static and its binfmt handler `qemu-aarch64`.
#
#   bash scripts/with-arm64-emulation.sh CMD [ARGS...]          (root)
#
# The handler is registered in the kernel's binfmt_misc, which must be mounted for that. The
# mount is made in a private mount namespace that lives as long as CMD, never on the machine:
# on this kernel (6.x) binfmt_misc keeps its handlers only while a mount of it exists, so the
# handler goes when CMD ends, and the machine's mounts are never changed. While CMD runs the
# handler applies to every process (the kernel's table is per user namespace, not per mount
# namespace): buildah's chroots and podman's containers started by CMD run arm64 binaries too.
# The handler has the flags F and P (qemu-user-static's defaults): the interpreter is opened once,
# at registration, so it works inside chroots and containers that do not carry QEMU.
#
# Where a handler is already registered and enabled (a machine set up by hand, or with
# systemd-binfmt), it is used as it is. On an arm64 machine CMD runs directly.
set -euo pipefail

[ "$#" -gt 0 ] || {
  echo 'usage: with-arm64-emulation.sh CMD [ARGS...]' >&2
  exit 2
}
if [ "$(uname -m)" = aarch64 ]; then exec "$@"; fi
[ "$(id -u)" -eq 0 ] || {
  echo 'with-arm64-emulation: needs root (mounting binfmt_misc, registering the QEMU handler)' >&2
  exit 1
}
for tool in unshare update-binfmts; do
  command -v "$tool" >/dev/null || {
    echo "with-arm64-emulation: $tool is missing (bash scripts/install-system-packages.sh installs qemu-user-static and binfmt-support)" >&2
    exit 1
  }
done
[ -e /usr/share/binfmts/qemu-aarch64 ] || {
  echo 'with-arm64-emulation: qemu-user-static is not installed (bash scripts/install-system-packages.sh)' >&2
  exit 1
}

# Inside the private mount namespace: mount binfmt_misc unless it is mounted, enable the handler
# unless it is enabled, say which, then run the command.
exec unshare --mount --propagation private -- bash -c '
  set -euo pipefail
  dir=/proc/sys/fs/binfmt_misc
  [ -e "$dir/status" ] || mount -t binfmt_misc binfmt_misc "$dir"
  if [ "$(head -1 "$dir/qemu-aarch64" 2>/dev/null)" = enabled ]; then
    echo "with-arm64-emulation: qemu-aarch64 is registered already" >&2
  else
    update-binfmts --enable qemu-aarch64 >&2
    echo "with-arm64-emulation: qemu-aarch64 registered for this command ($(sed -n "s/^flags: //p" "$dir/qemu-aarch64"))" >&2
  fi
  exec "$@"
' with-arm64-emulation "$@"
