// A node as kube-proxy's IPVS mode leaves it, on a kernel with real IPVS (the VM layer's guests:
// the machine's own kernel has no ip_vs). Followed: kube-proxy v1.31, pkg/proxy/ipvs/proxier.go
// (NewProxier's sysctls, createAndLinkKubeChain's chains and jumps, ipsetInfo and
// ipsetWithIptablesChain, writeIptablesRules, acceptIPVSTraffic) and ipset.go (names, types, the
// "KUBE-6-" prefix of the IPv6 sets), for a dual-stack node with --detect-local-mode=ClusterCIDR.
//
// The test process's own network namespace (a private one: see real-ipvs.test.ts) is the node:
//
//   pod ns (10.244.1.2, fd44:0:0:1::2) --veth-- cni0 (10.244.1.1, fd44:0:0:1::1)
//                                           node: kube-ipvs0 (dummy) holds the ClusterIPs and LB IPs;
//                                                 IPVS virtual services, ipsets, kube-proxy's chains
//   remote ns (another node's pod 10.244.2.5, fd44:0:0:2::5; reached via 172.18.0.2, fd18::2)
//                                  --veth-- eth-n2 (172.18.0.1, fd18::1: the node's address)
//   outside ns (192.168.50.2, fd50::2; also the load balancer of ipMode Proxy, 192.0.2.20)
//                                  --veth-- eth-out (192.168.50.1, fd50::1), the node's default route
//
// Nothing outside these namespaces is touched; tearDown() removes them (the node namespace itself
// goes with the test's process).

import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

export type IptablesVariant = 'legacy' | 'nft';
type Family = 'ipv4' | 'ipv6';

export const MASQ_MARK = '0x4000';

export const ADDR = {
  ipv4: {
    clusterCidr: '10.244.0.0/16',
    podGateway: '10.244.1.1',
    pod: '10.244.1.2',
    podPrefix: 24,
    endpoint: '10.244.2.5',
    remoteNet: '10.244.2.0/24',
    node: '172.18.0.1',
    nodePeer: '172.18.0.2',
    nodePrefix: 24,
    outsideGateway: '192.168.50.1',
    outside: '192.168.50.2',
    outsidePrefix: 24,
    clusterIp: '10.96.0.10',
    proxyClusterIp: '10.96.0.12',
    lb: '192.0.2.10',
    proxyLb: '192.0.2.20',
    loopback: '127.0.0.0/8',
  },
  ipv6: {
    clusterCidr: 'fd44::/56',
    podGateway: 'fd44:0:0:1::1',
    pod: 'fd44:0:0:1::2',
    podPrefix: 64,
    endpoint: 'fd44:0:0:2::5',
    remoteNet: 'fd44:0:0:2::/64',
    node: 'fd18::1',
    nodePeer: 'fd18::2',
    nodePrefix: 64,
    outsideGateway: 'fd50::1',
    outside: 'fd50::2',
    outsidePrefix: 64,
    clusterIp: 'fd96::10',
    proxyClusterIp: 'fd96::12',
    lb: '2001:db8::10',
    proxyLb: '2001:db8::20',
    loopback: '::1/128',
  },
} as const;

/** Service port and the endpoint's target port. */
export const PORT = 80;
export const TARGET_PORT = 8080;

/** One IPVS virtual service: a ClusterIP with the endpoint as masquerading real server, or an LB IP with none. */
interface VirtualService {
  family: Family;
  protocol: 'tcp' | 'udp';
  address: string;
  realServer?: string;
}

/** The virtual services kube-proxy creates for the two Services of the test (see the test's Service objects). */
function virtualServices(): VirtualService[] {
  const out: VirtualService[] = [];
  for (const family of ['ipv4', 'ipv6'] as const) {
    const a = ADDR[family];
    for (const protocol of ['tcp', 'udp'] as const) {
      // svc-a: ClusterIP with the endpoint (on another node); its LoadBalancer IP with
      // externalTrafficPolicy Local has no endpoint on this node, so no real server.
      out.push({ family, protocol, address: a.clusterIp, realServer: a.endpoint });
      out.push({ family, protocol, address: a.lb });
    }
    // svc-proxy: the ClusterIP only; an ingress of ipMode Proxy is neither bound nor a virtual
    // service (kube-proxy >= 1.30 with LoadBalancerIPMode, KEP-1860): the load balancer gets it.
    out.push({ family, protocol: 'tcp', address: a.proxyClusterIp, realServer: a.endpoint });
  }
  return out;
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

/** `ipset restore` input: every set of ipsetInfo, and the entries of the test's Services. */
export function ipsetRestore(): string {
  const lines: string[] = [];
  const vss = virtualServices();
  for (const family of ['ipv4', 'ipv6'] as const) {
    const n = (name: string) => setName(family, name);
    for (const [name, type] of IPSETS) {
      const options =
        type === 'bitmap:port'
          ? 'range 0-65535'
          : `family ${family === 'ipv4' ? 'inet' : 'inet6'} hashsize 1024 maxelem 65536`;
      lines.push(`create ${n(name)} ${type} ${options}`);
    }
    const bound = new Set<string>();
    for (const vs of vss.filter((v) => v.family === family)) {
      const entry = `${vs.address},${vs.protocol}:${PORT}`;
      if (vs.realServer) lines.push(`add ${n('KUBE-CLUSTER-IP')} ${entry}`);
      else {
        lines.push(`add ${n('KUBE-LOAD-BALANCER')} ${entry}`);
        lines.push(`add ${n('KUBE-LOAD-BALANCER-LOCAL')} ${entry}`);
      }
      bound.add(vs.address);
    }
    for (const address of bound) lines.push(`add ${n('KUBE-IPVS-IPS')} ${address}`);
  }
  return `${lines.join('\n')}\n`;
}

/**
 * kube-proxy's nat and filter rules for one family, as its sync writes them for this node (sets
 * with entries: KUBE-CLUSTER-IP, KUBE-LOAD-BALANCER, KUBE-LOAD-BALANCER-LOCAL, KUBE-IPVS-IPS;
 * KUBE-LOOP-BACK is empty, no endpoint being local), then its jumps, each inserted at rule 1 as
 * EnsureRule(Prepend) does on a node where they are missing.
 */
export function kubeProxyRestore(family: Family): string {
  const a = ADDR[family];
  const n = (name: string) => setName(family, name);
  const mark = `${MASQ_MARK}/${MASQ_MARK}`;
  return [
    '*nat',
    ':KUBE-SERVICES - [0:0]',
    ':KUBE-POSTROUTING - [0:0]',
    ':KUBE-NODE-PORT - [0:0]',
    ':KUBE-LOAD-BALANCER - [0:0]',
    ':KUBE-MARK-MASQ - [0:0]',
    `-A KUBE-SERVICES -s ${a.loopback} -j RETURN`,
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
    '-I OUTPUT 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    '-I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    '-I POSTROUTING 1 -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING',
    'COMMIT',
    '*filter',
    ':KUBE-FORWARD - [0:0]',
    ':KUBE-NODE-PORT - [0:0]',
    ':KUBE-PROXY-FIREWALL - [0:0]',
    ':KUBE-SOURCE-RANGES-FIREWALL - [0:0]',
    ':KUBE-IPVS-FILTER - [0:0]',
    ':KUBE-IPVS-OUT-FILTER - [0:0]',
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
    '-I OUTPUT 1 -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER',
    '-I INPUT 1 -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER',
    '-I FORWARD 1 -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL',
    '-I INPUT 1 -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL',
    '-I INPUT 1 -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT',
    '-I FORWARD 1 -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD',
    'COMMIT',
    // The kubelet's hint (KEP-3178) in the variant it and kube-proxy use.
    '*mangle',
    ':KUBE-IPTABLES-HINT - [0:0]',
    'COMMIT',
    '',
  ].join('\n');
}

/** `ipvsadm -R` input: kube-proxy's virtual services (scheduler rr) and masquerading real servers. */
export function ipvsadmRestore(): string {
  const lines: string[] = [];
  for (const vs of virtualServices()) {
    const flag = vs.protocol === 'tcp' ? '-t' : '-u';
    const service = `${bracket(vs.address)}:${PORT}`;
    lines.push(`-A ${flag} ${service} -s rr`);
    if (vs.realServer) lines.push(`-a ${flag} ${service} -r ${bracket(vs.realServer)}:${TARGET_PORT} -m -w 1`);
  }
  return `${lines.join('\n')}\n`;
}

/** The kernel's major.minor, for kube-proxy's conn_reuse_mode rule. */
function kernelAtLeast(major: number, minor: number): boolean {
  const [maj, min] = readFileSync('/proc/sys/kernel/osrelease', 'utf8').split('.').map(Number) as [number, number];
  return maj > major || (maj === major && min >= minor);
}

export class IpvsLab {
  readonly suffix = Math.random().toString(16).slice(2, 8);
  readonly pod = `pod-${this.suffix}`;
  readonly remote = `remote-${this.suffix}`;
  readonly outside = `out-${this.suffix}`;
  private readonly created: string[] = [];

  /** Builds the node; kube-proxy's rules go in the iptables `variant` (the one the node's kubelet uses). */
  setUp(variant: IptablesVariant): void {
    sh('ip', ['link', 'set', 'lo', 'up']);
    // NewProxier's sysctls. conn_reuse_mode is left as it is from kernel 5.9 on (kubernetes#93297);
    // before, kube-proxy sets 0. route_localnet is not the IPVS proxier's (v1.31 sets it nowhere in
    // this mode). IPv6 forwarding is the CNI's part, for the routed pod.
    const sysctls = [
      'net.ipv4.vs.conntrack=1',
      'net.ipv4.vs.expire_nodest_conn=1',
      'net.ipv4.vs.expire_quiescent_template=1',
      'net.ipv4.ip_forward=1',
      'net.ipv6.conf.all.forwarding=1',
    ];
    if (!kernelAtLeast(5, 9)) sysctls.push('net.ipv4.vs.conn_reuse_mode=0');
    sh('sysctl', ['-qw', ...sysctls]);

    for (const ns of [this.pod, this.remote, this.outside]) {
      sh('ip', ['netns', 'add', ns]);
      this.created.push(ns);
    }
    const v4 = ADDR.ipv4;
    const v6 = ADDR.ipv6;
    const node = [
      // EnsureDummyDevice: a dummy link, left down as kube-proxy leaves it.
      'link add kube-ipvs0 type dummy',
      ...virtualServices()
        .filter((vs, i, all) => all.findIndex((o) => o.address === vs.address) === i)
        .map((vs) => `addr add ${vs.address}/${vs.family === 'ipv4' ? 32 : 128} dev kube-ipvs0`),
      // The CNI's bridge with this node's pod CIDR, and the local pod on it.
      'link add cni0 type bridge',
      `addr add ${v4.podGateway}/${v4.podPrefix} dev cni0`,
      `addr add ${v6.podGateway}/${v6.podPrefix} dev cni0 nodad`,
      'link set cni0 up',
      `link add veth-${this.suffix} type veth peer name eth0 netns ${this.pod}`,
      `link set veth-${this.suffix} master cni0 up`,
      // The node's own network: another node, whose pod CIDR is routed through it.
      `link add eth-n2 type veth peer name eth0 netns ${this.remote}`,
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
    host(this.remote, [
      `addr add ${v4.nodePeer}/${v4.nodePrefix} dev eth0`,
      `addr add ${v6.nodePeer}/${v6.nodePrefix} dev eth0 nodad`,
      `addr add ${v4.endpoint}/32 dev eth0`,
      `addr add ${v6.endpoint}/128 dev eth0 nodad`,
      'link set eth0 up',
      `route add default via ${v4.node}`,
      `route add default via ${v6.node}`,
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

    sh('ipset', ['restore'], ipsetRestore());
    sh('ipvsadm', ['-R'], ipvsadmRestore());
    sh(`iptables-${variant}-restore`, ['--noflush', '-w'], kubeProxyRestore('ipv4'));
    sh(`ip6tables-${variant}-restore`, ['--noflush', '-w'], kubeProxyRestore('ipv6'));
  }

  /** Removes the namespaces, kube-proxy's objects and the links of the node (also after a failed setUp). */
  tearDown(): void {
    const attempt = (cmd: string, args: string[], input?: string) => {
      try {
        sh(cmd, args, input);
      } catch {
        // not there
      }
    };
    for (const ns of this.created.splice(0)) attempt('ip', ['netns', 'del', ns]);
    for (const link of ['kube-ipvs0', 'cni0', 'eth-n2', 'eth-out']) attempt('ip', ['link', 'del', link]);
    attempt('ipvsadm', ['-C']);
    for (const variant of ['legacy', 'nft'] as const) {
      for (const family of ['iptables', 'ip6tables']) {
        for (const table of ['nat', 'filter', 'mangle']) {
          attempt(`${family}-${variant}`, ['-w', '-t', table, '-F']);
          attempt(`${family}-${variant}`, ['-w', '-t', table, '-X']);
        }
      }
    }
    attempt('ipset', ['destroy']);
  }
}

const AGENT = fileURLToPath(new URL('./probe-agent.js', import.meta.url));

export interface ProbeAnswer {
  answer: string;
  local?: string;
  peer?: string;
  from?: string;
}

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

  async request(op: 'tcp' | 'udp' | 'serve', address: string, port: number, tag?: string): Promise<ProbeAnswer> {
    await this.ready;
    // A probe still looping after its test gave up must not write to a stopped agent.
    if (this.child.stdin!.writableEnded) return { answer: 'error:agent stopped' };
    const id = this.nextId++;
    const answer = new Promise<ProbeAnswer>((resolve) => this.pending.set(id, resolve));
    this.child.stdin!.write(`${JSON.stringify({ id, op, address, port, tag })}\n`);
    return answer;
  }

  tcp(address: string, port = PORT): Promise<ProbeAnswer> {
    return this.request('tcp', address, port);
  }

  udp(address: string, port = PORT): Promise<ProbeAnswer> {
    return this.request('udp', address, port);
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
