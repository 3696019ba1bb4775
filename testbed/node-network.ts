// A simulated node for kernel tests. The test process itself must already run in a network
// namespace of its own (test/run.mjs starts kernel tests under `unshare --net --mount`, with a
// tmpfs on /run/netns in that mount namespace): that namespace plays the node. Pods and outside
// hosts are `ip netns` namespaces joined by veth.
//
//   pod ns  (10.244.1.2, fd01::2)  --veth--  node ns  --veth--  outside ns (192.168.50.2, fd50::2)
//                                             kube-ipvs0 (bridge, no ports): ClusterIPs and LB IPs

import { execFileSync, spawn } from 'node:child_process';
import { once } from 'node:events';
import { randomBytes } from 'node:crypto';
import { readFileSync, readlinkSync } from 'node:fs';
import * as dgram from 'node:dgram';
import * as net from 'node:net';
import { fileURLToPath } from 'node:url';

export function sh(cmd: string, args: string[], input?: string): string {
  return execFileSync(cmd, args, { encoding: 'utf8', input, stdio: ['pipe', 'pipe', 'pipe'] });
}

/**
 * Refuses to touch the machine's own network: some ancestor process (the one that ran
 * `unshare --net --mount`) must live in another network namespace and another mount namespace
 * than this process. The mount namespace alone does not keep the test's `ip netns` names off the
 * host: `ip netns add` creates its file in /run/netns, which is the host's directory unless a
 * tmpfs is mounted on it inside the namespace (test/run.mjs and demo/run.ts do); only the bind
 * mount of the namespace onto that file is private.
 */
export function assertIsolatedNetns(): void {
  for (const kind of ['net', 'mnt']) {
    if (!ancestorInOtherNamespace(kind)) {
      throw new Error(
        `kernel tests must run in a ${kind} namespace of their own: run them through \`npm test\` (unshare --net --mount)`,
      );
    }
  }
  sh('ip', ['link', 'set', 'lo', 'up']);
}

function ancestorInOtherNamespace(kind: string): boolean {
  const own = readlinkSync(`/proc/self/ns/${kind}`);
  for (let pid = process.ppid; pid > 1;) {
    try {
      if (readlinkSync(`/proc/${pid}/ns/${kind}`) !== own) return true;
    } catch {
      // An ancestor we may not inspect: look further up.
    }
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    pid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
  }
  return false;
}

export const NODE = {
  podCidr4: '10.244.1.0/24',
  podCidr6: 'fd01::/64',
  podGateway4: '10.244.1.1',
  podGateway6: 'fd01::1',
  outsideGateway4: '192.168.50.1',
  outsideGateway6: 'fd50::1',
};

export interface Host {
  ns: string;
  ipv4: string;
  ipv6: string;
}

/** The simulated node: pod and outside namespaces, and the kube-ipvs0 stand-in. */
export class NodeNetwork {
  readonly pod: Host;
  readonly outside: Host;
  private readonly suffix = randomBytes(3).toString('hex');
  private readonly created: string[] = [];
  private isolated = false;

  constructor() {
    this.pod = { ns: `pod-${this.suffix}`, ipv4: '10.244.1.2', ipv6: 'fd01::2' };
    this.outside = { ns: `out-${this.suffix}`, ipv4: '192.168.50.2', ipv6: 'fd50::2' };
  }

  setUp(): void {
    assertIsolatedNetns();
    this.isolated = true;
    forgetFlows();
    sh('sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
    sh('sysctl', ['-qw', 'net.ipv6.conf.all.forwarding=1']);
    sh('ip', ['link', 'add', 'kube-ipvs0', 'type', 'bridge']);
    sh('ip', ['link', 'set', 'kube-ipvs0', 'up']);
    this.addHost(this.pod, `vp${this.suffix}`, NODE.podGateway4, NODE.podGateway6, 24, 64);
    this.addHost(this.outside, `vo${this.suffix}`, NODE.outsideGateway4, NODE.outsideGateway6, 24, 64);
  }

  private addHost(host: Host, nodeIf: string, gw4: string, gw6: string, len4: number, len6: number): void {
    sh('ip', ['netns', 'add', host.ns]);
    this.created.push(host.ns);
    sh('ip', ['link', 'add', nodeIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', host.ns]);
    sh('ip', ['addr', 'add', `${gw4}/${len4}`, 'dev', nodeIf]);
    sh('ip', ['addr', 'add', `${gw6}/${len6}`, 'dev', nodeIf, 'nodad']);
    sh('ip', ['link', 'set', nodeIf, 'up']);
    const n = ['netns', 'exec', host.ns];
    sh('ip', [...n, 'ip', 'link', 'set', 'lo', 'up']);
    sh('ip', [...n, 'ip', 'addr', 'add', `${host.ipv4}/${len4}`, 'dev', 'eth0']);
    sh('ip', [...n, 'ip', 'addr', 'add', `${host.ipv6}/${len6}`, 'dev', 'eth0', 'nodad']);
    sh('ip', [...n, 'ip', 'link', 'set', 'eth0', 'up']);
    sh('ip', [...n, 'ip', 'route', 'add', 'default', 'via', gw4]);
    sh('ip', [...n, 'ip', '-6', 'route', 'add', 'default', 'via', gw6]);
  }

  /** The interface name of the pod's veth on the node side (for the interface detect-local modes). */
  get podVethName(): string {
    return `vp${this.suffix}`;
  }

  /** Binds an address on kube-ipvs0, as kube-proxy does for ClusterIPs and LoadBalancer IPs. */
  bindAddress(address: string): void {
    const len = address.includes(':') ? 128 : 32;
    sh('ip', ['addr', 'replace', `${address}/${len}`, 'dev', 'kube-ipvs0', ...(len === 128 ? ['nodad'] : [])]);
  }

  tearDown(): void {
    for (const ns of this.created.splice(0)) {
      try {
        sh('ip', ['netns', 'del', ns]);
      } catch {
        // already gone
      }
    }
    try {
      sh('ip', ['link', 'del', 'kube-ipvs0']);
    } catch {
      // already gone
    }
    // Only in the namespace setUp checked: never the machine's table.
    if (this.isolated) forgetFlows();
  }
}

/**
 * Empties the conntrack table of the test's own network namespace (setUp checked it is not the
 * machine's). Every NodeNetwork's pod has the same address, and the kernel picks a connection's
 * source port from a sequence that depends only on the addresses and the destination port, so a
 * pod's connections to one LoadBalancer IP reuse source ports after a few thousand connections,
 * across test files too. A reused port that meets an entry left untranslated and not closed (a
 * connection that timed out in SYN_SENT, one cut when its namespace went) is not a new
 * connection for conntrack: the SYN passes with the old entry's (absent) translation, and the
 * probe is answered by the LoadBalancer path whatever the rules say.
 */
function forgetFlows(): void {
  sh('conntrack', ['-F']);
}

/** A TCP and UDP server on one address and port that answers every request with its name. */
export class NamedServer {
  private constructor(
    private readonly tcp: net.Server,
    private readonly udp: dgram.Socket,
  ) {}

  static async start(address: string, port: number, name: string): Promise<NamedServer> {
    const tcp = net.createServer((sock) => {
      sock.on('error', () => undefined);
      sock.end(`${name}\n`);
    });
    tcp.listen(port, address);
    await once(tcp, 'listening');
    const udp = dgram.createSocket(address.includes(':') ? 'udp6' : 'udp4');
    udp.on('message', (_msg, rinfo) => udp.send(`${name}\n`, rinfo.port, rinfo.address));
    udp.bind(port, address);
    await once(udp, 'listening');
    return new NamedServer(tcp, udp);
  }

  async stop(): Promise<void> {
    await new Promise<void>((resolve) => this.tcp.close(() => resolve()));
    await new Promise<void>((resolve) => this.udp.close(() => resolve()));
  }
}

const PROBE_CLIENT = fileURLToPath(new URL('./probe-client.js', import.meta.url));

/**
 * Connects (TCP) or sends (UDP) to address:port from inside `ns` (undefined: the node namespace),
 * from `localPort` when given (else one the kernel picks), and returns which server answered.
 * Runs as a child process so it can enter another namespace.
 */
export async function probe(
  ns: string | undefined,
  protocol: 'tcp' | 'udp',
  address: string,
  port: number,
  timeoutMs = 1500,
  localPort?: number,
): Promise<string> {
  const args = [PROBE_CLIENT, protocol, address, String(port), String(timeoutMs)];
  if (localPort !== undefined) args.push(String(localPort));
  const [cmd, argv] = ns ? ['ip', ['netns', 'exec', ns, process.execPath, ...args]] : [process.execPath, args];
  const child = spawn(cmd, argv as string[], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  await once(child, 'close');
  return out.trim();
}

/** nft counter of a table/chain rule with the given comment, or 0. */
export function readJsonCounters(family: string, table: string): Map<string, number> {
  const listing = JSON.parse(sh('nft', ['-j', 'list', 'table', family, table])) as {
    nftables: Array<{ rule?: { comment?: string; expr: Array<Record<string, unknown>> } }>;
  };
  const out = new Map<string, number>();
  for (const item of listing.nftables) {
    if (!item.rule?.comment) continue;
    const counter = item.rule.expr.find((e) => 'counter' in e) as { counter: { packets: number } } | undefined;
    if (counter) out.set(item.rule.comment, counter.counter.packets);
  }
  return out;
}

/** True when `ip` is a command this kernel test can rely on (used in before hooks to fail loudly). */
export function requireTools(...tools: string[]): void {
  for (const tool of tools) {
    try {
      execFileSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' });
    } catch {
      throw new Error(`kernel tests need '${tool}': run .ci/run or install it with apt-get`);
    }
  }
}
