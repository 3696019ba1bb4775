// What the demo's node has around the controller: pods on a bridge, a second node with the
// Services' endpoint, kube-proxy 1.24+'s IPVS forwarding, and a load balancer that hands out
// addresses. Everything lives in the demo's own network namespace (this node) and in `ip netns`
// namespaces it creates (the pods, the second node, the endpoint behind it).
//
//   pod-a 10.244.1.2, pod-b 10.244.1.3 --cni0-- demo-node (172.30.0.1) --veth-- demo-node-2 (172.30.0.2) --veth-- endpoint 10.244.2.5
//                                               kube-ipvs0: ClusterIPs, LB IPs   kube-ipvs0: the same addresses
//
// kube-proxy in IPVS mode binds every ClusterIP and LoadBalancer IP to kube-ipvs0 on every node.
// Since 1.24 (kubernetes PR 97081, syncEndpoint in pkg/proxy/ipvs/proxier.go), the virtual service of
// an externalTrafficPolicy: Local LoadBalancer IP on a node without a local endpoint gets the
// cluster's endpoints, and KUBE-LOAD-BALANCER returns for such an address before KUBE-MARK-MASQ:
// IPVS forwards to the endpoint on another node without masquerade. A pod is answered and the
// endpoint sees the pod's own address. The node's own connection has the LoadBalancer IP itself as
// its source (local on kube-ipvs0, the kernel picks it), and the endpoint's node holds that address
// too: the packet arrives there from one of its own addresses, which Linux drops as a martian
// source (with accept_local=1 it passes, and the endpoint's answer, addressed to the LoadBalancer
// IP, is delivered locally on that node instead). Either way the client times out.
//
// This kernel has no IPVS; its forwarding is played with DNAT in tables of the demo's own, at
// priority -100, after the controller's -110:
//   - this node, LoadBalancer IP:port -> the endpoint, unmarked: no masquerade (1.24+'s forwarding);
//   - this node, postrouting: masquerade of the mark 0x4000, as kube-proxy's KUBE-POSTROUTING;
//   - ClusterIP:port -> the endpoint, on demo-node-2. netfilter translates a connection's
//     destination once: the first NAT chain that translates it wins, later ones are not consulted.
//     After the controller's DNAT to the ClusterIP no chain of this node can translate it again,
//     while IPVS (no NAT chain) would. So this node routes the ClusterIPs (still bound on its
//     kube-ipvs0, a routing rule ahead of the local table) to demo-node-2 unchanged, the way IPVS's
//     forwarding sends them towards the endpoint, and demo-node-2's IPVS, played the same way,
//     translates them there: the endpoint sees the source the packet left this node with.

import { SourceEchoEndpoint } from '../testbed/endpoint.js';
import { sh } from '../testbed/node-network.js';

export const NODE_NAME = 'demo-node';
export const POD_CIDR = '10.244.1.0/24';
/** This node's address, on its link to demo-node-2: what a masqueraded connection comes from. */
export const NODE_ADDRESS = '172.30.0.1';
export const OTHER_NODE = { name: 'demo-node-2', ns: 'demo-node-2', address: '172.30.0.2', podCidr: '10.244.2.0/24' };
/** The Services' endpoint: a pod on demo-node-2. */
export const ENDPOINT = { ns: 'demo-endpoint', address: '10.244.2.5', gateway: '10.244.2.1' };
const POD_GATEWAY = '10.244.1.1';
/** The API stand-in's ClusterIPs (testbed/api/objects.ts). */
const SERVICE_CIDR = '10.96.0.0/16';
const SERVICE_ROUTES_TABLE = '96';
const IPVS_TABLE = 'demo-ipvs';
const MASQUERADE_MARK = '0x4000';
/** The endpoint's ports: one per Service port (its targetPort), from here up. */
const FIRST_TARGET_PORT = 9000;

export interface Pod {
  name: string;
  ns: string;
  ip: string;
}

type Json = Record<string, any>;

const inNs = (ns: string, cmd: string, args: string[], input?: string) =>
  sh('ip', ['netns', 'exec', ns, cmd, ...args], input);

/** The nat table that plays IPVS's forwarding on a node: `map` sends its keys to the endpoint. */
function ipvsTable(map: string, comment: string, hooks: string[], masquerade: boolean): string {
  const lookup = `meta l4proto { tcp, udp } dnat ip to ip daddr . meta l4proto . th dport map @${map}`;
  return `table ip ${IPVS_TABLE} {
    comment "${comment}"
    map ${map} { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; }
${hooks.map((hook) => `    chain ${hook} { type nat hook ${hook} priority -100; policy accept;\n      ${lookup}\n    }`).join('\n')}
${masquerade ? `    chain postrouting { type nat hook postrouting priority 100; policy accept;\n      meta mark & ${MASQUERADE_MARK} == ${MASQUERADE_MARK} masquerade\n    }` : ''}
  }\n`;
}

/** This node (the demo's namespace), its pods, and demo-node-2 with the endpoint behind it. */
export class DemoNode {
  readonly pods: Pod[] = [
    { name: 'pod-a', ns: 'demo-pod-a', ip: '10.244.1.2' },
    { name: 'pod-b', ns: 'demo-pod-b', ip: '10.244.1.3' },
  ];
  private readonly created: string[] = [];

  setUp(): void {
    sh('sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
    sh('ip', ['link', 'add', 'cni0', 'type', 'bridge']);
    sh('ip', ['addr', 'add', `${POD_GATEWAY}/24`, 'dev', 'cni0']);
    sh('ip', ['link', 'set', 'cni0', 'up']);
    // kube-proxy's dummy interface; a bridge without ports stands in for it (no dummy driver here).
    sh('ip', ['link', 'add', 'kube-ipvs0', 'type', 'bridge']);
    sh('ip', ['link', 'set', 'kube-ipvs0', 'up']);
    for (const [i, pod] of this.pods.entries()) {
      this.addNamespace(pod.ns);
      const hostSide = `veth-pod${i}`;
      sh('ip', ['link', 'add', hostSide, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod.ns]);
      sh('ip', ['link', 'set', hostSide, 'master', 'cni0', 'up']);
      const inPod = ['-n', pod.ns];
      sh('ip', [...inPod, 'link', 'set', 'lo', 'up']);
      sh('ip', [...inPod, 'addr', 'add', `${pod.ip}/24`, 'dev', 'eth0']);
      sh('ip', [...inPod, 'link', 'set', 'eth0', 'up']);
      sh('ip', [...inPod, 'route', 'add', 'default', 'via', POD_GATEWAY]);
    }

    // demo-node-2, linked to this node as two nodes of a cluster are, with its own kube-ipvs0.
    const n2 = ['-n', OTHER_NODE.ns];
    this.addNamespace(OTHER_NODE.ns);
    sh('ip', ['link', 'add', 'veth-node-2', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', OTHER_NODE.ns]);
    sh('ip', ['addr', 'add', `${NODE_ADDRESS}/24`, 'dev', 'veth-node-2']);
    sh('ip', ['link', 'set', 'veth-node-2', 'up']);
    sh('ip', [...n2, 'link', 'set', 'lo', 'up']);
    sh('ip', [...n2, 'addr', 'add', `${OTHER_NODE.address}/24`, 'dev', 'eth0']);
    sh('ip', [...n2, 'link', 'set', 'eth0', 'up']);
    sh('ip', [...n2, 'link', 'add', 'kube-ipvs0', 'type', 'bridge']);
    sh('ip', [...n2, 'link', 'set', 'kube-ipvs0', 'up']);
    inNs(OTHER_NODE.ns, 'sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
    // Nodes of a cluster know each other's link-layer address. Left to ARP, the node's first
    // packet to demo-node-2 could be the one from the LoadBalancer IP: the kernel then asks from
    // that address, demo-node-2 takes the request for one from its own address and never answers,
    // and every packet waiting for the answer, the pods' too, is dropped.
    const mac = (ns: string[], dev: string) =>
      (JSON.parse(sh('ip', ['-j', ...ns, 'link', 'show', 'dev', dev])) as Array<{ address: string }>)[0]!.address;
    const neighbour = (ns: string[], address: string, lladdr: string, dev: string) =>
      sh('ip', [...ns, 'neigh', 'replace', address, 'lladdr', lladdr, 'dev', dev, 'nud', 'permanent']);
    neighbour([], OTHER_NODE.address, mac(n2, 'eth0'), 'veth-node-2');
    neighbour(n2, NODE_ADDRESS, mac([], 'veth-node-2'), 'eth0');
    // Pod routes between the nodes, as a CNI sets them up.
    sh('ip', ['route', 'add', OTHER_NODE.podCidr, 'via', OTHER_NODE.address]);
    sh('ip', [...n2, 'route', 'add', POD_CIDR, 'via', NODE_ADDRESS]);

    // The endpoint, a pod on demo-node-2.
    this.addNamespace(ENDPOINT.ns);
    sh('ip', [...n2, 'link', 'add', 'veth-ep', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ENDPOINT.ns]);
    sh('ip', [...n2, 'addr', 'add', `${ENDPOINT.gateway}/24`, 'dev', 'veth-ep']);
    sh('ip', [...n2, 'link', 'set', 'veth-ep', 'up']);
    const ep = ['-n', ENDPOINT.ns];
    sh('ip', [...ep, 'link', 'set', 'lo', 'up']);
    sh('ip', [...ep, 'addr', 'add', `${ENDPOINT.address}/24`, 'dev', 'eth0']);
    sh('ip', [...ep, 'link', 'set', 'eth0', 'up']);
    sh('ip', [...ep, 'route', 'add', 'default', 'via', ENDPOINT.gateway]);

    // The ClusterIPs stay bound on this node's kube-ipvs0; their packets go to demo-node-2 (see above).
    sh('ip', ['route', 'add', SERVICE_CIDR, 'via', OTHER_NODE.address, 'table', SERVICE_ROUTES_TABLE]);
    sh('ip', ['rule', 'add', 'pref', '50', 'to', SERVICE_CIDR, 'lookup', SERVICE_ROUTES_TABLE]);
    sh('ip', ['rule', 'add', 'pref', '100', 'lookup', 'local']);
    sh('ip', ['rule', 'del', 'pref', '0', 'lookup', 'local']);

    sh(
      'nft',
      ['-f', '-'],
      ipvsTable(
        'load-balancer',
        "the demo's stand-in for IPVS: LoadBalancer IPs forwarded to the cluster's endpoints, unmasqueraded",
        ['prerouting', 'output'],
        true,
      ),
    );
    inNs(
      OTHER_NODE.ns,
      'nft',
      ['-f', '-'],
      ipvsTable(
        'cluster-ip',
        "the demo's stand-in for IPVS: ClusterIPs forwarded to the endpoint",
        ['prerouting'],
        false,
      ),
    );
  }

  private addNamespace(ns: string): void {
    sh('ip', ['netns', 'add', ns]);
    this.created.push(ns);
  }

  /** Binds an address on kube-ipvs0 of both nodes, as kube-proxy does on every node. */
  bind(address: string): void {
    sh('ip', ['addr', 'replace', `${address}/32`, 'dev', 'kube-ipvs0']);
    sh('ip', ['-n', OTHER_NODE.ns, 'addr', 'replace', `${address}/32`, 'dev', 'kube-ipvs0']);
  }

  unbind(address: string): void {
    sh('ip', ['addr', 'del', `${address}/32`, 'dev', 'kube-ipvs0']);
    sh('ip', ['-n', OTHER_NODE.ns, 'addr', 'del', `${address}/32`, 'dev', 'kube-ipvs0']);
  }

  /** IPVS forwards an external address (this node) or a ClusterIP (demo-node-2) to the endpoint's port. */
  forward(kind: 'external' | 'cluster', vip: VirtualService, targetPort: number, on: boolean): void {
    const key = `${vip.ip} . ${vip.protocol.toLowerCase()} . ${vip.port}`;
    const element = on ? `{ ${key} : ${ENDPOINT.address} . ${targetPort} }` : `{ ${key} }`;
    const args = [
      on ? 'add' : 'delete',
      'element',
      'ip',
      IPVS_TABLE,
      kind === 'external' ? 'load-balancer' : 'cluster-ip',
    ];
    if (kind === 'external') sh('nft', [...args, element]);
    else inNs(OTHER_NODE.ns, 'nft', [...args, element]);
  }

  tearDown(): void {
    for (const ns of this.created.splice(0).reverse()) {
      try {
        sh('ip', ['netns', 'del', ns]);
      } catch {
        // already gone
      }
    }
  }
}

export interface VirtualService {
  ip: string;
  protocol: string;
  port: number;
  /** namespace/name */
  service: string;
}

const vipKey = (v: VirtualService) => `${v.ip}|${v.protocol}|${v.port}`;
/** A Service port, whatever address reaches it: what the endpoint answers on one port for. */
const servicePortKey = (v: VirtualService) => `${v.service}|${v.protocol}|${v.port}`;

/** The virtual services kube-proxy would create for a Service: ClusterIP ones and external ones. */
function virtualServices(svc: Json): { cluster: VirtualService[]; external: VirtualService[] } {
  const service = `${svc.metadata.namespace}/${svc.metadata.name}`;
  const clusterIp: string | undefined = svc.spec?.clusterIP;
  if (!clusterIp || clusterIp === 'None' || clusterIp.includes(':')) return { cluster: [], external: [] };
  const ports: Array<{ port: number; protocol?: string }> = svc.spec?.ports ?? [];
  const externals: string[] = [
    ...(svc.spec?.type === 'LoadBalancer'
      ? (svc.status?.loadBalancer?.ingress ?? [])
          .filter((i: Json) => i.ip && i.ipMode !== 'Proxy')
          .map((i: Json) => i.ip)
      : []),
    ...(svc.spec?.externalIPs ?? []),
  ].filter((ip) => !ip.includes(':'));
  const per = (ip: string) =>
    ports
      .filter((p) => (p.protocol ?? 'TCP') !== 'SCTP')
      .map((p) => ({ ip, protocol: p.protocol ?? 'TCP', port: p.port, service }));
  return { cluster: per(clusterIp), external: externals.flatMap(per) };
}

/**
 * kube-proxy 1.24+ in IPVS mode, as far as the demo needs: every Service's endpoint is the pod on
 * demo-node-2 (none is on this node), its ClusterIPs and external addresses are bound on both
 * nodes, and IPVS forwards both to the endpoint.
 */
export class IpvsStandIn {
  private endpoint: SourceEchoEndpoint | undefined;
  /** Service port -> the endpoint's port answering for it. */
  private readonly targetPorts = new Map<string, number>();
  private readonly cluster = new Map<string, VirtualService>();
  private readonly external = new Map<string, VirtualService>();
  private readonly bound = new Set<string>();

  constructor(private readonly node: DemoNode) {}

  async reconcile(services: Json[]): Promise<void> {
    this.endpoint ??= await SourceEchoEndpoint.start(ENDPOINT.ns, ENDPOINT.address);
    const cluster = new Map<string, VirtualService>();
    const external = new Map<string, VirtualService>();
    for (const svc of services) {
      const v = virtualServices(svc);
      for (const c of v.cluster) cluster.set(vipKey(c), c);
      for (const e of v.external) external.set(vipKey(e), e);
    }
    for (const addr of new Set([...cluster.values(), ...external.values()].map((v) => v.ip))) {
      if (!this.bound.has(addr)) {
        this.node.bind(addr);
        this.bound.add(addr);
      }
    }
    // Gone or changed first, so that an address that moves to another Service is free to add.
    for (const [kind, had, want] of [
      ['external', this.external, external],
      ['cluster', this.cluster, cluster],
    ] as const) {
      for (const [key, vip] of had) {
        if (want.get(key)?.service === vip.service) continue;
        this.node.forward(kind, vip, this.targetPorts.get(servicePortKey(vip))!, false);
        had.delete(key);
      }
    }
    const inUse = new Set([...cluster.values()].map(servicePortKey));
    for (const [key, port] of this.targetPorts) {
      if (inUse.has(key)) continue;
      await this.endpoint.close(port);
      this.targetPorts.delete(key);
    }
    for (const vip of cluster.values()) {
      const key = servicePortKey(vip);
      if (this.targetPorts.has(key)) continue;
      const taken = new Set(this.targetPorts.values());
      let port = FIRST_TARGET_PORT;
      while (taken.has(port)) port++;
      await this.endpoint.listen(port, vip.service);
      this.targetPorts.set(key, port);
    }
    for (const [kind, had, want] of [
      ['cluster', this.cluster, cluster],
      ['external', this.external, external],
    ] as const) {
      for (const [key, vip] of want) {
        const port = this.targetPorts.get(servicePortKey(vip));
        // An external address of a Service port without a ClusterIP virtual service: none to forward to.
        if (had.has(key) || port === undefined) continue;
        this.node.forward(kind, vip, port, true);
        had.set(key, vip);
      }
    }
    const addresses = new Set([...cluster.values(), ...external.values()].map((v) => v.ip));
    for (const addr of [...this.bound]) {
      if (!addresses.has(addr)) {
        this.node.unbind(addr);
        this.bound.delete(addr);
      }
    }
  }

  externalVirtualServices(): VirtualService[] {
    return [...this.external.values()];
  }

  async stop(): Promise<void> {
    await this.endpoint?.stop();
    this.endpoint = undefined;
  }
}

/** A load balancer controller (MetalLB-like): LoadBalancer Services without an address get one. */
export function assignLoadBalancerIps(services: Json[], pool: string[]): Json[] {
  const used = new Set(services.flatMap((s) => (s.status?.loadBalancer?.ingress ?? []).map((i: Json) => i.ip)));
  const updated: Json[] = [];
  for (const svc of services) {
    if (svc.spec?.type !== 'LoadBalancer' || (svc.status?.loadBalancer?.ingress ?? []).length > 0) continue;
    const ip = pool.find((a) => !used.has(a));
    if (!ip) continue;
    used.add(ip);
    updated.push({ ...svc, status: { ...svc.status, loadBalancer: { ingress: [{ ip, ipMode: 'VIP' }] } } });
  }
  return updated;
}
