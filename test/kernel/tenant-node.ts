// A node for the tests of what one tenant's Service may do to the others: the simulated node of
// testbed/node-network.ts, the API stand-in, and the shipped controller on one backend (for ebpf:
// a cgroup subtree and a bpffs mount of the test's own, removed afterwards, also on failure).
// Connections from the node start inside the ebpf backend's cgroup, so that every backend
// translates them.

import { expect } from 'chai';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { defaultCgroupPath } from '../../src/backends/ebpf/ebpf-driver.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { NamedServer, NodeNetwork, sh } from '../../testbed/node-network.js';
import { shippedArgs } from '../../testbed/shipped-controller.js';
import { httpGet, scrapeMetrics, type Exposition } from '../support/scrape.js';

export type TenantBackend = 'nft' | 'iptables' | 'ebpf';
export const TENANT_BACKENDS: readonly TenantBackend[] = ['nft', 'iptables', 'ebpf'];

const PROBE_CLIENT = fileURLToPath(new URL('../../testbed/probe-client.js', import.meta.url));
const CONNECT_LOOP = fileURLToPath(new URL('./nft-connect-loop.js', import.meta.url));
export const NODE_NAME = 'node-1';
/** What answers a connection that was not translated. */
export const UNTRANSLATED = 'lb-path';

/** A LoadBalancer Service of one TCP port, created at `created`. */
export function lbService(
  name: string,
  clusterIp: string,
  ingress: string,
  port = 80,
  created = '2024-01-01T00:00:00Z',
) {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace: 'default', uid: `uid-${name}`, creationTimestamp: created },
    spec: {
      type: 'LoadBalancer',
      clusterIP: clusterIp,
      clusterIPs: [clusterIp],
      ports: [{ name: 'p', port, protocol: 'TCP' }],
    },
    status: { loadBalancer: { ingress: [{ ip: ingress }] } },
  };
}

export class TenantNode {
  readonly network = new NodeNetwork();
  api!: ApiStandIn;
  controller: ChildProcess | undefined;
  output = '';
  readonly healthzPort = 19_000 + Math.floor(Math.random() * 500);
  readonly metricsPort = this.healthzPort + 500;
  private readonly dir = mkdtempSync(join(tmpdir(), 'tenant-'));
  private readonly kubeconfig = join(this.dir, 'kubeconfig');
  private readonly servers: NamedServer[] = [];
  private bpffs: string | undefined;
  private cgroup: string | undefined;

  constructor(readonly backend: TenantBackend) {}

  async setUp(): Promise<void> {
    this.network.setUp();
    if (this.backend === 'ebpf') {
      const root = defaultCgroupPath();
      if (!root) expect.fail('no cgroup2 mount in /proc/mounts');
      this.cgroup = join(root, `ipvs-node-controller-tenant-${process.pid}`);
      mkdirSync(this.cgroup);
      this.bpffs = join(this.dir, 'bpffs');
      mkdirSync(this.bpffs);
      sh('mount', ['-t', 'bpf', 'bpf', this.bpffs]);
    }
    this.api = await ApiStandIn.start({ bookmarkIntervalMs: 500 });
    await this.api.writeKubeconfig(this.kubeconfig);
    this.api.apply({
      apiVersion: 'v1',
      kind: 'Node',
      metadata: { name: NODE_NAME },
      spec: { podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24'] },
      status: { addresses: [{ type: 'InternalIP', address: '192.168.50.1' }] },
    });
  }

  /** A server answering `name` on address:port; `bind` puts the address on kube-ipvs0 first. */
  async serve(address: string, port: number, name: string, bind = true): Promise<void> {
    if (bind) this.network.bindAddress(address);
    this.servers.push(await NamedServer.start(address, port, name));
  }

  /** Flags that put the controller on this node's backend. */
  private backendArgs(): string[] {
    const args = [`--backend=${this.backend}`];
    if (this.backend === 'ebpf') args.push('--cgroup-path', this.cgroup!, '--bpffs-path', join(this.bpffs!, 'pins'));
    return args;
  }

  startController(extra: string[] = []): void {
    this.output = '';
    const child = spawn(
      process.execPath,
      shippedArgs([
        ...this.backendArgs(),
        '--kubeconfig',
        this.kubeconfig,
        '--node-name',
        NODE_NAME,
        '--min-sync-period',
        '0',
        '--sync-period',
        '30s',
        `--healthz-bind-address=127.0.0.1:${this.healthzPort}`,
        `--metrics-bind-address=127.0.0.1:${this.metricsPort}`,
        '--log-level',
        'debug',
        ...extra,
      ]),
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    child.stdout!.on('data', (d: Buffer) => (this.output += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (this.output += d.toString()));
    this.controller = child;
  }

  async stopController(): Promise<void> {
    const c = this.controller;
    this.controller = undefined;
    if (!c || c.exitCode !== null) return;
    c.kill('SIGTERM');
    await once(c, 'exit');
  }

  /** Runs a command from the node, inside the ebpf backend's cgroup when there is one. */
  private spawnOnNode(args: string[], command = process.execPath): ChildProcess {
    if (!this.cgroup) return spawn(command, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    const procs = join(this.cgroup, 'cgroup.procs');
    return spawn('sh', ['-c', `echo $$ > ${procs} && exec "$0" "$@"`, command, ...args], {
      stdio: ['pipe', 'pipe', 'pipe'],
    });
  }

  /**
   * Connects (or sends, UDP) once from the node or from the pod namespace and returns who
   * answered. From the pod with the ebpf backend, inside its cgroup too, as a pod's processes are.
   */
  async probe(
    address: string,
    port: number,
    from: 'node' | 'pod' = 'node',
    protocol: 'tcp' | 'udp' = 'tcp',
  ): Promise<string> {
    const args = [PROBE_CLIENT, protocol, address, String(port), '1500'];
    const child =
      from === 'pod'
        ? this.spawnOnNode(['netns', 'exec', this.network.pod.ns, process.execPath, ...args], 'ip')
        : this.spawnOnNode(args);
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    await once(child, 'close');
    return out.trim();
  }

  /** Waits (generously) until a probe answers `expected`; returns how long it took. */
  async eventually(
    address: string,
    port: number,
    expected: string,
    timeoutMs = 20_000,
    { from = 'node', protocol = 'tcp' }: { from?: 'node' | 'pod'; protocol?: 'tcp' | 'udp' } = {},
  ): Promise<number> {
    const started = performance.now();
    let last = '';
    while (performance.now() - started < timeoutMs) {
      last = await this.probe(address, port, from, protocol);
      if (last === expected) return performance.now() - started;
      await sleep(50);
    }
    return expect.fail(`${address}:${port}: expected '${expected}', last answer '${last}'\n${this.tail()}`);
  }

  /** Waits (generously) until the controller has logged a line that matches. */
  async waitForOutput(pattern: RegExp, timeoutMs = 30_000): Promise<void> {
    const started = performance.now();
    while (!pattern.test(this.output)) {
      if (performance.now() - started > timeoutMs) expect.fail(`no log line matches ${pattern}\n${this.tail()}`);
      await sleep(50);
    }
  }

  /** A connection every `intervalMs` from the node until stop() says how they went. */
  async connectLoop(address: string, port: number, expected: string, intervalMs: number): Promise<ConnectLoop> {
    const child = this.spawnOnNode([CONNECT_LOOP, address, String(port), expected, String(intervalMs)]);
    const lines = createInterface({ input: child.stdout! });
    const started = new Promise<void>((resolve, reject) => {
      lines.on('line', (line) => line === 'started' && resolve());
      child.on('exit', () => reject(new Error('the connect loop ended before any answer')));
    });
    await started;
    return new ConnectLoop(child, lines);
  }

  async metrics(): Promise<Exposition> {
    return scrapeMetrics(`http://127.0.0.1:${this.metricsPort}`);
  }

  async readyz(): Promise<{ status: number; body: { detail?: string; warnings?: string[] } }> {
    const a = await httpGet(`http://127.0.0.1:${this.healthzPort}/readyz`);
    return { status: a.status, body: JSON.parse(a.body) as { detail?: string; warnings?: string[] } };
  }

  /** Resets the controller's resident-memory peak (VmHWM) to what it holds now. */
  resetPeakMemory(): void {
    writeFileSync(`/proc/${this.controller!.pid}/clear_refs`, '5');
  }

  /** The controller's resident-memory peak since the last reset, MiB. */
  peakMemoryMiB(): number {
    const status = readFileSync(`/proc/${this.controller!.pid}/status`, 'utf8');
    return Number(/^VmHWM:\s+(\d+) kB/m.exec(status)![1]) / 1024;
  }

  tail(): string {
    return this.output.split('\n').slice(-15).join('\n');
  }

  async tearDown(): Promise<void> {
    await this.stopController();
    // The node's namespace is the test process's, shared with the other tests: what the
    // controller programmed goes, and the eBPF programs before their cgroup and bpffs.
    const cleanup = spawn(process.execPath, shippedArgs(['--cleanup', ...this.backendArgs()]), { stdio: 'ignore' });
    await once(cleanup, 'exit');
    for (const s of this.servers.splice(0)) await s.stop();
    await this.api?.stop();
    if (this.bpffs) {
      try {
        sh('umount', [this.bpffs]);
      } catch {
        // not mounted
      }
    }
    if (this.cgroup) removeCgroup(this.cgroup);
    this.network.tearDown();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export class ConnectLoop {
  constructor(
    private readonly child: ChildProcess,
    private readonly lines: ReturnType<typeof createInterface>,
  ) {}

  /** Ends the loop; resolves with how its connections went. */
  async stop(): Promise<{ total: number; answered: number; failed: number; failures: unknown[] }> {
    const report = new Promise<string>((resolve) => this.lines.on('line', (l) => l.startsWith('{') && resolve(l)));
    this.child.stdin!.end();
    return JSON.parse(await report) as { total: number; answered: number; failed: number; failures: unknown[] };
  }
}

function removeCgroup(path: string): void {
  for (let i = 0; i < 100 && existsSync(path); i++) {
    try {
      rmdirSync(path);
    } catch {
      sh('sleep', ['0.05']); // a process that was in it is still leaving
    }
  }
}

/** Polls /healthz every second with the DaemonSet probe's 3 s timeout until stopped. */
export class HealthzWatch {
  readonly answers: Array<{ status: number | 'timeout' | string; ms: number; at: string }> = [];
  private stopped = false;
  private readonly loop: Promise<void>;

  constructor(private readonly port: number) {
    this.loop = this.run();
  }

  private async run(): Promise<void> {
    while (!this.stopped) {
      const started = performance.now();
      const status = await Promise.race([
        httpGet(`http://127.0.0.1:${this.port}/healthz`).then(
          (a) => a.status,
          (err: Error) => `error: ${err.message}`,
        ),
        sleep(3000).then(() => 'timeout' as const),
      ]);
      this.answers.push({ status, ms: performance.now() - started, at: new Date().toISOString() });
      await sleep(Math.max(0, 1000 - (performance.now() - started)));
    }
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.loop;
  }
}
