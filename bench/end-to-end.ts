// The end-to-end figures, per backend, with real packets (bench/prober.ts):
//   startup: from spawning the controller (all Services already served) to the first connection
//     from the node that succeeds through the LoadBalancer IP of the last Service;
//   packet latency: from writing a Service's new ingress IP into the API stand-in to the first
//     connection that succeeds through the new address (with the nft backend, also to the moment
//     `nft monitor` shows the element);
//   the first full sync ('synced' debug line) and resident memory with 0 and N Services.
// The backend's environment (ebpf: a cgroup v2 subtree and a bpffs mount; iptables-legacy: the
// kubelet's hint chain) is made here and removed afterwards, also on failure.

import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdirSync, mkdtempSync, rmdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { defaultCgroupPath } from '../src/backends/ebpf/ebpf-driver.js';
import { Controller, MiB, cleanupRules, sleep, type BenchBackend, type ControllerFlags } from './controller.js';
import { PacketProbe, POD_NETNS, msSince, throughAfter } from './prober.js';
import { BENCH_PORT, NODE_NAME, benchService, ingressIp, log, type ServedCluster } from './services.js';
import { percentile } from './stats.js';

/**
 * A backend as the benchmark runs it: iptables in either variant, and iptables-legacy with
 * --iptables-comments=false (its rules without their Service's name).
 */
export const E2E_BACKENDS = ['nft', 'iptables-nft', 'iptables-legacy', 'iptables-legacy-uncommented', 'ebpf'] as const;
export type E2eBackend = (typeof E2E_BACKENDS)[number];

export interface StartupRun {
  /** spawn -> first connection through the last Service's LB IP (start of that attempt). */
  firstPacketMs: number;
  /** The attempt before it started this much earlier (the resolution of the figure). */
  resolutionMs: number;
  /** spawn -> first log line (process up, code loaded). */
  firstLogMs: number;
  /** spawn -> 'caches synced' (lists done). */
  cachesSyncedMs: number;
  /** spawn -> first 'synced' line read by the benchmark. */
  firstSyncLineMs: number;
  /** The first full sync's own duration (its 'synced' line). */
  firstSyncMs: number;
  /** CPU time of the controller (all threads) when the first packet was seen. */
  cpuMs: number;
  /** ... when its first log line was read (process start, code loaded) and at 'caches synced'. */
  cpuAtFirstLogMs: number;
  cpuAtCachesSyncedMs: number;
  /** How long its main thread had waited for a CPU by then (load of the machine). */
  mainThreadWaitMs: number;
  attempts: number;
  /** TCP connections the controller opened to the API server from spawn to the first full sync. */
  apiConnections: number;
}

export interface PacketLatencyResult {
  changes: number;
  syncPeriod: string;
  /** API write -> start of the first attempt that connected through the new address. */
  samplesMs: number[];
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  maxMs: number;
  /** Per change: the attempt before the first that connected started this much earlier (ms). */
  resolutionMs: number[];
  resolutionP99Ms: number;
  /** API write -> `nft monitor` shows the element (nft only). */
  monitorMs?: number[];
  monitorP50Ms?: number;
  monitorP99Ms?: number;
  fullSyncs: number;
  partialSyncP50Ms: number;
  partialSyncP99Ms: number;
  /** Changes whose new address never answered within the timeout. */
  lost: number;
  /**
   * iptables-legacy: the floor under any write, with the controller's rules loaded: one
   * `iptables-legacy-restore --noflush` of a chain created and deleted in one commit (the tool reads
   * the whole nat table from the kernel and hands it back whole), ms, FLOOR_RESTORES times.
   */
  restoreFloorMs?: number[];
  restoreFloorP50Ms?: number;
  restoreFloorP99Ms?: number;
}

/** Restores the legacy floor is measured with. */
const FLOOR_RESTORES = 20;

/** The floor of one iptables-legacy write against the nat table as it is (see restoreFloorMs). */
function legacyRestoreFloor(): number[] {
  const input = '*nat\n:IPVS-BENCH-FLOOR - [0:0]\n-X IPVS-BENCH-FLOOR\nCOMMIT\n';
  const samples: number[] = [];
  for (let i = 0; i < FLOOR_RESTORES; i++) {
    const started = performance.now();
    execFileSync('iptables-legacy-restore', ['-w', '--noflush'], { input, stdio: ['pipe', 'ignore', 'pipe'] });
    samples.push(performance.now() - started);
  }
  return samples;
}

export interface BackendResult {
  backend: E2eBackend;
  services: number;
  startup: StartupRun[];
  rssIdleMiB: Record<string, number>;
  rssAfterGcMiB: Record<string, number>;
  packetLatency?: PacketLatencyResult;
  error?: string;
}

export interface EndToEndContext {
  cluster: ServedCluster;
  workDir: string;
  probeBinary: string;
  /** Where the connections start: the node itself, or the pod namespace (POD_NETNS). */
  probeFrom: 'node' | 'pod';
  random: () => number;
}

const run = (cmd: string, args: string[]) => execFileSync(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'] });

/** What a backend needs around the controller: flags, where the prober lives, and its removal. */
export class BackendEnvironment {
  readonly extraArgs: string[] = [];
  /** --cleanup visits every backend: it needs a bpffs to look at, even for nft and iptables. */
  readonly cleanupArgs: string[] = [];
  cgroupProcs: string | undefined;
  private readonly undo: Array<() => void> = [];

  constructor(
    readonly backend: E2eBackend,
    workDir: string,
  ) {
    try {
      const bpffs = mkdtempSync(join(workDir, 'bpffs-'));
      run('mount', ['-t', 'bpf', 'bpf', bpffs]);
      this.undo.push(() => {
        spawnSync('umount', [bpffs]);
        rmSync(bpffs, { recursive: true, force: true });
      });
      const pins = ['--bpffs-path', join(bpffs, 'ipvs-node-controller')];
      this.cleanupArgs.push(...pins);
      if (backend === 'ebpf') {
        const root = defaultCgroupPath();
        if (!root) throw new Error('no cgroup2 mount in /proc/mounts');
        const cgroup = join(root, `ipvs-node-controller-bench-${process.pid}`);
        mkdirSync(cgroup);
        this.undo.push(() => removeCgroup(cgroup));
        this.cgroupProcs = join(cgroup, 'cgroup.procs');
        this.extraArgs.push('--cgroup-path', cgroup, ...pins);
        this.cleanupArgs.push('--cgroup-path', cgroup);
      } else if (backend.startsWith('iptables-legacy')) {
        // kube-proxy's iptables-wrapper rule, which the controller follows: the kubelet's hint chain.
        run('iptables-legacy', ['-t', 'mangle', '-N', 'KUBE-IPTABLES-HINT']);
        this.undo.push(() => spawnSync('iptables-legacy', ['-t', 'mangle', '-X', 'KUBE-IPTABLES-HINT']));
        if (backend === 'iptables-legacy-uncommented') this.extraArgs.push('--iptables-comments=false');
      }
    } catch (err) {
      this.close();
      throw err;
    }
  }

  get controllerBackend(): BenchBackend {
    return this.backend.startsWith('iptables') ? 'iptables' : (this.backend as BenchBackend);
  }

  /** The instrumented controller's flags on this backend. */
  flags(ctx: EndToEndContext, more: Partial<ControllerFlags> = {}): ControllerFlags {
    return {
      kubeconfig: ctx.cluster.kubeconfig,
      nodeName: NODE_NAME,
      backend: this.controllerBackend,
      extraArgs: this.extraArgs,
      ...more,
    };
  }

  close(): void {
    for (const step of this.undo.splice(0).reverse()) {
      try {
        step();
      } catch {
        // best effort: the next step still runs
      }
    }
  }
}

function removeCgroup(path: string): void {
  for (let i = 0; i < 100 && existsSync(path); i++) {
    try {
      rmdirSync(path);
    } catch {
      // a process that was in it is still leaving
      execFileSync('sleep', ['0.05']);
    }
  }
}

export interface EndToEndOptions {
  services: number;
  startupRuns: number;
  changes: number;
  syncPeriod: string;
  /** Changes for the iptables backends (each rewrites all rules: seconds at 10,000). */
  iptablesChanges: number;
  memory: boolean;
  startup: boolean;
  packetLatency: boolean;
}

/** Measures one backend. Never throws for a backend failure: the result says what failed. */
export async function measureBackend(
  ctx: EndToEndContext,
  backend: E2eBackend,
  options: EndToEndOptions,
): Promise<BackendResult> {
  const result: BackendResult = { backend, services: options.services, startup: [], rssIdleMiB: {}, rssAfterGcMiB: {} };
  let env: BackendEnvironment | undefined;
  let probe: PacketProbe | undefined;
  let listener: PacketProbe | undefined;
  try {
    env = new BackendEnvironment(backend, ctx.workDir);
    const flags = (more: Partial<ControllerFlags>) => env!.flags(ctx, more);
    const cleanup = () => cleanupRules(flags({ extraArgs: env!.cleanupArgs }));
    cleanup();
    // From a pod, the ClusterIPs are still the node's: a prober there only listens; the pod's connects.
    const pod = ctx.probeFrom === 'pod' ? { netns: POD_NETNS } : undefined;
    if (pod) listener = await PacketProbe.start(ctx.probeBinary, { port: BENCH_PORT });
    probe = await PacketProbe.start(ctx.probeBinary, { port: BENCH_PORT, cgroupProcs: env.cgroupProcs, ...pod });
    const timeout = 60_000 + options.services * 4;

    if (options.startup) {
      ctx.cluster.serve(options.services);
      const target = ingressIp(options.services - 1);
      for (let r = 0; r < options.startupRuns; r++) {
        cleanup();
        log(`${backend}: start -> last Service answered, run ${r + 1} of ${options.startupRuns}`);
        const probing = await probe.begin(target, BENCH_PORT, timeout);
        const connections = () => ctx.cluster.standIn.stats.connections;
        const connectionsBefore = connections();
        const c = Controller.start(flags({}));
        try {
          const outcome = await probing.outcome;
          const sched = c.schedStats();
          const firstPacketMs = throughAfter(c.spawnedAtNs, outcome, target);
          const first = (await c.waitForSyncs('full', 1, timeout))[0]!;
          const since = (at: number | undefined) => (at ?? NaN) - c.startedAt;
          const resolutionMs = outcome.beforeOkNs > 0n ? Number(outcome.firstOkNs - outcome.beforeOkNs) / 1e6 : NaN;
          result.startup.push({
            ...{ firstPacketMs, resolutionMs, firstLogMs: since(c.firstLineAt) },
            ...{ cachesSyncedMs: since(c.cachesSyncedAt), firstSyncLineMs: since(first.seenAt), firstSyncMs: first.ms },
            ...sched,
            ...{ cpuAtFirstLogMs: c.cpuAtFirstLineMs ?? NaN, cpuAtCachesSyncedMs: c.cpuAtCachesSyncedMs ?? NaN },
            ...{ attempts: outcome.attempts, apiConnections: connections() - connectionsBefore },
          });
        } finally {
          await c.stop();
        }
      }
    }

    const steady = async (services: number, latency: boolean) => {
      ctx.cluster.serve(services);
      // Rules left by the startup runs would make the first sync a no-op, which logs nothing.
      cleanup();
      const c = Controller.start(
        flags({ minSyncPeriod: '0s', ...(latency ? { syncPeriod: options.syncPeriod } : {}) }),
      );
      try {
        await c.waitForSyncs('full', 1, timeout);
        if (options.memory) {
          log(`${backend}: memory, ${services.toLocaleString('en-US')} Services`);
          const { idle, afterGc } = await c.settledMemory();
          result.rssIdleMiB[services] = idle.rssBytes / MiB;
          result.rssAfterGcMiB[services] = afterGc.rssBytes / MiB;
        }
        if (latency) result.packetLatency = await packetLatency(ctx, c, probe!, backend, options);
      } finally {
        await c.stop();
      }
    };
    // With no Service first (what the process costs by itself), then with them.
    if (options.memory) await steady(0, false);
    if (options.memory || options.packetLatency) await steady(options.services, options.packetLatency);
    return result;
  } catch (err) {
    result.error = (err as Error).message;
    log(`${backend}: ${result.error}`);
    return result;
  } finally {
    await probe?.stop();
    await listener?.stop();
    if (env) {
      try {
        cleanupRules({ backend: env.controllerBackend, extraArgs: env.cleanupArgs });
      } catch (err) {
        log(`${backend}: cleanup: ${(err as Error).message}`);
      }
      env.close();
    }
  }
}

async function packetLatency(
  ctx: EndToEndContext,
  c: Controller,
  probe: PacketProbe,
  backend: E2eBackend,
  options: EndToEndOptions,
): Promise<PacketLatencyResult> {
  const changes = backend.startsWith('iptables') ? Math.min(options.changes, options.iptablesChanges) : options.changes;
  log(`${backend}: API write -> first packet through the new address, ${changes} changes`);
  const monitor = backend === 'nft' ? await ElementMonitor.start() : undefined;
  const samplesMs: number[] = [];
  const monitorMs: number[] = [];
  const resolutionMs: number[] = [];
  let lost = 0;
  const syncsBefore = c.syncs.length;
  try {
    for (let k = 0; k < changes; k++) {
      const i = Math.floor(ctx.random() * (options.services - 1));
      const address = ctx.cluster.freshAddress();
      // Up to 10 s (a full iptables rewrite takes seconds), resolution 150 us or 1 % of the wait.
      const probing = await probe.begin(address, BENCH_PORT, 10_000, 150, 100);
      const seen = monitor?.elementAdded(address, 10_000);
      const writtenNs = process.hrtime.bigint();
      const writtenAt = performance.now();
      ctx.cluster.standIn.apply(benchService(i, address));
      const outcome = await probing.outcome;
      if (outcome.ok) {
        samplesMs.push(msSince(writtenNs, outcome));
        if (outcome.beforeOkNs > 0n) resolutionMs.push(Number(outcome.firstOkNs - outcome.beforeOkNs) / 1e6);
      } else lost++;
      if (seen) monitorMs.push((await seen) - writtenAt);
      await sleep(10 + Math.floor(ctx.random() * 20));
    }
  } finally {
    await monitor?.stop();
  }
  await sleep(200);
  const floor = backend.startsWith('iptables-legacy') ? legacyRestoreFloor() : undefined;
  const during = c.syncs.slice(syncsBefore);
  const partial = during.filter((s) => s.mode === 'partial').map((s) => s.ms);
  return {
    ...{ changes, syncPeriod: options.syncPeriod, samplesMs, p50Ms: percentile(samplesMs, 50) },
    ...{ p90Ms: percentile(samplesMs, 90), p99Ms: percentile(samplesMs, 99), maxMs: Math.max(...samplesMs) },
    ...{ resolutionMs, resolutionP99Ms: percentile(resolutionMs, 99) },
    ...(monitor ? { monitorMs, monitorP50Ms: percentile(monitorMs, 50), monitorP99Ms: percentile(monitorMs, 99) } : {}),
    ...{ fullSyncs: during.filter((s) => s.mode === 'full').length, partialSyncP50Ms: percentile(partial, 50) },
    ...{ partialSyncP99Ms: percentile(partial, 99), lost },
    ...(floor
      ? { restoreFloorMs: floor, restoreFloorP50Ms: percentile(floor, 50), restoreFloorP99Ms: percentile(floor, 99) }
      : {}),
  };
}

/** Watches the kernel, not the controller: `nft -j monitor new elements` prints every map element the kernel commits, timestamped when read. */
class ElementMonitor {
  private readonly waiters = new Map<string, (at: number) => void>();
  private exited = false;

  private constructor(private readonly child: ChildProcess) {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      const at = performance.now();
      if (this.waiters.size === 0) return;
      for (const [needle, resolve] of this.waiters) {
        if (line.includes(needle)) {
          this.waiters.delete(needle);
          resolve(at);
        }
      }
    });
    child.on('exit', () => {
      this.exited = true;
    });
  }

  /** Starts the monitor and waits until it listens (it prints nothing until an event comes). */
  static async start(): Promise<ElementMonitor> {
    const child = spawn('nft', ['-j', 'monitor', 'new', 'elements'], { stdio: ['ignore', 'pipe', 'inherit'] });
    const monitor = new ElementMonitor(child);
    // nft reads the ruleset into its cache before it subscribes; give it that time.
    await new Promise((resolve) => setTimeout(resolve, 500));
    if (monitor.exited) throw new Error('`nft monitor` exited at once');
    return monitor;
  }

  /**
   * performance.now() at which an added element mentioning `address` (as a JSON string) was
   * seen. Register before causing the change.
   */
  elementAdded(address: string, timeoutMs: number): Promise<number> {
    const needle = `"${address}"`;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiters.delete(needle);
        reject(new Error(`no map element with ${address} reached the kernel within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiters.set(needle, (at) => {
        clearTimeout(timer);
        resolve(at);
      });
    });
  }

  async stop(): Promise<void> {
    if (this.exited) return;
    const exit = once(this.child, 'exit');
    this.child.kill('SIGTERM');
    await exit;
  }
}
