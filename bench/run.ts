// The performance suite: `npm run bench` (root). Measures, on the kernel, in a network namespace
// of its own, with Services served by the Kubernetes API stand-in over its real wire protocol:
//   full: full sync time of the running controller for N LoadBalancer Services, addon and CLI;
//   memory: resident memory of the controller with N Services cached;
//   first-packet: TCP set-up cost through the nft map, and through the original's rules;
//   startup, packet-latency: end to end with real packets, per backend (--backends): start ->
//     last Service answered through its LB IP, API write -> first packet through a moved address
//     (with nft also -> `nft monitor` shows the element in the kernel), and (with memory) resident
//     memory with 0 and 10,000 Services for the backends other than nft (nft's are memory's);
//   heap: a heap profile per Service at 10,000: which structures hold the bytes;
//   one-service: one tenant's Service of 10,000, 50,000 and 100,000 entries, per backend: time
//     to program it, /healthz meanwhile, the next Service, memory;
//   iptables-removal: the removal of one 10,000-entry Service from a 20,000-entry iptables table,
//     with the bound on rule deletes and without it (bench/iptables-removal.ts), printed before the report;
//   react (bench/react.ts) and probe-cost (bench/probe-cost.ts), alone: this tree against another
//     build, as users run them; the continuous probe off, at its defaults, at its limit.
// It opens with the targets' table: each figure before the footprint work and now.
// Prints a table and writes bench/results/<timestamp>.json. Asserts nothing.
// The latency measure runs the controller with --sync-period from --latency-sync-period (3s by
// default: changes then meet periodic resyncs, as the target says).

import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadNftAddon } from '../src/backends/nft/addon-executor.js';
import { NftCliExecutor } from '../src/backends/nft/executor.js';
import { desiredTable } from '../src/backends/nft/render.js';
import { writeTable } from '../src/backends/nft/transactions.js';
import { Transaction } from '../src/backends/nft/objects.js';
import { toNodeInfo, toServiceInfo } from '../src/kube/objects.js';
import { buildDesiredState } from '../src/model/desired-state.js';
import { FAMILIES } from '../src/model/types.js';
import { Controller, MiB, type ControllerFlags } from './controller.js';
import { measureFirstPacket, originalIptablesRules, type FirstPacketScenario } from './first-packet.js';
import { formatHeapProfile, heapProfile } from './heap-profile.js';
import {
  BackendEnvironment,
  E2E_BACKENDS,
  measureBackend,
  type E2eBackend,
  type EndToEndContext,
} from './end-to-end.js';
import { measureOneService } from './one-service.js';
import { compilePacketProbe, probeNode } from './prober.js';
import { benchmarkArgs, inPrivateNamespaces } from './namespace.js';
import { main as probeCost } from './probe-cost.js';
import { main as react } from './react.js';
import { formatReport, type BenchResults, type FullSyncResult, type MemoryResult } from './report.js';
import * as svc from './services.js';
import { log } from './services.js';
import { median, options, seededRandom } from './stats.js';

const SELF = fileURLToPath(import.meta.url);
const RESULTS_DIR = join(dirname(SELF), '..', '..', 'bench', 'results');
const MEASURES = [
  'full',
  'memory',
  'first-packet',
  'startup',
  'packet-latency',
  'heap',
  'one-service',
  'iptables-removal',
] as const;
type Measure = (typeof MEASURES)[number];
/** The measures that run alone, with options and namespaces of their own. */
const ALONE: Record<string, (argv: string[]) => Promise<void>> = { react, 'probe-cost': probeCost };
const TABLE = 'ipvs-node-controller';
/** The change-latency and the nft first-packet measures run at this size, as the targets say. */
const LATENCY_SERVICES = 10_000;
/** Memory with no Service (what the process costs by itself), then the sizes the brief names. */
const MEMORY_SIZES = [0, 10_000, 50_000];
/** Memory is also measured with V8 told to favour size, for contrast (a deployment choice). */
const MEMORY_NODE_FLAGS = [[], ['--optimize-for-size']];
const USAGE = `usage (root): npm run bench [-- OPTIONS]
  --sizes 1000,10000,50000     numbers of Services for full, memory (and first-packet at 10,000)
  --only ${MEASURES.join(',')}
                               the measures to run (default: all; latency: packet-latency)
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

function optionsOf(argv: string[]) {
  const o = options(argv, {
    ...{
      sizes: '1000,10000,50000',
      changes: 500,
      'full-syncs': 5,
      rounds: 5,
      connects: 10_000,
      only: MEASURES.join(','),
    },
    ...{
      'latency-sync-period': '3s',
      backends: 'nft',
      'startup-runs': 3,
      'iptables-changes': 50,
      'probe-from': 'node',
    },
  });
  const only = new Set<Measure>();
  for (const asked of o.only.split(',')) {
    // The change-to-kernel latency is packet-latency's `nft monitor` column.
    const m = asked === 'latency' ? 'packet-latency' : asked;
    if (!(MEASURES as readonly string[]).includes(m))
      throw new Error(`--only: '${m}' is not one of ${MEASURES.join(', ')}`);
    only.add(m as Measure);
  }
  const backends: E2eBackend[] = [];
  for (const b of o.backends.split(',')) {
    // `iptables` alone: the variant a node without other rules gets (nft).
    const name = b === 'iptables' ? 'iptables-nft' : b;
    if (!(E2E_BACKENDS as readonly string[]).includes(name))
      throw new Error(`--backends: '${b}' is not one of iptables, ${E2E_BACKENDS.join(', ')}`);
    backends.push(name as E2eBackend);
  }
  const probeFrom = o['probe-from'];
  if (probeFrom !== 'node' && probeFrom !== 'pod') throw new Error(`--probe-from: '${probeFrom}' is not node or pod`);
  const sizes = o.sizes.split(',').map((s) => options(['--sizes', s], { sizes: 1 }).sizes);
  return {
    ...{ backends, only, probeFrom: probeFrom as 'node' | 'pod', sizes: sizes.sort((a, b) => a - b) },
    ...{ changes: o.changes, fullSyncs: o['full-syncs'], rounds: o.rounds, connects: o.connects },
    ...{
      startupRuns: o['startup-runs'],
      iptablesChanges: o['iptables-changes'],
      latencySyncPeriod: o['latency-sync-period'],
    },
  };
}
type Options = ReturnType<typeof optionsOf>;

function parseOptions(argv: string[]): Options {
  try {
    return optionsOf(argv);
  } catch (err) {
    throw new Error(`${(err as Error).message}\n${USAGE}`);
  }
}

class Bench {
  /** `nft list table` of what the controller programmed, by number of Services. */
  private readonly tables = new Map<number, string>();

  private constructor(
    readonly cluster: svc.ServedCluster,
    readonly workDir: string,
    private readonly options: Options,
  ) {}

  static async start(options: Options): Promise<Bench> {
    const workDir = mkdtempSync(join(tmpdir(), 'ipvs-node-controller-bench-'));
    return new Bench(await svc.ServedCluster.start(workDir), workDir, options);
  }

  async close(): Promise<void> {
    await this.cluster.stop();
    rmSync(this.workDir, { recursive: true, force: true });
  }

  private controller(flags: Partial<ControllerFlags>): Controller {
    return Controller.start({ kubeconfig: this.cluster.kubeconfig, nodeName: svc.NODE_NAME, ...flags });
  }

  private saveTable(services: number): void {
    // -y: numeric priorities, which nft 1.0.6 reads back on the output hook.
    this.tables.set(services, execFileSync('nft', ['-y', 'list', 'table', 'ip', TABLE], { encoding: 'utf8' }));
  }

  private startupTimeoutMs(services: number): number {
    return 60_000 + services * 4;
  }

  async fullSync(services: number, executor: 'addon' | 'cli'): Promise<FullSyncResult> {
    this.cluster.serve(services);
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
    const services = this.cluster.standIn
      .list('Service')
      .map(toServiceInfo)
      .filter((s) => s !== undefined);
    const desired = buildDesiredState(services, toNodeInfo(svc.benchNode()), svc.BENCH_MODEL);
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

  /** A controller with --min-sync-period 0: memory with the Services cached; saves what it programmed for the first-packet measure. */
  async steadyState(services: number, memory: boolean, nodeFlags: string[] = []): Promise<MemoryResult | undefined> {
    this.cluster.serve(services);
    const c = this.controller({ minSyncPeriod: '0s', nodeFlags });
    try {
      await c.waitForSyncs('full', 1, this.startupTimeoutMs(services));
      if (nodeFlags.length === 0 && (services === 1 || services === LATENCY_SERVICES)) this.saveTable(services);
      if (!memory) return undefined;
      const flags = nodeFlags.length > 0 ? `, node ${nodeFlags.join(' ')}` : '';
      log(`memory, ${services.toLocaleString('en-US')} Services${flags}`);
      const { idle, heap, afterGc } = await c.settledMemory();
      return {
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
    } finally {
      await c.stop();
    }
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
    return measureFirstPacket(scenarios, {
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
        sinkRanges: [svc.INGRESS_RANGE, svc.MOVED_RANGE],
        clusterRange: svc.CLUSTER_RANGE,
        nodeAddress: `${svc.NODE_ADDRESS}/24`,
        ...(options.probeFrom === 'pod' ? { pod: { address: svc.POD_ADDRESS, gateway: svc.POD_GATEWAY } } : {}),
      });
      const probeBinary = compilePacketProbe(bench.workDir);
      const { cluster, workDir } = bench;
      context = { cluster, workDir, probeBinary, probeFrom: options.probeFrom, random: seededRandom(10) };
    }
    const needFirstPacket = options.only.has('first-packet');
    const memoryAt = (services: number) => options.only.has('memory') && MEMORY_SIZES.includes(services);
    const steady = async (services: number) => {
      for (const [i, nodeFlags] of MEMORY_NODE_FLAGS.entries()) {
        if (i > 0 && !memoryAt(services)) continue;
        const memory = await bench.steadyState(services, memoryAt(services), nodeFlags);
        if (memory) results.memory.push(memory);
      }
    };
    if (memoryAt(0)) await steady(0);
    if (needFirstPacket) await bench.steadyState(1, false);
    for (const services of options.sizes) {
      if (options.only.has('full')) {
        for (const executor of ['addon', 'cli'] as const)
          results.fullSync.push(await bench.fullSync(services, executor));
      }
      if (memoryAt(services) || (needFirstPacket && services === LATENCY_SERVICES)) await steady(services);
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
      results.backends!.push(r);
    }
    if (options.only.has('one-service')) {
      results.oneService = [];
      for (const backend of options.backends) {
        const env = new BackendEnvironment(backend, bench.workDir);
        try {
          const runs = await measureOneService(bench.cluster, env.controllerBackend, env.extraArgs, env.cleanupArgs);
          results.oneService.push(...runs.map((r) => ({ ...r, variant: backend })));
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
const alone = Object.keys(ALONE).find((m) =>
  args.some((a, i) => (a === '--only' && args[i + 1]?.split(',').includes(m)) || a === `--only=${m}`),
);
if (args.includes('--help') || args.includes('-h')) {
  console.log(USAGE);
} else if (alone) {
  // Builds, namespaces and processes of its own (bench/react.ts, bench/probe-cost.ts).
  await ALONE[alone]!(args).catch((err: unknown) => {
    process.stderr.write(`bench: ${alone}: ${(err as Error).stack ?? String(err)}\n`);
    process.exitCode = 1;
  });
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
