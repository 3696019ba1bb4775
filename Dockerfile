# ipvs-node-controller image: the controller bundled into a few files (scripts/bundle.mjs: no
# node_modules at run time), both native addons (in-process libnftables, the libbpf loader) and
# the BPF object beside it, and the userspace the fallbacks and backends call: nft, iptables
# (legacy and nft), conntrack. Deploy it with deploy/ (kubectl apply -k deploy/overlays/nft).
#
#   docker build -t ipvs-node-controller:0.5.0 .           (or: npm run image)
#   docker buildx build --platform linux/amd64,linux/arm64 .  (or: npm run release, both, under emulation)
#
# The base images are build arguments so that a machine without a registry can pass bases it
# made itself (scripts/local-base-images.sh, which `npm run image` runs when docker is absent):
#   BUILD_IMAGE    Node.js NODE_VERSION with npm on Debian trixie (slim): compiles the addons, the BPF
#                  object and the bundle. Any image laid out as the official node image works.
#   RUNTIME_IMAGE  plain Debian trixie slim: the packages the controller runs are installed there,
#                  and their files alone make the runtime image (FROM scratch), without apt,
#                  dpkg or a shell (scripts/runtime-rootfs.sh).
# NODE_VERSION is exact: the image runs what was tested. REVISION is the source revision stamped
# into the bundle and the labels (npm run image passes `git rev-parse HEAD`).
ARG NODE_VERSION=24.21.0
# Both pinned by the digest of their multi-arch index (linux/amd64 and linux/arm64): a tag moves,
# a digest does not. With another NODE_VERSION, pass BUILD_IMAGE too.
ARG BUILD_IMAGE=node:24.21.0-trixie-slim@sha256:8ec5d7557396cfe32d21c3f9c13072355ceab22b584578ca4bb28af31120cffe
ARG RUNTIME_IMAGE=debian:trixie-slim@sha256:a29215f6a35e51e22adffa17f89e9d2ef06214e64a2bad10d765c46aea49f11f

# --- build: native addons (node-gyp), BPF object (clang), bundle (esbuild) -----------------------
FROM ${BUILD_IMAGE} AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libnftables-dev libnftnl-dev libmnl-dev libbpf-dev linux-libc-dev clang llvm pkg-config python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY package.json package-lock.json binding.gyp ./
# Only the scripts the install and the bundle run: a change to another script (release, image)
# keeps the layer cache of npm ci, which is long under emulation.
COPY scripts/build-native.mjs scripts/build-bpf.mjs ./scripts/
COPY native ./native
COPY bpf ./bpf
# Dependencies from the lockfile only; the install script builds build/Release/*.node and
# bpf/ipvs_node_controller.bpf.o.
RUN npm ci --no-audit --no-fund
COPY tsconfig.json ./
COPY scripts/bundle.mjs scripts/bundle-kubeconfig.mjs ./scripts/
COPY src ./src
COPY bin ./bin
ARG REVISION=unknown
# The local esbuild, never one fetched on the fly.
RUN REVISION="${REVISION}" node scripts/bundle.mjs
# An image without an addon would silently fall back (nft CLI, a conntrack process per tuple, the
# start's file pages kept resident) or lose a backend (ebpf), and one whose nftables addon has no element batches (libnftnl) would
# write every change as JSON: refuse.
RUN test -f build/Release/nftables_addon.node \
 && test -f build/Release/conntrack_addon.node \
 && test -f build/Release/memory_addon.node \
 && node -e "if (typeof require('./build/Release/nftables_addon.node').writeElements !== 'function') process.exit(1)" \
 && test -f build/Release/ebpf_addon.node \
 && test -f bpf/ipvs_node_controller.bpf.o \
 && mkdir -p /out/bin /out/build/Release /out/bpf /out/dist \
 && cp package.json /out/ \
 && cp bin/ipvs-node-controller.mjs /out/bin/ \
 && cp -r dist/bundle /out/dist/ \
 && cp build/Release/nftables_addon.node build/Release/conntrack_addon.node build/Release/memory_addon.node build/Release/ebpf_addon.node /out/build/Release/ \
 && cp bpf/ipvs_node_controller.bpf.o /out/bpf/ \
 && sed -i '1s|^#!/usr/bin/env node$|#!/usr/local/bin/node|' /out/bin/ipvs-node-controller.mjs \
 && chmod 755 /out/bin/ipvs-node-controller.mjs \
 && node /out/bin/ipvs-node-controller.mjs --version

# --- runtime root filesystem: the Debian packages the controller runs, and what they load ------
FROM ${RUNTIME_IMAGE} AS runtime-root
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      nftables iptables libnftables1 libnftnl11 libmnl0 libbpf1 conntrack libstdc++6 netbase \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log
COPY scripts/runtime-rootfs.sh /usr/local/sbin/runtime-rootfs.sh
# nft, iptables (legacy and nft, with their alternatives links), conntrack, libnftables, libnftnl,
# libmnl and libbpf for the addons, libstdc++ for node; netbase (/etc/protocols, /etc/services,
# which iptables reads). Their dependencies come along (libc6, libxtables12, libelf1t64, zlib1g,
# libjansson4, ...).
RUN sh /usr/local/sbin/runtime-rootfs.sh /rootfs \
      nftables iptables libnftables1 libnftnl11 libmnl0 libbpf1 conntrack libstdc++6 netbase \
 && mkdir -p /rootfs/usr/local/bin \
 && ln -s /opt/ipvs-node-controller/bin/ipvs-node-controller.mjs /rootfs/usr/local/bin/ipvs-node-controller

# --- runtime: no compiler, no npm, no apt or dpkg, no shell ---------------------------------------
FROM scratch
COPY --from=runtime-root /rootfs/ /
COPY --from=build /usr/local/bin/node /usr/local/bin/node
COPY --from=build /out/ /opt/ipvs-node-controller/
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# The bundle starts on the runtime's libraries alone (no node_modules), and `ipvs-node-controller`
# is a command on PATH (kubectl exec POD -- ipvs-node-controller --dry-run).
RUN ["node", "/opt/ipvs-node-controller/bin/ipvs-node-controller.mjs", "--version"]
RUN ["ipvs-node-controller", "--version"]
# VERSION is package.json's (scripts/stamp-version.mjs keeps this default in step); SOURCE is the
# repository URL (npm run image passes the git remote's).
ARG VERSION=0.5.0
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="ipvs-node-controller" \
      org.opencontainers.image.description="Translates in-cluster traffic to LoadBalancer and external IPs to the Service ClusterIP for kube-proxy in IPVS mode" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV NODE_ENV=production
# Root with the capabilities the DaemonSet grants (deploy/overlays/*): netlink and bpf() need them.
USER 0
# The launcher of package.json's bin, as `npm exec ipvs-node-controller` runs it: it replaces itself
# (process.execve, same PID) with node, the flags of package.json's ipvsNodeController.nodeFlags
# and the bundle, so the controller receives the kubelet's SIGTERM itself. Those flags keep the
# resident memory small (docs/operations.md, Resources).
ENTRYPOINT ["node", "/opt/ipvs-node-controller/bin/ipvs-node-controller.mjs"]
