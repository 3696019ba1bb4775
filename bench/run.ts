// The performance suite: `npm run bench` (root). Measures, on the kernel, in a network namespace
// of its own, with Services served by the Kubernetes API stand-in over its real wire protocol:
//   1. full sync time of the running controller for N LoadBalancer Services, addon and CLI;
//   2. change-to-kernel latency of partial syncs (one Service's ingress IP changes);
//   3. resident memory of the controller with N Services cached;
//   4. first-packet cost (TCP set-up) through the nft map, and through the original's rules;
//   5. end to end with real packets, per backend (--backends): start -> last Service answered
//      through its LB IP (startup), API write -> first packet through a moved address
//      (packet-latency), first full sync, and (with memory) resident memory with 0 and 10,000
//      Services for the backends other than nft (nft's are in 3);
//   6. a heap profile per Service at 10,000 (heap): which structures hold the bytes;
//   7. one tenant's Service of 10,000, 50,000 and 100,000 entries (one-service), per backend
//      (--backends): time to program it, /healthz meanwhile, the next Service, memory;
//   8. the removal of one 10,000-entry Service from a 20,000-entry iptables table, both variants,
//      with the bound on rule deletes and without it (iptables-removal, bench/iptables-removal.ts),
//      and smaller removals with each path forced. Printed before the report, not part of it.
//  11. react (bench/react.ts, alone): this tree against another build, as users run them.
//  12. probe-cost (bench/probe-cost.ts, alone): the continuous probe off, at its defaults, at its limit.
// It opens with the targets' table: each figure before the footprint work and now.
// Prints a table and writes bench/results/<timestamp>.json. Asserts nothing.
// The latency measure runs the controller with --sync-period from --latency-sync-period (3s by
// default: changes then meet periodic resyncs, as the target says).

import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { loadNftAddon } from '../src/backends/nft/addon-executor.js';
import { NftCliExecutor } from '../src/backends/nft/executor.js';
import { desiredTable, mapElement } from '../src/backends/nft/render.js';
import { mapChanges, writeTable } from '../src/backends/nft/transactions.js';
import { Transaction } from '../src/backends/nft/objects.js';
import { toNodeInfo, toServiceInfo } from '../src/kube/objects.js';
import { buildDesiredState } from '../src/model/desired-state.js';
import { FAMILIES, type Entry } from '../src/model/types.js';
import { ApiStandIn } from '../testbed/api-server.js';
import { ControllerProcess, SETTLE_MS, type ControllerFlags } from './controller-process.js';
import { measureFirstPacket, originalIptablesRules, type FirstPacketScenario } from './first-packet.js';
import { compilePrograms } from './first-packet-programs.js';
import { formatHeapProfile, heapProfile } from './heap-profile.js';
import {
  BackendEnvironment,
  E2E_BACKENDS,
  idleMemory,
  measureBackend,
  type E2eBackend,
  type EndToEndContext,
} from './end-to-end.js';
import { measureOneService, type OneServiceContext } from './one-service.js';
import { ElementMonitor } from './kernel-monitor.js';
import { compilePacketProbe, probeNode } from './packet-probe.js';
import { benchmarkArgs, inPrivateNamespaces } from './namespace.js';
import { reactRequested, runReact } from './react.js';
import { probeCostRequested, runProbeCost } from './probe-cost.js';
import {
  formatReport,
  type BenchResults,
  type FullSyncResult,
  type LatencyResult,
  type MemoryResult,
} from './report.js';
import {
  BENCH_MODEL,
  CLUSTER_RANGE,
  INGRESS_RANGE,
  MOVED_RANGE,
  NODE_ADDRESS,
  NODE_NAME,
  POD_ADDRESS,
  POD_GATEWAY,
  benchNode,
  benchService,
  ingressIp,
  movedIp,
  serviceName,
} from './services.js';
import { median, percentile, seededRandom } from './stats.js';

const SELF = fileURLToPath(import.meta.url);
const RESULTS_DIR = join(dirname(SELF), '..', '..', 'bench', 'results');
const MEASURES = [
  'full',
  'latency',
  'memory',
  'first-packet',
  'startup',
  'packet-latency',
  'heap',
  'one-service',
  'iptables-removal',
] as const;
type Measure = (typeof MEASURES)[number];
const TABLE = 'ipvs-node-controller';
/** The change-latency and the nft first-packet measures run at this size, as the targets say. */
const LATENCY_SERVICES = 10_000;
/** Memory with no Service (what the process costs by itself), then the sizes the brief names. */
const MEMORY_SIZES = [0, 10_000, 50_000];
/** Memory is also measured with V8 told to favour size, for contrast (a deployment choice). */
const MEMORY_NODE_FLAGS = [[], ['--optimize-for-size']];
const MiB = 1024 * 1024;
/** The element the latency floor writes, at a fresh address each time (100.100.0.0/16). */
const FLOOR_ENTRY: Entry = {
  family: 'ipv4',
  externalIp: '',
  protocol: 'TCP',
  port: 443,
  clusterIp: '10.96.0.1',
  service: 'bench-floor/element',
};
const floorIp = (k: number) => `100.100.${(k >> 8) & 255}.${k & 255}`;

const USAGE = `usage (root): npm run bench [-- OPTIONS]
  --sizes 1000,10000,50000     numbers of Services for full, memory (and latency, first-packet at 10,000)
  --only ${MEASURES.join(',')}
                               the measures to run (default: all)
  --backends nft,iptables-nft,iptables-legacy,ebpf
                               backends of startup, packet-latency, memory and one-service (default nft)
  --changes 500 --iptables-changes 50 --rounds 5 --connects 10000 --full-syncs 5 --startup-runs 3
  --latency-sync-period 3s     the controller's --sync-period while latencies are measured
  --probe-from node|pod        where the end-to-end connections start
  --only react [--compare REF|none] [--node 24,20] [--cpu-prof] ...
                               alone: this tree against another build as users run them (bench/react.ts)
  --only probe-cost [--rounds 2] [--window 30] [--node 24]
                               alone: the continuous probe's cost, off / defaults / at its limit (bench/probe-cost.ts)
Prints a report and writes bench/results/<timestamp>.json; asserts nothing.`;

interface Options {
  sizes: number[];
  changes: number;
  fullSyncs: number;
  rounds: number;
  connects: number;
  only: Set<Measure>;
  latencySyncPeriod: string;
  backends: E2eBackend[];
  startupRuns: number;
  iptablesChanges: number;
  probeFrom: 'node' | 'pod';
}

function probeFrom(text: string): 'node' | 'pod' {
  if (text !== 'node' && text !== 'pod') throw new Error(`--probe-from: '${text}' is not node or pod`);
  return text;
}

function parseOptions(argv: string[]): Options {
  try {
    return optionsOf(argv);
  } catch (err) {
    throw new Error(`${(err as Error).message}\n${USAGE}`);
  }
}

function optionsOf(argv: string[]): Options {
  const { values } = parseArgs({
    args: argv,
    options: {
      sizes: { type: 'string', default: '1000,10000,50000' },
      changes: { type: 'string', default: '500' },
      'full-syncs': { type: 'string', default: '5' },
      rounds: { type: 'string', default: '5' },
      connects: { type: 'string', default: '10000' },
      only: { type: 'string', default: MEASURES.join(',') },
      'latency-sync-period': { type: 'string', default: '3s' },
      backends: { type: 'string', default: 'nft' },
      'startup-runs': { type: 'string', default: '3' },
      'iptables-changes': { type: 'string', default: '50' },
      'probe-from': { type: 'string', default: 'node' },
    },
  });
  const count = (flag: string, text: string) => {
    const n = Number(text);
    if (!Number.isInteger(n) || n < 1) throw new Error(`--${flag}: '${text}' is not a positive integer`);
    return n;
  };
  const only = new Set<Measure>();
  for (const m of values.only.split(',')) {
    if (!(MEASURES as readonly string[]).includes(m))
      throw new Error(`--only: '${m}' is not one of ${MEASURES.join(', ')}`);
    only.add(m as Measure);
  }
  const backends: E2eBackend[] = [];
  for (const b of values.backends.split(',')) {
    // `iptables` alone: the variant a node without other rules gets (nft).
    const name = b === 'iptables' ? 'iptables-nft' : b;
    if (!(E2E_BACKENDS as readonly string[]).includes(name))
      throw new Error(`--backends: '${b}' is not one of iptables, ${E2E_BACKENDS.join(', ')}`);
    backends.push(name as E2eBackend);
  }
  return {
    backends,
    startupRuns: count('startup-runs', values['startup-runs']),
    iptablesChanges: count('iptables-changes', values['iptables-changes']),
    probeFrom: probeFrom(values['probe-from']),
    sizes: values.sizes
      .split(',')
      .map((s) => count('sizes', s))
      .sort((a, b) => a - b),
    changes: count('changes', values.changes),
    fullSyncs: count('full-syncs', values['full-syncs']),
    rounds: count('rounds', values.rounds),
    connects: count('connects', values.connects),
    only,
    latencySyncPeriod: values['latency-sync-period'],
  };
}

function log(message: string): void {
  process.stderr.write(`[bench] ${message}\n`);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

class Bench {
  private readonly workDir = mkdtempSync(join(tmpdir(), 'ipvs-node-controller-bench-'));
  private readonly kubeconfig = join(this.workDir, 'kubeconfig');
  private services = 0;
  /** Fresh addresses handed out so far (bench/services.ts movedIp). */
  private moved = 0;
  /** `nft list table` of what the controller programmed, by number of Services. */
  private readonly tables = new Map<number, string>();

  private constructor(
    private readonly standIn: ApiStandIn,
    private readonly options: Options,
  ) {}

  static async start(options: Options): Promise<Bench> {
    const standIn = await ApiStandIn.start();
    const bench = new Bench(standIn, options);
    await standIn.writeKubeconfig(bench.kubeconfig);
    standIn.apply(benchNode());
    return bench;
  }

  async close(): Promise<void> {
    await this.standIn.stop();
    rmSync(this.workDir, { recursive: true, force: true });
  }

  /** Makes the stand-in serve exactly Services 0..n-1: a measure at 10,000 after one at 50,000 lists 10,000. */
  private ensureServices(n: number): void {
    if (n !== this.services) log(`serving ${n.toLocaleString('en-US')} Services`);
    for (; this.services < n; this.services++) this.standIn.apply(benchService(this.services));
    for (; this.services > n; this.services--) {
      const { namespace, name } = serviceName(this.services - 1);
      this.standIn.remove('Service', namespace, name);
    }
  }

  private controller(flags: Partial<ControllerFlags>): ControllerProcess {
    return ControllerProcess.start({
      kubeconfig: this.kubeconfig,
      nodeName: NODE_NAME,
      nftExecutor: 'addon',
      minSyncPeriod: '1s',
      syncPeriod: '1h',
      ...flags,
    });
  }

  private saveTable(services: number): void {
    // -y: numeric priorities, which nft 1.0.6 reads back on the output hook.
    this.tables.set(services, execFileSync('nft', ['-y', 'list', 'table', 'ip', TABLE], { encoding: 'utf8' }));
  }

  private startupTimeoutMs(services: number): number {
    return 60_000 + services * 4;
  }

  async fullSync(services: number, executor: 'addon' | 'cli'): Promise<FullSyncResult> {
    this.ensureServices(services);
    log(`full sync, ${services.toLocaleString('en-US')} Services, ${executor}`);
    const c = this.controller({ nftExecutor: executor, syncPeriod: '1s' });
    try {
      const timeout = this.startupTimeoutMs(services) + this.options.fullSyncs * (5_000 + services / 10);
      const syncs = await c.waitForSyncs('full', this.options.fullSyncs + 1, timeout);
      const [first, ...periodic] = syncs.slice(0, this.options.fullSyncs + 1);
      await c.stop();
      const transactionMs = await this.transactionAlone(executor);
      return {
        services,
        executor,
        entries: first!.entries,
        startToFirstSyncMs: first!.seenAt - c.startedAt,
        firstMs: first!.ms,
        firstModelMs: first!.modelMs,
        periodicMs: periodic.map((s) => s.ms),
        medianMs: median(periodic.map((s) => s.ms)),
        transactionMs,
        transactionMedianMs: median(transactionMs),
      };
    } finally {
      await c.stop();
    }
  }

  /**
   * The floor under a full sync on this machine at this moment: the controller's own full-sync
   * transaction (same renderer, same Services, both families) run by this process through the
   * same executor, over the table the controller left. What the controller adds is the rest.
   */
  private async transactionAlone(executor: 'addon' | 'cli'): Promise<number[]> {
    const services = this.standIn
      .list('Service')
      .map(toServiceInfo)
      .filter((s) => s !== undefined);
    const desired = buildDesiredState(services, toNodeInfo(benchNode()), BENCH_MODEL);
    const document = new Transaction();
    for (const f of FAMILIES) writeTable(document, desiredTable(f, desired[f], desired.masqueradeMark));
    const run = executor === 'addon' ? loadNftAddon().executor : new NftCliExecutor();
    if (!run) throw new Error('the nftables addon does not load');
    const times: number[] = [];
    for (let i = 0; i < this.options.fullSyncs; i++) {
      const started = performance.now();
      await run.run(document);
      times.push(performance.now() - started);
    }
    return times;
  }

  /**
   * A controller with --min-sync-period 0: memory with the Services cached, then (at 10,000,
   * without extra node flags) latency; saves what it programmed for the first-packet measure.
   */
  async steadyState(
    services: number,
    measure: { memory: boolean; latency: boolean },
    nodeFlags: string[] = [],
  ): Promise<{ memory?: MemoryResult; latency?: LatencyResult }> {
    this.ensureServices(services);
    const c = this.controller({
      minSyncPeriod: '0s',
      nodeFlags,
      ...(measure.latency ? { syncPeriod: this.options.latencySyncPeriod } : {}),
    });
    const out: { memory?: MemoryResult; latency?: LatencyResult } = {};
    try {
      await c.waitForSyncs('full', 1, this.startupTimeoutMs(services));
      if (nodeFlags.length === 0 && (services === 1 || services === LATENCY_SERVICES)) this.saveTable(services);
      if (measure.memory) {
        log(
          `memory, ${services.toLocaleString('en-US')} Services${nodeFlags.length > 0 ? `, node ${nodeFlags.join(' ')}` : ''}`,
        );
        await sleep(SETTLE_MS);
        const idle = c.residentMemory();
        const heap = await c.collectGarbage();
        await sleep(2_000);
        const afterGc = c.residentMemory();
        out.memory = {
          services,
          nodeFlags: nodeFlags.join(' '),
          rssIdleMiB: idle.rssBytes / MiB,
          rssAfterGcMiB: afterGc.rssBytes / MiB,
          peakRssMiB: afterGc.peakRssBytes / MiB,
          fileRssMiB: idle.fileRssBytes / MiB,
          heapUsedMiB: heap.heapUsedBytes / MiB,
          heapTotalMiB: heap.heapTotalBytes / MiB,
          externalMiB: heap.externalBytes / MiB,
        };
      }
      if (measure.latency) {
        out.latency = await this.changeLatency(c, services);
      }
    } finally {
      await c.stop();
    }
    return out;
  }

  /**
   * Moves one Service's ingress IP at a time (a random Service, a fresh address) and times, in
   * this process, from the write into the stand-in to the moment `nft monitor` shows the new
   * element in the kernel. Pauses between changes so that each is its own sync.
   */
  private async changeLatency(c: ControllerProcess, services: number): Promise<LatencyResult> {
    log(`change-to-kernel latency, ${services.toLocaleString('en-US')} Services, ${this.options.changes} changes`);
    const monitor = await ElementMonitor.start();
    const addon = loadNftAddon().executor;
    if (!addon) throw new Error('the nftables addon does not load');
    const random = seededRandom(4);
    const samplesMs: number[] = [];
    const floorMs: number[] = [];
    const partialBefore = c.syncs.length;
    let written: Entry | undefined;
    try {
      for (let k = 0; k < this.options.changes; k++) {
        const i = Math.floor(random() * (services - 1));
        const address = movedIp(this.moved++);
        const next = benchService(i, address);
        const seen = monitor.elementAdded(address, 10_000);
        const changedAt = performance.now();
        this.standIn.apply(next);
        samplesMs.push((await seen) - changedAt);
        await sleep(10 + Math.floor(random() * 20));
      }
      // The floor, after the controller's changes (commits of another process in between would
      // make the controller's libnftables re-read its cache): the same kind of transaction, one
      // element out and one in, written by this process through the addon and seen the same way.
      for (let k = 0; k < this.options.changes; k++) {
        const element: Entry = { ...FLOOR_ENTRY, externalIp: floorIp(k) };
        // The element written before is added again first (a no-op when it is there): a resync of
        // the controller removes elements it did not write.
        const document = new Transaction();
        if (written) mapChanges(document, 'ipv4', [], [mapElement(written)]);
        mapChanges(document, 'ipv4', written ? [mapElement(written)] : [], [mapElement(element)]);
        const floorSeen = monitor.elementAdded(element.externalIp, 10_000);
        const writtenAt = performance.now();
        await addon.run(document);
        floorMs.push((await floorSeen) - writtenAt);
        written = element;
        await sleep(10 + Math.floor(random() * 20));
      }
      if (written) {
        const again = mapChanges(new Transaction(), 'ipv4', [], [mapElement(written)]);
        await addon.run(mapChanges(again, 'ipv4', [mapElement(written)], []));
      }
    } finally {
      await monitor.stop();
    }
    await sleep(200);
    const fullSyncs = c.syncs.slice(partialBefore).filter((s) => s.mode === 'full').length;
    const partial = c.syncs
      .slice(partialBefore)
      .filter((s) => s.mode === 'partial')
      .map((s) => s.ms);
    return {
      services,
      executor: 'addon',
      changes: samplesMs.length,
      samplesMs,
      syncPeriod: this.options.latencySyncPeriod,
      fullSyncs,
      p50Ms: percentile(samplesMs, 50),
      p90Ms: percentile(samplesMs, 90),
      p99Ms: percentile(samplesMs, 99),
      maxMs: Math.max(...samplesMs),
      partialSyncs: partial.length,
      partialSyncP50Ms: percentile(partial, 50),
      partialSyncP99Ms: percentile(partial, 99),
      floorMs,
      floorP50Ms: percentile(floorMs, 50),
      floorP99Ms: percentile(floorMs, 99),
    };
  }

  /** What the end-to-end measures (bench/end-to-end.ts) need of the benchmark. */
  endToEndContext(probeBinary: string, probeFrom: 'node' | 'pod'): EndToEndContext {
    const random = seededRandom(10);
    return {
      kubeconfig: this.kubeconfig,
      nodeName: NODE_NAME,
      workDir: this.workDir,
      probeBinary,
      log,
      ensureServices: (n) => this.ensureServices(n),
      moveService: (i, ingress) => this.standIn.apply(benchService(i, ingress)),
      freshAddress: () => movedIp(this.moved++),
      lastIngress: (n) => ingressIp(n - 1),
      apiConnections: () => this.standIn.stats.connections,
      probeFrom,
      random,
    };
  }

  oneServiceContext(): OneServiceContext {
    return {
      kubeconfig: this.kubeconfig,
      nodeName: NODE_NAME,
      log,
      ensureServices: (n) => this.ensureServices(n),
      apply: (object) => this.standIn.apply(object),
      remove: (namespace, name) => this.standIn.remove('Service', namespace, name),
    };
  }

  get scratch(): string {
    return this.workDir;
  }

  async firstPacket(): Promise<BenchResults['firstPacket']> {
    const one = this.tables.get(1);
    const many = this.tables.get(LATENCY_SERVICES);
    const scenarios: FirstPacketScenario[] = [];
    const file = (name: string, text: string) => {
      const path = join(this.workDir, name);
      writeFileSync(path, text);
      return path;
    };
    if (one) scenarios.push({ label: 'nft map', services: 1, rules: { loader: 'nft', file: file('nft-1.nft', one) } });
    if (many) {
      scenarios.push({
        label: 'nft map',
        services: LATENCY_SERVICES,
        rules: { loader: 'nft', file: file('nft-n.nft', many) },
      });
      // The contrast: the same tables without the local-destination match (what a new connection
      // to an entry pays for the rules' going inert once kube-proxy unbinds the address).
      scenarios.push({
        label: 'nft map, no fib daddr',
        services: LATENCY_SERVICES,
        rules: { loader: 'nft', file: file('nft-n-no-fib.nft', many.replaceAll(' fib daddr type local', '')) },
      });
      const rules = file('iptables-n.rules', originalIptablesRules(LATENCY_SERVICES));
      for (const loader of ['iptables-legacy-restore', 'iptables-nft-restore'] as const) {
        scenarios.push({
          label: `original rules, ${loader.replace('-restore', '')}`,
          services: LATENCY_SERVICES,
          rules: { loader, file: rules },
        });
      }
    }
    log(
      `first packet: ${scenarios.length} scenarios x ${this.options.rounds} rounds x ${this.options.connects} connects`,
    );
    const programs = compilePrograms(this.workDir);
    return measureFirstPacket(scenarios, {
      programs,
      workDir: this.workDir,
      rounds: this.options.rounds,
      warmup: Math.ceil(this.options.connects / 5),
      connects: this.options.connects,
      onRound: (round) => log(`first packet, round ${round + 1} of ${this.options.rounds}`),
    });
  }
}

function tool(cmd: string, args: string[]): string {
  try {
    return execFileSync(cmd, args, { encoding: 'utf8' }).trim();
  } catch {
    return 'unknown';
  }
}

async function benchmark(argv: string[]): Promise<void> {
  const options = parseOptions(argv);
  if (options.only.has('iptables-removal')) {
    log('iptables: removing one large Service, with and without the bound on rule deletes');
    const run = spawnSync(process.execPath, [join(dirname(SELF), 'iptables-removal.js')], { stdio: 'inherit' });
    if (run.status !== 0) throw new Error(`the iptables-removal measure failed (exit ${run.status ?? run.signal})`);
    if (options.only.size === 1) return;
  }
  const results: BenchResults = {
    command: `npm run bench${argv.length > 0 ? ` -- ${argv.join(' ')}` : ''}`,
    startedAt: new Date().toISOString(),
    machine: {
      cpus: cpus().length,
      kernel: tool('uname', ['-r']),
      node: process.version,
      nft: tool('nft', ['--version']),
      loadAverageAtStart: loadavg().map((l) => Number(l.toFixed(2))),
    },
    fullSync: [],
    memory: [],
    firstPacket: [],
    backends: [],
    probeFrom: options.probeFrom,
  };
  const bench = await Bench.start(options);
  try {
    const endToEnd = options.only.has('startup') || options.only.has('packet-latency');
    const otherBackends: E2eBackend[] = options.only.has('memory') ? options.backends.filter((b) => b !== 'nft') : [];
    let context: EndToEndContext | undefined;
    if (endToEnd || otherBackends.length > 0) {
      probeNode({
        sinkRanges: [INGRESS_RANGE, MOVED_RANGE],
        clusterRange: CLUSTER_RANGE,
        nodeAddress: `${NODE_ADDRESS}/24`,
        ...(options.probeFrom === 'pod' ? { pod: { address: POD_ADDRESS, gateway: POD_GATEWAY } } : {}),
      });
      context = bench.endToEndContext(compilePacketProbe(bench.scratch), options.probeFrom);
    }
    const idle = new Map<E2eBackend, Awaited<ReturnType<typeof idleMemory>>>();
    // Before any Service is served: the stand-in never removes them.
    for (const backend of otherBackends) idle.set(backend, await idleMemory(context!, backend));
    const needFirstPacket = options.only.has('first-packet');
    const memoryAt = (services: number) => options.only.has('memory') && MEMORY_SIZES.includes(services);
    const steady = async (services: number, latency: boolean) => {
      for (const [i, nodeFlags] of MEMORY_NODE_FLAGS.entries()) {
        const plain = i === 0;
        if (!plain && !memoryAt(services)) continue;
        const out = await bench.steadyState(
          services,
          { memory: memoryAt(services), latency: plain && latency },
          nodeFlags,
        );
        if (out.memory) results.memory.push(out.memory);
        if (out.latency) results.latency = out.latency;
      }
    };
    if (memoryAt(0)) await steady(0, false);
    if (needFirstPacket) await bench.steadyState(1, { memory: false, latency: false });
    for (const services of options.sizes) {
      if (options.only.has('full')) {
        for (const executor of ['addon', 'cli'] as const)
          results.fullSync.push(await bench.fullSync(services, executor));
      }
      const latency = options.only.has('latency') && services === LATENCY_SERVICES;
      if (memoryAt(services) || latency || (needFirstPacket && services === LATENCY_SERVICES))
        await steady(services, latency);
    }
    if (needFirstPacket) results.firstPacket = await bench.firstPacket();
    for (const backend of options.backends) {
      const memory = otherBackends.includes(backend);
      if (!endToEnd && !memory) continue;
      const r = await measureBackend(context!, backend, {
        services: LATENCY_SERVICES,
        startupRuns: options.startupRuns,
        changes: options.changes,
        iptablesChanges: options.iptablesChanges,
        syncPeriod: options.latencySyncPeriod,
        memory,
        startup: options.only.has('startup'),
        packetLatency: options.only.has('packet-latency'),
      });
      const zero = idle.get(backend);
      if (zero && 'error' in zero) r.error = `${r.error ? `${r.error}; ` : ''}no Service: ${zero.error}`;
      else if (zero) {
        r.rssIdleMiB[0] = zero.rssIdleMiB;
        r.rssAfterGcMiB[0] = zero.rssAfterGcMiB;
      }
      results.backends!.push(r);
    }
    if (options.only.has('one-service')) {
      results.oneService = [];
      for (const backend of options.backends) {
        const env = new BackendEnvironment(backend, bench.scratch);
        try {
          for (const r of await measureOneService(
            bench.oneServiceContext(),
            env.controllerBackend,
            env.extraArgs,
            env.cleanupArgs,
          )) {
            results.oneService.push({ ...r, variant: backend });
          }
        } finally {
          env.close();
        }
      }
    }
    if (options.only.has('heap')) {
      log('heap profile, 0 and 10,000 Services');
      results.heapProfile = formatHeapProfile(await heapProfile([0, LATENCY_SERVICES]));
    }
  } finally {
    await bench.close();
  }
  results.finishedAt = new Date().toISOString();
  results.machine.loadAverageAtEnd = loadavg().map((l) => Number(l.toFixed(2)));
  process.stdout.write(formatReport(results));
  mkdirSync(RESULTS_DIR, { recursive: true });
  const path = join(RESULTS_DIR, `${results.startedAt.replace(/[:.]/g, '-')}.json`);
  writeFileSync(path, JSON.stringify(results, null, 2) + '\n');
  process.stdout.write(`\nresults: ${relative(process.cwd(), path)}\n`);
}

const args = benchmarkArgs();
if (args.includes('--help') || args.includes('-h')) {
  console.log(USAGE);
} else if (probeCostRequested(args)) {
  // Namespaces and processes of its own (bench/probe-cost.ts).
  void runProbeCost(args);
} else if (reactRequested(args)) {
  // Builds, namespaces and processes of its own (bench/react.ts).
  void runReact(args);
} else {
  // The options are checked before any namespace is made; a wrong one prints the usage.
  let usable = true;
  try {
    parseOptions(args);
  } catch (err) {
    console.error(`bench: ${(err as Error).message}`);
    process.exitCode = 2;
    usable = false;
  }
  if (usable) await inPrivateNamespaces(import.meta.url, 'bench', benchmark);
}
