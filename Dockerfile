# ipvs-node-controller image: the controller with both native addons (in-process libnftables and
# the libbpf loader), the BPF object, and the nft and iptables userspace for the CLI fallbacks and
# the iptables backend. Deploy it with deploy/ (kubectl apply -k deploy/overlays/nft).
#   docker build -t ipvs-node-controller:0.1.0 .

# --- build: TypeScript, native addons (node-gyp), BPF object (clang) ----------------------------
FROM node:20-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libnftables-dev libbpf-dev clang llvm pkg-config python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY package.json package-lock.json binding.gyp tsconfig.json ./
COPY scripts ./scripts
COPY native ./native
COPY bpf ./bpf
# The install script builds build/Release/*.node and bpf/ipvs_node_controller.bpf.o.
RUN npm ci
COPY src ./src
RUN npx tsc -p tsconfig.json
# An image without an addon would silently fall back (nft CLI) or lose a backend (ebpf): refuse.
RUN test -f build/Release/nftables_addon.node \
 && test -f build/Release/ebpf_addon.node \
 && test -f bpf/ipvs_node_controller.bpf.o \
 && npm prune --omit=dev

# --- runtime --------------------------------------------------------------------------------------
FROM node:20-bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends nftables iptables libnftables1 libbpf1 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/ipvs-node-controller
COPY --from=build /src/package.json ./
COPY --from=build /src/node_modules ./node_modules
COPY --from=build /src/dist/src ./dist/src
COPY --from=build /src/build/Release/nftables_addon.node /src/build/Release/ebpf_addon.node ./build/Release/
COPY --from=build /src/bpf/ipvs_node_controller.bpf.o ./bpf/
ENV NODE_ENV=production
# Root with the capabilities the DaemonSet grants (deploy/overlays/*): netlink and bpf() need them.
USER 0
ENTRYPOINT ["node", "/opt/ipvs-node-controller/dist/src/cli/main.js"]
