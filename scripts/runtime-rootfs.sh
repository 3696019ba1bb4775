#!/bin/sh
# Assembles the runtime image's root filesystem in DIR from Debian packages installed in the
# stage that runs it (the Dockerfile's `runtime-root` stage): the named packages and every
# package they depend on, and nothing else. No apt, no dpkg, no shell: the image runs `node` and
# the commands the backends call (nft, iptables, conntrack), and the libraries those load.
#
#   sh scripts/runtime-rootfs.sh DIR PACKAGE...
#
# What goes in:
# - the files of each package (dpkg -L), documentation excepted but its copyright files kept,
#   and glibc's iconv modules (gconv) left out;
# - the usr-merge links of / (bin, sbin, lib, lib64 -> usr/...): the dynamic loader is found
#   through them;
# - the alternatives links of those packages (iptables -> /etc/alternatives/iptables ->
#   xtables-nft-multi), which update-alternatives made and dpkg -L does not list;
# - /var/lib/dpkg/status holding the stanzas of exactly these packages: no dpkg reads it here,
#   but image scanners do, and the release's SBOM is made from it (scripts/release.mjs);
# - /etc/os-release (of base-files, whose other files are not needed): which Debian this is, for
#   scanners;
# - /etc/passwd and /etc/group with root and nobody, empty /etc/hosts, /etc/resolv.conf and
#   /etc/hostname for the runtime to mount over, and /tmp.
# Prints the packages, one per line, on stdout.
#
# Packages that the closure would drag in but that nothing here runs are refused, so that the
# image cannot grow a package manager or a shell by a dependency changing: the build then fails
# naming the package.
set -eu

dir=$1
shift
[ "$#" -gt 0 ] || {
  echo 'usage: runtime-rootfs.sh DIR PACKAGE...' >&2
  exit 2
}
refused='apt dpkg debconf perl-base bash dash coreutils util-linux login passwd'

# The dependency closure over Depends and Pre-Depends, among the installed packages: of
# alternatives (a | b) the first one installed; version constraints and :any dropped.
closure=$(mktemp)
queue="$*"
: >"$closure"
while [ -n "$queue" ]; do
  next=''
  for p in $queue; do
    grep -qx "$p" "$closure" && continue
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
      echo "runtime-rootfs: $p is not installed" >&2
      exit 1
    fi
    for r in $refused; do
      [ "$p" = "$r" ] && {
        echo "runtime-rootfs: $p would enter the runtime image (a dependency of: $*); refused" >&2
        exit 1
      }
    done
    echo "$p" >>"$closure"
    deps=$(dpkg-query -W -f='${Pre-Depends}, ${Depends}' "$p" | tr ',' '\n')
    for alternatives in $(echo "$deps" | sed -e 's/([^)]*)//g' -e 's/:any//g' -e 's/ //g'); do
      chosen=''
      for a in $(echo "$alternatives" | tr '|' ' '); do
        if dpkg-query -W -f='${Status}' "$a" 2>/dev/null | grep -q 'install ok installed'; then
          chosen=$a
          break
        fi
        # A virtual package (awk): the installed package that provides it.
        chosen=$(dpkg-query -W -f='${Package} ${Status} ${Provides}\n' 2>/dev/null |
          awk -v want="$a" '$2 == "install" && $4 == "installed" {
            for (i = 5; i <= NF; i++) { sub(/,$/, "", $i); if ($i == want) { print $1; exit } } }')
        [ -n "$chosen" ] && break
      done
      [ -n "$chosen" ] || {
        echo "runtime-rootfs: no installed package satisfies '$alternatives' (for $p)" >&2
        exit 1
      }
      next="$next $chosen"
    done
  done
  queue=$next
done
packages=$(sort "$closure")
rm -f "$closure"

mkdir -p "$dir"
for link in bin sbin lib lib32 lib64 libx32; do
  if [ -L "/$link" ]; then
    cp -a "/$link" "$dir/$link"
    mkdir -p "$dir/$(readlink "/$link")"
  fi
done

# The packages' files (not their directories: those are made as needed), as they are installed.
files=$(mktemp)
for p in $packages; do
  dpkg-query -L "$p" | while IFS= read -r f; do
    case "$f" in
      /usr/share/doc/*/copyright) ;;
      /usr/share/doc/* | /usr/share/man/* | /usr/share/info/* | /usr/share/lintian/* | /usr/share/locale/*) continue ;;
      # glibc's character set converters (iconv): nothing here converts character sets, and they
      # are the largest part of libc6 (8 MB on amd64, 20 MB on arm64).
      */gconv/*) continue ;;
    esac
    if [ -L "$f" ] || { [ -e "$f" ] && [ ! -d "$f" ]; }; then echo "${f#/}"; fi
  done
done >"$files"
# Through a file, not a pipe: sh has no pipefail, and a file that cannot be copied must fail.
tar -C / -c --no-recursion -f "$files.tar" -T "$files"
tar -C "$dir" -x --keep-directory-symlink -f "$files.tar"
rm -f "$files" "$files.tar"

# Alternatives whose target is now in the image, and the links that point at them.
for alt in /etc/alternatives/*; do
  target=$(readlink "$alt") || continue
  [ -e "$dir$target" ] || [ -L "$dir$target" ] || continue
  mkdir -p "$dir/etc/alternatives"
  cp -a "$alt" "$dir/etc/alternatives/"
  for bindir in /usr/sbin /usr/bin; do
    for link in "$bindir"/*; do
      [ -L "$link" ] && [ "$(readlink "$link")" = "$alt" ] && cp -a "$link" "$dir$bindir/"
    done
  done
done

mkdir -p "$dir/var/lib/dpkg" "$dir/etc" "$dir/tmp" "$dir/proc" "$dir/sys" "$dir/dev" "$dir/run"
chmod 1777 "$dir/tmp"
for p in $packages; do
  dpkg-query -s "$p"
  echo
done >"$dir/var/lib/dpkg/status"
mkdir -p "$dir/usr/lib"
cp -a /usr/lib/os-release "$dir/usr/lib/os-release"
ln -sf ../usr/lib/os-release "$dir/etc/os-release"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' >"$dir/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$dir/etc/group"
: >"$dir/etc/hosts"
: >"$dir/etc/resolv.conf"
: >"$dir/etc/hostname"
echo "$packages"
