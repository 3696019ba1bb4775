# ipvs-node-controller image: the controller bundled into a few files (scripts/bundle.mjs: no
# node_modules at run time), both native addons (in-process libnftables, the libbpf loader) and
# the BPF object beside it, and the userspace the fallbacks and backends call: nft, iptables
# (legacy and nft), conntrack. Deploy it with deploy/ (kubectl apply -k deploy/overlays/nft).
#
#   docker build -t ipvs-node-controller:0.3.0 .           (or: npm run image)
#
# The base images are build arguments so that a machine without a registry can pass bases it
# made itself (scripts/local-base-images.sh, which `npm run image` runs when docker is absent):
#   BUILD_IMAGE    Node.js 24 LTS with npm on Debian trixie: compiles the addons, the BPF object
#                  and the bundle. Any image laid out as the official node image works.
#   RUNTIME_IMAGE  plain Debian trixie slim. Node.js is copied in from the build stage (one
#                  binary): the official node runtime images carry npm, yarn and corepack, which
#                  the controller never runs and which would be most of the image's size.
# REVISION is the source revision stamped into the bundle and the labels (npm run image passes
# `git rev-parse HEAD`).
ARG BUILD_IMAGE=node:24-trixie
ARG RUNTIME_IMAGE=debian:trixie-slim

# --- build: native addons (node-gyp), BPF object (clang), bundle (esbuild) -----------------------
FROM ${BUILD_IMAGE} AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libnftables-dev libbpf-dev linux-libc-dev clang llvm pkg-config python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY package.json package-lock.json binding.gyp ./
COPY scripts ./scripts
COPY native ./native
COPY bpf ./bpf
# Dependencies from the lockfile only; the install script builds build/Release/*.node and
# bpf/ipvs_node_controller.bpf.o.
RUN npm ci --no-audit --no-fund
COPY tsconfig.json ./
COPY src ./src
ARG REVISION=unknown
# The local esbuild, never one fetched on the fly.
RUN REVISION="${REVISION}" node scripts/bundle.mjs
# An image without an addon would silently fall back (nft CLI) or lose a backend (ebpf): refuse.
RUN test -f build/Release/nftables_addon.node \
 && test -f build/Release/ebpf_addon.node \
 && test -f bpf/ipvs_node_controller.bpf.o \
 && mkdir -p /out/build/Release /out/bpf /out/dist \
 && cp package.json /out/ \
 && cp -r dist/bundle /out/dist/ \
 && cp build/Release/nftables_addon.node build/Release/ebpf_addon.node /out/build/Release/ \
 && cp bpf/ipvs_node_controller.bpf.o /out/bpf/ \
 && node /out/dist/bundle/ipvs-node-controller.mjs --version

# --- runtime: no compiler, no npm, no node-gyp -----------------------------------------------------
FROM ${RUNTIME_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      nftables iptables libnftables1 libbpf1 conntrack \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log
COPY --from=build /usr/local/bin/node /usr/local/bin/node
COPY --from=build /out/ /opt/ipvs-node-controller/
# The bundle starts on the runtime's libraries alone (no node_modules).
RUN node /opt/ipvs-node-controller/dist/bundle/ipvs-node-controller.mjs --version
# VERSION is package.json's (scripts/stamp-version.mjs keeps this default in step); SOURCE is the
# repository URL (npm run image passes the git remote's).
ARG VERSION=0.3.0
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
# package.json's ipvsNodeController.nodeFlags: --max-semi-space-size=1 keeps V8's young generation
# at 1 MiB per semi-space instead of growing to 16 (at 10,000 Services 40 to 60 MiB less resident
# memory, for more frequent sub-millisecond scavenges); --no-opt --no-maglev leave V8's optimising
# compilers out (their code, zones and optimised code: about 20 MiB less at 10,000 Services; the
# controller's work is in JSON, libnftables and the kernel: its start on the baseline tiers is
# within run-to-run noise); --expose-gc lets the controller collect the garbage of its initial list once, right
# after its first sync.
ENTRYPOINT ["node", "--max-semi-space-size=1", "--no-opt", "--no-maglev", "--expose-gc", "/opt/ipvs-node-controller/dist/bundle/ipvs-node-controller.mjs"]
