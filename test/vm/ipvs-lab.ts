// A node as kube-proxy's IPVS mode leaves it, on a kernel with real IPVS (the VM layer's guests:
// the machine's own kernel has no ip_vs), and the same node after kube-proxy moved it to nftables
// mode. Followed: kube-proxy v1.33 (pkg/proxy/ipvs/proxier.go as released in 1.33: CategorizeEndpoints
// takes the node's name, the node's labels still come from OnNodeAdd/OnNodeUpdate), for a dual-stack
// node with --detect-local-mode=ClusterCIDR, line by line:
//
// - NewProxier: the sysctls (vs/conntrack=1, expire_nodest_conn=1, expire_quiescent_template=1,
//   ip_forward=1; conn_reuse_mode=0 only before kernel 5.9, left as it is after, kubernetes#93297).
// - syncProxyRules: EnsureDummyDevice (kube-ipvs0, left down), every ClusterIP and LoadBalancer IP
//   bound on it (syncService with bindAddr), a virtual service per (address, protocol, port), scheduler
//   rr; the ipset entries: KUBE-CLUSTER-IP for each ClusterIP, KUBE-LOAD-BALANCER and, for
//   externalTrafficPolicy Local, KUBE-LOAD-BALANCER-LOCAL for each LoadBalancer IP, KUBE-LOOP-BACK
//   (endpoint, port, endpoint) for each LOCAL endpoint, KUBE-IPVS-IPS for each bound address.
// - syncEndpoint: the ClusterIP's virtual service gets every endpoint (internalTrafficPolicy Cluster);
//   the LoadBalancer IP's, with onlyNodeLocalEndpoints (eTP=Local), the local endpoints when there
//   are any, and otherwise `endpoints = clusterEndpoints` (the comment names PR 97081, "Allow access
//   from local PODs even if no local endpoints exist"): scenario '1.24+'. Before that change (kube-
//   proxy 1.23 and older) it got none: scenario 'before 1.24'. Real servers are masquerading
//   (ipvsadm -m), weight 1.
// - writeIptablesRules, in its order: KUBE-SERVICES returns 127.0.0.0/8 (::1); ipsetWithIptablesChain
//   for the non-empty sets: KUBE-LOOP-BACK -> MASQUERADE in KUBE-POSTROUTING, KUBE-LOAD-BALANCER ->
//   KUBE-LOAD-BALANCER, and KUBE-LOAD-BALANCER-LOCAL -> RETURN at the head of KUBE-LOAD-BALANCER (so
//   traffic to an eTP=Local LoadBalancer IP is never marked, whatever its source); KUBE-CLUSTER-IP ->
//   KUBE-MARK-MASQ for sources outside the cluster CIDR (localDetector.IfNotLocal); addrtype LOCAL ->
//   KUBE-NODE-PORT; KUBE-LOAD-BALANCER -> KUBE-MARK-MASQ (after the RETURN); acceptIPVSTraffic;
//   KUBE-FORWARD, KUBE-NODE-PORT (filter), KUBE-IPVS-FILTER; KUBE-POSTROUTING's mark, xor, MASQUERADE
//   --random-fully; KUBE-MARK-MASQ's or-mark. createAndLinkKubeChain: iptablesChains and the jumps of
//   iptablesJumpChain, each EnsureRule(Prepend): inserted at rule 1, in that order.
// - ipset.go: names and types of ipsetInfo; IPv6 sets are "KUBE-6-...", cut to 31 characters.
// - cleanupLeftovers (what cmd/kube-proxy's platformCleanup runs when kube-proxy starts in nftables
//   mode): ipvs Flush, DeleteDummyDevice(kube-ipvs0, with its addresses), cleanupIptablesLeftovers per
//   family (delete the jumps of iptablesJumpChain, flush every chain of iptablesCleanupChains, then
//   delete them; a failure is logged and the next step runs), then DestroySet for each name of
//   ipsetInfo: the IPv4 names, so the KUBE-6-* sets stay behind (kube-proxy's own behaviour). The
//   iptables mode's CleanupLeftovers, which platformCleanup also runs, finds only chains this one has
//   already tried, and is left out.
//
// kube-proxy's nftables mode (pkg/proxy/nftables/proxier.go, 1.32/1.33: setupNFTables and
// syncProxyRules), as little of it as reproduces what the packets do: table ip/ip6 kube-proxy; base
// chains nat-prerouting and nat-output at dstnat (-100) jumping to `services`, nat-postrouting at srcnat
// (100) jumping to `masquerading` (`mark and 0x4000 == 0 return`, `mark set mark xor 0x4000`,
// `masquerade fully-random`); mark-for-masquerade (`mark set mark or 0x4000`); the service-ips verdict
// map keyed `daddr . meta l4proto . th dport`: a ClusterIP goes to the Service's cluster-policy chain
// `service-HASH-ns/name/proto/port` (masquerade mark for sources outside the cluster CIDR, then the
// endpoints by numgen), a LoadBalancer IP to `external-...`, which for eTP=Local short-circuits pod
// traffic (`ip saddr <cluster CIDR> goto service-...`), marks and short-circuits node traffic (`fib saddr
// type local`), and sends the rest to `local-...` when there are local endpoints; endpoint chains mark
// hairpin traffic and DNAT. The filter chains (firewall, no-endpoint and unallocated-ClusterIP checks)
// are left out: none of their verdicts applies to this node's traffic (kube-proxy from 1.33.6 and
// 1.34.0 on; before, kubernetes#131765 dropped pods' traffic to an eTP=Local LoadBalancer IP without
// a local endpoint itself).
//
// The test process's own network namespace (a private one: see real-ipvs.test.ts) is the node:
//
//   pod ns (10.244.1.2, fd44:0:0:1::2) --veth-- cni0 (10.244.1.1, fd44:0:0:1::1)
//   local endpoint ns (10.244.1.3, fd44:0:0:1::3; a routed pod, as Calico wires them)
//                                      --veth-- vpl-* (10.244.1.1/32, fd44:0:0:1::1/128)
//                                      node: kube-ipvs0 (dummy) holds the ClusterIPs and LB IPs;
//                                            IPVS virtual services, ipsets, kube-proxy's chains
//   node2 ns (172.18.0.2, fd18::2: another node, with its own kube-ipvs0 holding the same addresses,
//             as every node of an IPVS cluster has, and no route to the outside network)
//       --veth-- eth-n2 (172.18.0.1, fd18::1: the node's address)
//       node2's cni0 (10.244.2.1, fd44:0:0:2::1) --veth-- endpoint ns (10.244.2.5, fd44:0:0:2::5)
//   outside ns (192.168.50.2, fd50::2; also the load balancer of ipMode Proxy, 192.0.2.20)
//                                      --veth-- eth-out (192.168.50.1, fd50::1), the node's default route
//
// A reply that the endpoint addresses to a LoadBalancer IP (a node process connects from the LB IP
// itself, which is local on kube-ipvs0) reaches node2, which delivers it locally and drops it: lost,
// as in a cluster. Node2 has no route to the outside network: a reply to an outside client does not
// come back through this node (in a cluster it leaves by the endpoint's node's own default route).
//
// Nothing outside these namespaces is touched; tearDown() removes them (the node namespace itself
// goes with the test's process).

import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

export type IptablesVariant = 'legacy' | 'nft';
export type Family = 'ipv4' | 'ipv6';
export type Protocol = 'tcp' | 'udp';

/**
 * What kube-proxy gives the virtual service of an eTP=Local LoadBalancer IP on a node without a
 * local endpoint: the cluster's endpoints ('1.24+', PR 97081), or none ('before 1.24').
 */
export type KubeProxyScenario = '1.24+' | 'before 1.24';

export const MASQ_MARK = '0x4000';

export const ADDR = {
  ipv4: {
    clusterCidr: '10.244.0.0/16',
    podGateway: '10.244.1.1',
    pod: '10.244.1.2',
    localEndpoint: '10.244.1.3',
    podPrefix: 24,
    endpoint: '10.244.2.5',
    node2PodGateway: '10.244.2.1',
    remoteNet: '10.244.2.0/24',
    nodePodNet: '10.244.1.0/24',
    node: '172.18.0.1',
    nodePeer: '172.18.0.2',
    nodePrefix: 24,
    outsideGateway: '192.168.50.1',
    outside: '192.168.50.2',
    outsidePrefix: 24,
    clusterIp: '10.96.0.10',
    localClusterIp: '10.96.0.11',
    proxyClusterIp: '10.96.0.12',
    lb: '192.0.2.10',
    localLb: '192.0.2.11',
    proxyLb: '192.0.2.20',
    loopback: '127.0.0.0/8',
    hostPrefix: 32,
  },
  ipv6: {
    clusterCidr: 'fd44::/56',
    podGateway: 'fd44:0:0:1::1',
    pod: 'fd44:0:0:1::2',
    localEndpoint: 'fd44:0:0:1::3',
    podPrefix: 64,
    endpoint: 'fd44:0:0:2::5',
    node2PodGateway: 'fd44:0:0:2::1',
    remoteNet: 'fd44:0:0:2::/64',
    nodePodNet: 'fd44:0:0:1::/64',
    node: 'fd18::1',
    nodePeer: 'fd18::2',
    nodePrefix: 64,
    outsideGateway: 'fd50::1',
    outside: 'fd50::2',
    outsidePrefix: 64,
    clusterIp: 'fd96::10',
    localClusterIp: 'fd96::11',
    proxyClusterIp: 'fd96::12',
    lb: '2001:db8::10',
    localLb: '2001:db8::11',
    proxyLb: '2001:db8::20',
    loopback: '::1/128',
    hostPrefix: 128,
  },
} as const;

/** Service port and the endpoints' target port. */
export const PORT = 80;
export const TARGET_PORT = 8080;

/**
 * The Services kube-proxy programs (the test applies the same objects to the API stand-in):
 * svc-a, eTP=Local, its one endpoint on node2; svc-local, eTP=Local, its one endpoint on this node;
 * svc-proxy, whose ingress has ipMode Proxy (kube-proxy >= 1.30 with LoadBalancerIPMode, KEP-1860:
 * neither bound nor a virtual service, the load balancer gets it).
 */
interface LabService {
  name: string;
  protocols: readonly Protocol[];
  clusterIp: (f: Family) => string;
  /** The LoadBalancer IP kube-proxy binds, absent for ipMode Proxy. */
  lb?: (f: Family) => string;
  endpoint: (f: Family) => string;
  local: boolean;
}

const SERVICES: readonly LabService[] = [
  {
    name: 'svc-a',
    protocols: ['tcp', 'udp'],
    clusterIp: (f) => ADDR[f].clusterIp,
    lb: (f) => ADDR[f].lb,
    endpoint: (f) => ADDR[f].endpoint,
    local: false,
  },
  {
    name: 'svc-local',
    protocols: ['tcp', 'udp'],
    clusterIp: (f) => ADDR[f].localClusterIp,
    lb: (f) => ADDR[f].localLb,
    endpoint: (f) => ADDR[f].localEndpoint,
    local: true,
  },
  {
    name: 'svc-proxy',
    protocols: ['tcp'],
    clusterIp: (f) => ADDR[f].proxyClusterIp,
    endpoint: (f) => ADDR[f].endpoint,
    local: false,
  },
];

const FAMILIES = ['ipv4', 'ipv6'] as const;

/** One IPVS virtual service, with its (masquerading) real server when it has one. */
interface VirtualService {
  family: Family;
  protocol: Protocol;
  address: string;
  realServer?: string;
  kind: 'cluster-ip' | 'load-balancer';
  /** The real server is on this node (KUBE-LOOP-BACK). */
  local: boolean;
}

/** The virtual services syncProxyRules and syncEndpoint leave on this node in `scenario`. */
function virtualServices(scenario: KubeProxyScenario): VirtualService[] {
  const out: VirtualService[] = [];
  for (const family of FAMILIES) {
    for (const svc of SERVICES) {
      for (const protocol of svc.protocols) {
        const realServer = svc.endpoint(family);
        out.push({
          family,
          protocol,
          address: svc.clusterIp(family),
          realServer,
          kind: 'cluster-ip',
          local: svc.local,
        });
        if (!svc.lb) continue;
        // eTP=Local: the local endpoints; without any, the cluster's (1.24+) or none (before).
        const lbServer = svc.local || scenario === '1.24+' ? realServer : undefined;
        out.push({
          family,
          protocol,
          address: svc.lb(family),
          realServer: lbServer,
          kind: 'load-balancer',
          local: svc.local,
        });
      }
    }
  }
  return out;
}

/** The addresses kube-proxy binds on kube-ipvs0 (on every node of the cluster). */
function boundAddresses(family?: Family): string[] {
  return [
    ...new Set(
      virtualServices('1.24+')
        .filter((vs) => family === undefined || vs.family === family)
        .map((vs) => vs.address),
    ),
  ];
}

function bracket(address: string): string {
  return address.includes(':') ? `[${address}]` : address;
}

export function sh(cmd: string, args: string[], input?: string): string {
  try {
    return execFileSync(cmd, args, { encoding: 'utf8', input, stdio: ['pipe', 'pipe', 'pipe'] });
  } catch (err) {
    const e = err as { stderr?: string; stdout?: string; message: string };
    throw new Error(`${cmd} ${args.join(' ')} failed: ${(e.stderr || e.stdout || e.message).trim()}`);
  }
}

/** Single-quotes a word for sh. */
const quote = (word: string) => `'${word.replaceAll("'", "'\\''")}'`;

/** Why this kernel cannot run the test, or undefined when it has real IPVS. */
export function missingIpvs(): string | undefined {
  try {
    execFileSync('modprobe', ['-q', 'ip_vs'], { stdio: 'ignore' });
  } catch {
    // built in, or no module: the check below decides
  }
  try {
    sh('ipvsadm', ['-Ln']);
  } catch (err) {
    return (err as Error).message.split('\n')[0];
  }
  if (!existsSync('/proc/sys/net/ipv4/vs/conntrack')) return 'no /proc/sys/net/ipv4/vs in this network namespace';
  return undefined;
}

/** kube-proxy's ipsets (ipsetInfo), by their IPv4 name, with their type. */
const IPSETS: Array<[string, string]> = [
  ['KUBE-LOOP-BACK', 'hash:ip,port,ip'],
  ['KUBE-CLUSTER-IP', 'hash:ip,port'],
  ['KUBE-EXTERNAL-IP', 'hash:ip,port'],
  ['KUBE-EXTERNAL-IP-LOCAL', 'hash:ip,port'],
  ['KUBE-LOAD-BALANCER', 'hash:ip,port'],
  ['KUBE-LOAD-BALANCER-FW', 'hash:ip,port'],
  ['KUBE-LOAD-BALANCER-LOCAL', 'hash:ip,port'],
  ['KUBE-LOAD-BALANCER-SOURCE-IP', 'hash:ip,port,ip'],
  ['KUBE-LOAD-BALANCER-SOURCE-CIDR', 'hash:ip,port,net'],
  ['KUBE-NODE-PORT-TCP', 'bitmap:port'],
  ['KUBE-NODE-PORT-LOCAL-TCP', 'bitmap:port'],
  ['KUBE-NODE-PORT-UDP', 'bitmap:port'],
  ['KUBE-NODE-PORT-LOCAL-UDP', 'bitmap:port'],
  ['KUBE-NODE-PORT-SCTP-HASH', 'hash:ip,port'],
  ['KUBE-NODE-PORT-LOCAL-SCTP-HASH', 'hash:ip,port'],
  ['KUBE-HEALTH-CHECK-NODE-PORT', 'bitmap:port'],
  ['KUBE-IPVS-IPS', 'hash:ip'],
];

/** ipset.go's NewIPSet: IPv6 sets are "KUBE-6-...", cut to ipset's 31 characters. */
function setName(family: Family, name: string): string {
  return family === 'ipv4' ? name : name.replace(/^KUBE-/, 'KUBE-6-').slice(0, 31);
}

/** `ipset restore -exist` input: every set of ipsetInfo, and the entries of the lab's Services. */
export function ipsetRestore(): string {
  const lines: string[] = [];
  for (const family of FAMILIES) {
    const n = (name: string) => setName(family, name);
    for (const [name, type] of IPSETS) {
      const options =
        type === 'bitmap:port'
          ? 'range 0-65535'
          : `family ${family === 'ipv4' ? 'inet' : 'inet6'} hashsize 1024 maxelem 65536`;
      lines.push(`create ${n(name)} ${type} ${options}`);
    }
    for (const vs of virtualServices('1.24+').filter((v) => v.family === family)) {
      const entry = `${vs.address},${vs.protocol}:${PORT}`;
      if (vs.kind === 'cluster-ip') lines.push(`add ${n('KUBE-CLUSTER-IP')} ${entry}`);
      else {
        lines.push(`add ${n('KUBE-LOAD-BALANCER')} ${entry}`);
        lines.push(`add ${n('KUBE-LOAD-BALANCER-LOCAL')} ${entry}`);
      }
      if (vs.local && vs.realServer && vs.kind === 'cluster-ip') {
        lines.push(`add ${n('KUBE-LOOP-BACK')} ${vs.realServer},${vs.protocol}:${TARGET_PORT},${vs.realServer}`);
      }
    }
    for (const address of boundAddresses(family)) lines.push(`add ${n('KUBE-IPVS-IPS')} ${address}`);
  }
  return `${lines.join('\n')}\n`;
}

/** iptablesJumpChain: table, from, to, comment; createAndLinkKubeChain prepends each in this order. */
const JUMPS: Array<[string, string, string, string]> = [
  ['nat', 'OUTPUT', 'KUBE-SERVICES', 'kubernetes service portals'],
  ['nat', 'PREROUTING', 'KUBE-SERVICES', 'kubernetes service portals'],
  ['nat', 'POSTROUTING', 'KUBE-POSTROUTING', 'kubernetes postrouting rules'],
  ['filter', 'FORWARD', 'KUBE-FORWARD', 'kubernetes forwarding rules'],
  ['filter', 'INPUT', 'KUBE-NODE-PORT', 'kubernetes health check rules'],
  ['filter', 'INPUT', 'KUBE-PROXY-FIREWALL', 'kube-proxy firewall rules'],
  ['filter', 'FORWARD', 'KUBE-PROXY-FIREWALL', 'kube-proxy firewall rules'],
  ['filter', 'INPUT', 'KUBE-IPVS-FILTER', 'kubernetes ipvs access filter'],
  ['filter', 'OUTPUT', 'KUBE-IPVS-OUT-FILTER', 'kubernetes ipvs access filter'],
];

/** iptablesChains (and iptablesCleanupChains, the same list). */
const CHAINS: Array<[string, string]> = [
  ['nat', 'KUBE-SERVICES'],
  ['nat', 'KUBE-POSTROUTING'],
  ['nat', 'KUBE-NODE-PORT'],
  ['nat', 'KUBE-LOAD-BALANCER'],
  ['nat', 'KUBE-MARK-MASQ'],
  ['filter', 'KUBE-FORWARD'],
  ['filter', 'KUBE-NODE-PORT'],
  ['filter', 'KUBE-PROXY-FIREWALL'],
  ['filter', 'KUBE-SOURCE-RANGES-FIREWALL'],
  ['filter', 'KUBE-IPVS-FILTER'],
  ['filter', 'KUBE-IPVS-OUT-FILTER'],
];

/**
 * kube-proxy's nat and filter rules for one family, as its sync writes them for this node (sets
 * with entries: KUBE-LOOP-BACK, KUBE-CLUSTER-IP, KUBE-LOAD-BALANCER, KUBE-LOAD-BALANCER-LOCAL,
 * KUBE-IPVS-IPS), then its jumps, each inserted at rule 1 as EnsureRule(Prepend) does on a node
 * where they are missing.
 */
export function kubeProxyRestore(family: Family): string {
  const a = ADDR[family];
  const n = (name: string) => setName(family, name);
  const mark = `${MASQ_MARK}/${MASQ_MARK}`;
  const chains = (table: string) => CHAINS.filter(([t]) => t === table).map(([, c]) => `:${c} - [0:0]`);
  const jumps = (table: string) =>
    JUMPS.filter(([t]) => t === table).map(
      ([, from, to, comment]) => `-I ${from} 1 -m comment --comment "${comment}" -j ${to}`,
    );
  return [
    '*nat',
    ...chains('nat'),
    `-A KUBE-SERVICES -s ${a.loopback} -j RETURN`,
    `-A KUBE-POSTROUTING -m comment --comment "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose" -m set --match-set ${n('KUBE-LOOP-BACK')} dst,dst,src -j MASQUERADE`,
    `-A KUBE-SERVICES -m comment --comment "Kubernetes service lb portal" -m set --match-set ${n('KUBE-LOAD-BALANCER')} dst,dst -j KUBE-LOAD-BALANCER`,
    `-A KUBE-LOAD-BALANCER -m comment --comment "Kubernetes service load balancer ip + port with externalTrafficPolicy=local" -m set --match-set ${n('KUBE-LOAD-BALANCER-LOCAL')} dst,dst -j RETURN`,
    `-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set ${n('KUBE-CLUSTER-IP')} dst,dst ! -s ${a.clusterCidr} -j KUBE-MARK-MASQ`,
    '-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT',
    '-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ',
    `-A KUBE-SERVICES -m set --match-set ${n('KUBE-CLUSTER-IP')} dst,dst -j ACCEPT`,
    `-A KUBE-SERVICES -m set --match-set ${n('KUBE-LOAD-BALANCER')} dst,dst -j ACCEPT`,
    `-A KUBE-POSTROUTING -m mark ! --mark ${mark} -j RETURN`,
    `-A KUBE-POSTROUTING -j MARK --xor-mark ${MASQ_MARK}`,
    '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully',
    `-A KUBE-MARK-MASQ -j MARK --or-mark ${MASQ_MARK}`,
    ...jumps('nat'),
    'COMMIT',
    '*filter',
    ...chains('filter'),
    '-A KUBE-SOURCE-RANGES-FIREWALL -j DROP',
    `-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark ${mark} -j ACCEPT`,
    '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT',
    `-A KUBE-NODE-PORT -m comment --comment "Kubernetes health check node port" -m set --match-set ${n('KUBE-HEALTH-CHECK-NODE-PORT')} dst -j ACCEPT`,
    `-A KUBE-IPVS-FILTER -m set --match-set ${n('KUBE-LOAD-BALANCER')} dst,dst -j RETURN`,
    `-A KUBE-IPVS-FILTER -m set --match-set ${n('KUBE-CLUSTER-IP')} dst,dst -j RETURN`,
    `-A KUBE-IPVS-FILTER -m set --match-set ${n('KUBE-EXTERNAL-IP')} dst,dst -j RETURN`,
    `-A KUBE-IPVS-FILTER -m set --match-set ${n('KUBE-EXTERNAL-IP-LOCAL')} dst,dst -j RETURN`,
    `-A KUBE-IPVS-FILTER -m set --match-set ${n('KUBE-HEALTH-CHECK-NODE-PORT')} dst -j RETURN`,
    `-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set ${n('KUBE-IPVS-IPS')} dst -j REJECT`,
    ...jumps('filter'),
    'COMMIT',
    // The kubelet's hint (KEP-3178) in the variant it and kube-proxy use.
    '*mangle',
    ':KUBE-IPTABLES-HINT - [0:0]',
    'COMMIT',
    '',
  ].join('\n');
}

/** `ipvsadm -R` input: kube-proxy's virtual services (scheduler rr) and masquerading real servers. */
export function ipvsadmRestore(scenario: KubeProxyScenario): string {
  const lines: string[] = [];
  for (const vs of virtualServices(scenario)) {
    const flag = vs.protocol === 'tcp' ? '-t' : '-u';
    const service = `${bracket(vs.address)}:${PORT}`;
    lines.push(`-A ${flag} ${service} -s rr`);
    if (vs.realServer) lines.push(`-a ${flag} ${service} -r ${bracket(vs.realServer)}:${TARGET_PORT} -m -w 1`);
  }
  return `${lines.join('\n')}\n`;
}

/** servicePortChainNameBase / hashAndTruncate: base32 of the SHA-256, 8 characters, then the name. */
function hashed(name: string): string {
  const digest = createHash('sha256').update(name).digest();
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';
  let bits = 0;
  let value = 0;
  let out = '';
  for (const byte of digest.subarray(0, 5)) {
    value = (value << 8) | byte;
    bits += 8;
    while (bits >= 5) {
      out += alphabet[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  return `${out}-${name}`;
}

/**
 * kube-proxy's nftables-mode table for one family, with the lab's Services (see the header for
 * what is kept of setupNFTables and syncProxyRules). Port names are the protocols, as in the test's
 * Service objects.
 */
export function kubeProxyNftables(family: Family): string {
  const a = ADDR[family];
  const ipX = family === 'ipv4' ? 'ip' : 'ip6';
  const addrType = family === 'ipv4' ? 'ipv4_addr' : 'ipv6_addr';
  const chains: string[] = [];
  const elements: string[] = [];
  const chain = (name: string, rules: string[]) =>
    chains.push(`  chain ${name} {\n${rules.map((r) => `    ${r}\n`).join('')}  }`);
  for (const svc of SERVICES) {
    for (const protocol of svc.protocols) {
      const base = `default/${svc.name}/${protocol}/${protocol}`;
      const endpoint = svc.endpoint(family);
      const endpointChain = `endpoint-${hashed(`${base}__${endpoint.replaceAll(':', '.')}/${TARGET_PORT}`)}`;
      const cluster = `service-${hashed(base)}`;
      const local = `local-${hashed(base)}`;
      const external = `external-${hashed(base)}`;
      const toEndpoints = `numgen random mod 1 vmap { 0 : goto ${endpointChain} }`;
      chain(endpointChain, [
        `${ipX} saddr ${endpoint} jump mark-for-masquerade`,
        `meta l4proto ${protocol} dnat to ${bracket(endpoint)}:${TARGET_PORT}`,
      ]);
      chain(cluster, [
        `${ipX} daddr ${svc.clusterIp(family)} ${protocol} dport ${PORT} ${ipX} saddr != ${a.clusterCidr} jump mark-for-masquerade`,
        toEndpoints,
      ]);
      elements.push(`${svc.clusterIp(family)} . ${protocol} . ${PORT} : goto ${cluster}`);
      if (!svc.lb) continue;
      if (svc.local) chain(local, [toEndpoints]);
      chain(external, [
        `${ipX} saddr ${a.clusterCidr} goto ${cluster} comment "short-circuit pod traffic"`,
        `fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"`,
        `fib saddr type local goto ${cluster} comment "short-circuit local traffic"`,
        ...(svc.local ? [`goto ${local}`] : []),
      ]);
      elements.push(`${svc.lb(family)} . ${protocol} . ${PORT} : goto ${external}`);
    }
  }
  return [
    `table ${ipX} kube-proxy {`,
    '  comment "rules for kube-proxy"',
    '  chain nat-prerouting {\n    type nat hook prerouting priority -100; policy accept;\n    jump services\n  }',
    // nft 1.0.6 takes no symbolic priority on the nat output hook: dstnat is -100.
    '  chain nat-output {\n    type nat hook output priority -100; policy accept;\n    jump services\n  }',
    '  chain nat-postrouting {\n    type nat hook postrouting priority 100; policy accept;\n    jump masquerading\n  }',
    `  chain mark-for-masquerade {\n    mark set mark or ${MASQ_MARK}\n  }`,
    `  chain masquerading {\n    mark and ${MASQ_MARK} == 0 return\n    mark set mark xor ${MASQ_MARK}\n    masquerade fully-random\n  }`,
    ...chains,
    `  map service-ips {\n    type ${addrType} . inet_proto . inet_service : verdict\n    comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"\n    elements = { ${elements.join(',\n      ')} }\n  }`,
    `  chain services {\n    ${ipX} daddr . meta l4proto . th dport vmap @service-ips\n  }`,
    '}',
    '',
  ].join('\n');
}

/**
 * kube-proxy's cleanupLeftovers of IPVS mode, as an sh script in one process: every step runs, and
 * each failing command is printed as "failed: <command>: <its error>" (kube-proxy logs it and goes on).
 */
function ipvsCleanupScript(variant: IptablesVariant): string {
  const lines = [
    'run() { out=$("$@" 2>&1) || echo "failed: $*: $out"; }',
    'run ipvsadm -C',
    'run ip link del kube-ipvs0',
  ];
  for (const cmd of [`iptables-${variant}`, `ip6tables-${variant}`]) {
    for (const [table, from, to, comment] of JUMPS) {
      lines.push(`run ${cmd} -w -t ${table} -D ${from} -m comment --comment ${quote(comment)} -j ${to}`);
    }
    for (const [table, chainName] of CHAINS) lines.push(`run ${cmd} -w -t ${table} -F ${chainName}`);
    for (const [table, chainName] of CHAINS) lines.push(`run ${cmd} -w -t ${table} -X ${chainName}`);
  }
  for (const [name] of IPSETS) lines.push(`run ipset destroy ${name}`);
  return `${lines.join('\n')}\n`;
}

/** The kernel's major.minor, for kube-proxy's conn_reuse_mode rule. */
function kernelAtLeast(major: number, minor: number): boolean {
  const [maj, min] = readFileSync('/proc/sys/kernel/osrelease', 'utf8').split('.').map(Number) as [number, number];
  return maj > major || (maj === major && min >= minor);
}

const attempt = (cmd: string, args: string[], input?: string) => {
  try {
    sh(cmd, args, input);
  } catch {
    // not there
  }
};

export class IpvsLab {
  readonly suffix = Math.random().toString(16).slice(2, 8);
  readonly pod = `pod-${this.suffix}`;
  readonly localEndpoint = `lep-${this.suffix}`;
  readonly node2 = `node2-${this.suffix}`;
  readonly endpoint = `ep-${this.suffix}`;
  readonly outside = `out-${this.suffix}`;
  private readonly created: string[] = [];
  private readonly links = ['cni0', 'eth-n2', 'eth-out', `vpl-${this.suffix}`];

  /** Builds the node and its neighbours (no kube-proxy state: ipvsMode() puts it there). */
  setUp(): void {
    sh('ip', ['link', 'set', 'lo', 'up']);
    // NewProxier's sysctls. conn_reuse_mode is left as it is from kernel 5.9 on (kubernetes#93297);
    // before, kube-proxy sets 0. route_localnet is not the IPVS proxier's (it sets it nowhere in
    // this mode). Forwarding is the CNI's part, for the routed pods.
    const sysctls = [
      'net.ipv4.vs.conntrack=1',
      'net.ipv4.vs.expire_nodest_conn=1',
      'net.ipv4.vs.expire_quiescent_template=1',
      'net.ipv4.ip_forward=1',
      'net.ipv6.conf.all.forwarding=1',
    ];
    if (!kernelAtLeast(5, 9)) sysctls.push('net.ipv4.vs.conn_reuse_mode=0');
    sh('sysctl', ['-qw', ...sysctls]);

    for (const ns of [this.pod, this.localEndpoint, this.node2, this.endpoint, this.outside]) {
      sh('ip', ['netns', 'add', ns]);
      this.created.push(ns);
    }
    const v4 = ADDR.ipv4;
    const v6 = ADDR.ipv6;
    const vpl = `vpl-${this.suffix}`;
    const node = [
      // The CNI's bridge with this node's pod CIDR, and the client pod on it.
      'link add cni0 type bridge',
      `addr add ${v4.podGateway}/${v4.podPrefix} dev cni0`,
      `addr add ${v6.podGateway}/${v6.podPrefix} dev cni0 nodad`,
      'link set cni0 up',
      `link add veth-${this.suffix} type veth peer name eth0 netns ${this.pod}`,
      `link set veth-${this.suffix} master cni0 up`,
      // The local endpoint, a routed pod: its replies to the client pod come back through the node
      // (on the bridge they would go to the client directly, past IPVS, without br_netfilter).
      `link add ${vpl} type veth peer name eth0 netns ${this.localEndpoint}`,
      `addr add ${v4.podGateway}/32 dev ${vpl}`,
      `addr add ${v6.podGateway}/128 dev ${vpl} nodad`,
      `link set ${vpl} up`,
      `route add ${v4.localEndpoint}/32 dev ${vpl}`,
      `route add ${v6.localEndpoint}/128 dev ${vpl}`,
      // The node's own network: node2, whose pod CIDR is routed through it.
      `link add eth-n2 type veth peer name eth0 netns ${this.node2}`,
      `addr add ${v4.node}/${v4.nodePrefix} dev eth-n2`,
      `addr add ${v6.node}/${v6.nodePrefix} dev eth-n2 nodad`,
      'link set eth-n2 up',
      `route add ${v4.remoteNet} via ${v4.nodePeer}`,
      `route add ${v6.remoteNet} via ${v6.nodePeer}`,
      // The world outside the cluster, and the way to the load balancer.
      `link add eth-out type veth peer name eth0 netns ${this.outside}`,
      `addr add ${v4.outsideGateway}/${v4.outsidePrefix} dev eth-out`,
      `addr add ${v6.outsideGateway}/${v6.outsidePrefix} dev eth-out nodad`,
      'link set eth-out up',
      `route add default via ${v4.outside}`,
      `route add default via ${v6.outside}`,
    ];
    sh('ip', ['-batch', '-'], `${node.join('\n')}\n`);
    const host = (ns: string, lines: string[]) =>
      sh('ip', ['-n', ns, '-batch', '-'], `${['link set lo up', ...lines].join('\n')}\n`);
    host(this.pod, [
      `addr add ${v4.pod}/${v4.podPrefix} dev eth0`,
      `addr add ${v6.pod}/${v6.podPrefix} dev eth0 nodad`,
      'link set eth0 up',
      `route add default via ${v4.podGateway}`,
      `route add default via ${v6.podGateway}`,
    ]);
    host(this.localEndpoint, [
      `addr add ${v4.localEndpoint}/32 dev eth0`,
      `addr add ${v6.localEndpoint}/128 dev eth0 nodad`,
      'link set eth0 up',
      `route add ${v4.podGateway}/32 dev eth0`,
      `route add default via ${v4.podGateway}`,
      `route add ${v6.podGateway}/128 dev eth0`,
      `route add default via ${v6.podGateway}`,
    ]);
    // node2: its kube-ipvs0 binds what this node's does (kube-proxy binds every Service address on
    // every node); its pod network holds the endpoint; it routes this node's pod CIDR back here.
    host(this.node2, [
      'link add kube-ipvs0 type dummy',
      ...boundAddresses().map(
        (address) => `addr add ${address}/${ADDR[address.includes(':') ? 'ipv6' : 'ipv4'].hostPrefix} dev kube-ipvs0`,
      ),
      `addr add ${v4.nodePeer}/${v4.nodePrefix} dev eth0`,
      `addr add ${v6.nodePeer}/${v6.nodePrefix} dev eth0 nodad`,
      'link set eth0 up',
      'link add cni0 type bridge',
      `addr add ${v4.node2PodGateway}/${v4.podPrefix} dev cni0`,
      `addr add ${v6.node2PodGateway}/${v6.podPrefix} dev cni0 nodad`,
      'link set cni0 up',
      `link add veth-ep type veth peer name eth0 netns ${this.endpoint}`,
      'link set veth-ep master cni0 up',
      `route add ${v4.nodePodNet} via ${v4.node}`,
      `route add ${v6.nodePodNet} via ${v6.node}`,
    ]);
    sh('nsenter', [
      `--net=/run/netns/${this.node2}`,
      'sysctl',
      '-qw',
      'net.ipv4.ip_forward=1',
      'net.ipv6.conf.all.forwarding=1',
    ]);
    host(this.endpoint, [
      `addr add ${v4.endpoint}/${v4.podPrefix} dev eth0`,
      `addr add ${v6.endpoint}/${v6.podPrefix} dev eth0 nodad`,
      'link set eth0 up',
      `route add default via ${v4.node2PodGateway}`,
      `route add default via ${v6.node2PodGateway}`,
    ]);
    host(this.outside, [
      `addr add ${v4.outside}/${v4.outsidePrefix} dev eth0`,
      `addr add ${v6.outside}/${v6.outsidePrefix} dev eth0 nodad`,
      // The load balancer's own addresses (ipMode Proxy: traffic must reach it).
      `addr add ${v4.proxyLb}/32 dev lo`,
      `addr add ${v6.proxyLb}/128 dev lo`,
      'link set eth0 up',
      `route add default via ${v4.outsideGateway}`,
      `route add default via ${v6.outsideGateway}`,
    ]);
  }

  /**
   * kube-proxy (re)starting in IPVS mode: platformCleanup removes nftables mode's tables, the sync
   * makes kube-ipvs0, the ipsets, the virtual services of `scenario` and its chains in the iptables
   * `variant` (the one the node's kubelet uses). Chains are declared (and so flushed) and jumps
   * inserted with --noflush: nothing else in the tables is touched, as kube-proxy touches nothing else.
   */
  ipvsMode(variant: IptablesVariant, scenario: KubeProxyScenario): void {
    for (const table of ['ip kube-proxy', 'ip6 kube-proxy']) attempt('nft', ['delete', 'table', ...table.split(' ')]);
    // EnsureDummyDevice: a dummy link, left down as kube-proxy leaves it (there already when
    // kube-proxy restarts in the same mode); EnsureAddressBind: each address, also when bound.
    attempt('ip', ['link', 'add', 'kube-ipvs0', 'type', 'dummy']);
    const bind = boundAddresses().map(
      (address) => `addr replace ${address}/${ADDR[address.includes(':') ? 'ipv6' : 'ipv4'].hostPrefix} dev kube-ipvs0`,
    );
    sh('ip', ['-batch', '-'], `${bind.join('\n')}\n`);
    // -exist: the IPv6 sets that an earlier cleanup left (it destroys the IPv4 names only) are reused.
    sh('ipset', ['restore', '-exist'], ipsetRestore());
    sh('ipvsadm', ['-R'], ipvsadmRestore(scenario));
    sh(`iptables-${variant}-restore`, ['--noflush', '-w'], kubeProxyRestore('ipv4'));
    sh(`ip6tables-${variant}-restore`, ['--noflush', '-w'], kubeProxyRestore('ipv6'));
  }

  /** syncEndpoint in `scenario`: the real servers of the LoadBalancer IPs without a local endpoint. */
  setScenario(scenario: KubeProxyScenario): void {
    const lines: string[] = [];
    for (const vs of virtualServices('1.24+')) {
      if (vs.kind !== 'load-balancer' || vs.local || !vs.realServer) continue;
      const flag = vs.protocol === 'tcp' ? '-t' : '-u';
      const real = `${flag} ${bracket(vs.address)}:${PORT} -r ${bracket(vs.realServer)}:${TARGET_PORT}`;
      lines.push(scenario === '1.24+' ? `-a ${real} -m -w 1` : `-d ${real}`);
    }
    sh('ipvsadm', ['-R'], `${lines.join('\n')}\n`);
  }

  /**
   * kube-proxy restarted in nftables mode: platformCleanup removes IPVS mode's objects (the virtual
   * services, kube-ipvs0 with its addresses, the chains in the iptables `variant`, the IPv4-named
   * ipsets), then the sync writes table ip/ip6 kube-proxy. Returns the cleanup's failed commands,
   * which kube-proxy would log (an iptables chain still referenced by another's rules stays).
   */
  nftablesMode(variant: IptablesVariant): string[] {
    const failed = sh('sh', ['-c', ipvsCleanupScript(variant)])
      .split('\n')
      .filter((line) => line.startsWith('failed: '));
    sh('nft', ['-f', '-'], `${kubeProxyNftables('ipv4')}${kubeProxyNftables('ipv6')}`);
    return failed;
  }

  /**
   * Removes kube-proxy's and everyone's objects from the node's tables (a clean node for the next
   * set-up): IPVS, kube-ipvs0, both iptables variants' tables, the nft ruleset, the ipsets.
   */
  resetNode(): void {
    attempt('ipvsadm', ['-C']);
    attempt('ip', ['link', 'del', 'kube-ipvs0']);
    const empty = '*nat\nCOMMIT\n*filter\nCOMMIT\n*mangle\nCOMMIT\n';
    for (const variant of ['legacy', 'nft'] as const) {
      for (const family of ['iptables', 'ip6tables']) attempt(`${family}-${variant}-restore`, ['-w'], empty);
    }
    attempt('nft', ['flush', 'ruleset']);
    attempt('ipset', ['destroy']);
  }

  /** Removes the namespaces, kube-proxy's objects and the links of the node (also after a failed setUp). */
  tearDown(): void {
    for (const ns of this.created.splice(0)) attempt('ip', ['netns', 'del', ns]);
    for (const link of this.links) attempt('ip', ['link', 'del', link]);
    this.resetNode();
  }
}

const AGENT = fileURLToPath(new URL('./probe-agent.js', import.meta.url));

export interface ProbeAnswer {
  answer: string;
  local?: string;
  peer?: string;
  from?: string;
}

/**
 * The source port of the next probe: each probe of the file has one of its own, below the kernel's
 * ephemeral range (32768-60999), so that a line of IPVS's connection table (kept for minutes after
 * the connection) names one probe only.
 */
let nextLocalPort = 10_000;

/** One probe-agent.js process in a network namespace (and, when given, a cgroup). */
export class Agent {
  private nextId = 1;
  private readonly pending = new Map<number, (a: ProbeAnswer) => void>();
  private readonly child: ChildProcess;
  private readonly ready: Promise<void>;
  private stderr = '';

  constructor(
    readonly name: string,
    netns?: string,
    cgroupDir?: string,
  ) {
    let argv = [process.execPath, AGENT];
    if (netns) argv = ['nsenter', `--net=/run/netns/${netns}`, '--', ...argv];
    if (cgroupDir) argv = ['sh', '-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroupDir, ...argv];
    this.child = spawn(argv[0]!, argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'] });
    this.child.stderr!.on('data', (d: Buffer) => (this.stderr += d.toString()));
    this.ready = new Promise((resolve, reject) => {
      this.child.once('exit', (code) => reject(new Error(`${name} agent exited (${code}): ${this.stderr}`)));
      createInterface({ input: this.child.stdout! }).on('line', (line) => {
        const msg = JSON.parse(line) as { ready?: boolean; id?: number } & ProbeAnswer;
        if (msg.ready) resolve();
        else if (msg.id !== undefined) {
          this.pending.get(msg.id)?.(msg);
          this.pending.delete(msg.id);
        }
      });
    });
    this.ready.catch(() => undefined);
  }

  async started(): Promise<void> {
    await this.ready;
  }

  async request(
    op: 'tcp' | 'udp' | 'serve',
    address: string,
    port: number,
    options: { tag?: string; timeoutMs?: number; localPort?: number } = {},
  ): Promise<ProbeAnswer> {
    await this.ready;
    // A probe still looping after its test gave up must not write to a stopped agent.
    if (this.child.stdin!.writableEnded) return { answer: 'error:agent stopped' };
    const id = this.nextId++;
    const answer = new Promise<ProbeAnswer>((resolve) => this.pending.set(id, resolve));
    this.child.stdin!.write(`${JSON.stringify({ id, op, address, port, ...options })}\n`);
    return answer;
  }

  /** A TCP connect from a port of its own; `timeoutMs` is when the probe gives up and answers 'timeout'. */
  tcp(address: string, timeoutMs?: number): Promise<ProbeAnswer> {
    return this.request('tcp', address, PORT, { timeoutMs, localPort: Agent.localPort() });
  }

  udp(address: string, timeoutMs?: number): Promise<ProbeAnswer> {
    return this.request('udp', address, PORT, { timeoutMs, localPort: Agent.localPort() });
  }

  private static localPort(): number {
    const port = nextLocalPort;
    nextLocalPort = nextLocalPort >= 32_767 ? 10_000 : nextLocalPort + 1;
    return port;
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise((resolve) => this.child.once('exit', resolve));
    this.child.stdin!.end();
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
  }
}
