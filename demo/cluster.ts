// What the demo's node has around the controller: pods in network namespaces of their own on a
// bridge, kube-proxy's IPVS behaviour for Services on a node without local endpoints, and a load
// balancer that hands out addresses. Everything lives in the demo's own network namespace.
//
// kube-proxy in IPVS mode binds ClusterIPs and LoadBalancer IPs to kube-ipvs0. Here a ClusterIP
// is answered by a server named after its Service (IPVS balancing to endpoints elsewhere in the
// cluster), and a LoadBalancer IP is refused the way IPVS refuses it with externalTrafficPolicy
// Local and no local endpoint: a virtual service without a real server answers a new connection
// (TCP SYN, UDP datagram) with ICMP port unreachable, so the client sees "connection refused" at
// once. Only new connections are refused (`ct state new`): a host process connecting from an
// address bound on the node (the LoadBalancer IP itself, as source) gets the replies of its
// translated connections addressed to that address, and those must pass. The kernel rate-limits
// these ICMP errors per destination (net.ipv4.icmp_ratelimit: a burst of 6, then one a second),
// as it does IPVS's own; the demo probes each client far less often than that.

import { NamedServer, sh } from '../testbed/node-network.js';

export const NODE_NAME = 'demo-node';
export const POD_CIDR = '10.244.1.0/24';
const POD_GATEWAY = '10.244.1.1';
const BLACKHOLE_TABLE = 'demo-ipvs-blackhole';

export interface Pod {
  name: string;
  ns: string;
  ip: string;
}

type Json = Record<string, any>;

/** The node's network: bridge cni0 with two pods, kube-ipvs0, and the blackhole table. */
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
      sh('ip', ['netns', 'add', pod.ns]);
      this.created.push(pod.ns);
      const hostSide = `veth-pod${i}`;
      sh('ip', ['link', 'add', hostSide, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod.ns]);
      sh('ip', ['link', 'set', hostSide, 'master', 'cni0', 'up']);
      const inPod = ['netns', 'exec', pod.ns, 'ip'];
      sh('ip', [...inPod, 'link', 'set', 'lo', 'up']);
      sh('ip', [...inPod, 'addr', 'add', `${pod.ip}/24`, 'dev', 'eth0']);
      sh('ip', [...inPod, 'link', 'set', 'eth0', 'up']);
      sh('ip', [...inPod, 'route', 'add', 'default', 'via', POD_GATEWAY]);
    }
    sh(
      'nft',
      ['-f', '-'],
      `table ip ${BLACKHOLE_TABLE} {
        comment "the demo's stand-in for IPVS virtual services without local endpoints"
        set blackholed { type ipv4_addr . inet_proto . inet_service; }
        chain input { type filter hook input priority 0; policy accept;
          ip daddr . meta l4proto . th dport @blackholed ct state new reject with icmp type port-unreachable
        }
        chain output { type filter hook output priority 0; policy accept;
          ip daddr . meta l4proto . th dport @blackholed ct state new reject with icmp type port-unreachable
        }
      }\n`,
    );
  }

  bind(address: string): void {
    sh('ip', ['addr', 'replace', `${address}/32`, 'dev', 'kube-ipvs0']);
  }

  unbind(address: string): void {
    sh('ip', ['addr', 'del', `${address}/32`, 'dev', 'kube-ipvs0']);
  }

  blackhole(vip: VirtualService, on: boolean): void {
    const element = `{ ${vip.ip} . ${vip.protocol.toLowerCase()} . ${vip.port} }`;
    sh('nft', [on ? 'add' : 'delete', 'element', 'ip', BLACKHOLE_TABLE, 'blackholed', element]);
  }

  tearDown(): void {
    for (const ns of this.created.splice(0)) {
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

/** kube-proxy (IPVS mode) on a node where no Service has a local endpoint, as far as the demo needs. */
export class IpvsStandIn {
  private readonly servers = new Map<string, { vip: VirtualService; server: NamedServer }>();
  private readonly blackholed = new Map<string, VirtualService>();
  private readonly bound = new Set<string>();

  constructor(private readonly node: DemoNode) {}

  async reconcile(services: Json[]): Promise<void> {
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
    for (const [key, { vip, server }] of this.servers) {
      if (cluster.get(key)?.service !== vip.service) {
        await server.stop();
        this.servers.delete(key);
      }
    }
    for (const [key, vip] of cluster) {
      // The endpoints, elsewhere in the cluster, answer with their Service's name.
      if (!this.servers.has(key))
        this.servers.set(key, { vip, server: await NamedServer.start(vip.ip, vip.port, vip.service) });
    }
    for (const [key, vip] of this.blackholed) {
      if (!external.has(key)) {
        this.node.blackhole(vip, false);
        this.blackholed.delete(key);
      }
    }
    for (const [key, vip] of external) {
      if (!this.blackholed.has(key)) {
        this.node.blackhole(vip, true);
        this.blackholed.set(key, vip);
      }
    }
    const inUse = new Set([...cluster.values(), ...external.values()].map((v) => v.ip));
    for (const addr of [...this.bound]) {
      if (!inUse.has(addr)) {
        this.node.unbind(addr);
        this.bound.delete(addr);
      }
    }
  }

  externalVirtualServices(): VirtualService[] {
    return [...this.blackholed.values()];
  }

  async stop(): Promise<void> {
    for (const { server } of this.servers.values()) await server.stop();
    this.servers.clear();
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
