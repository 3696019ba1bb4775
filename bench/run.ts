// The performance suite: `npm run bench` (root). Measures, on the kernel, in a network namespace
// of its own, with Services served by the Kubernetes API stand-in over its real wire protocol:
//   full: full sync time of the running controller for N LoadBalancer Services, addon and CLI;
//   memory: resident memory of the controller with N Services cached;
//   startup, packet-latency: end to end with real packets, per backend (--backends): start ->
//     last Service answered through its LB IP, API write -> first packet through a moved address
//     (with nft also -> `nft monitor` shows the element in the kernel), and (with memory) resident
//     memory with 0 and 10,000 Services for the backends other than nft (nft's are memory's);
//   react (bench/react.ts) and probe-cost (bench/probe-cost.ts), alone: this tree against another
//     build, as users run them; the continuous probe off, at its defaults, at its limit.
// It opens with the targets' table: each figure before the footprint work and now.
// Prints a table and writes bench/results/<timestamp>.json. Asserts nothing.
// The latency measure runs the controller with --sync-period from --latency-sync-period (3s by
// default: changes then meet periodic resyncs, as the target says).

import { execFileSync } from 'node:child_process';
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
import { E2E_BACKENDS, measureBackend, type E2eBackend, type EndToEndContext } from './end-to-end.js';
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
const MEASURES = ['full', 'memory', 'startup', 'packet-latency'] as const;
type Measure = (typeof MEASURES)[number];
/** The measures that run alone, with options and namespaces of their own. */
const ALONE: Record<string, (argv: string[]) => Promise<void>> = { react, 'probe-cost': probeCost };
/** The end-to-end measures run at this size, as the targets say. */
const LATENCY_SERVICES = 10_000;
/** Memory with no Service (what the process costs by itself), then the sizes the targets name. */
const MEMORY_SIZES = [0, 10_000, 50_000];
/** Memory is also measured with V8 told to favour size, for contrast (a deployment choice). */
const MEMORY_NODE_FLAGS = [[], ['--optimize-for-size']];
const USAGE = `usage (root): npm run bench [-- OPTIONS]
  --sizes 1000,10000,50000     numbers of Services for full and memory
  --only ${MEASURES.join(',')}
                               the measures to run (default: all; latency: packet-latency)
  --backends nft,iptables-nft,iptables-legacy,iptables-legacy-uncommented,ebpf
                               backends of startup, packet-latency and memory (default nft)
  --changes 500 --iptables-changes 50 --full-syncs 5 --startup-runs 3
  --latency-sync-period 3s     the controller's --sync-period while latencies are measured
  --probe-from node|pod        where the end-to-end connections start
  --only react [--compare REF|none] [--node 24,20] [--cpu-prof] [--tcp-changes] ...
                               alone: this tree against another build as users run them (bench/react.ts)
  --only probe-cost [--rounds 2] [--window 30] [--node 24]
                               alone: the continuous probe's cost, off / defaults / at its limit (bench/probe-cost.ts)
Prints a report and writes bench/results/<timestamp>.json; asserts nothing.`;

function optionsOf(argv: string[]) {
  const o = options(argv, {
    ...{ sizes: '1000,10000,50000', changes: 500, 'full-syncs': 5, only: MEASURES.join(',') },
    ...{ 'latency-sync-period': '3s', backends: 'nft', 'startup-runs': 3, 'iptables-changes': 50 },
    'probe-from': 'node',
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
    ...{ changes: o.changes, fullSyncs: o['full-syncs'], startupRuns: o['startup-runs'] },
    ...{ iptablesChanges: o['iptables-changes'], latencySyncPeriod: o['latency-sync-period'] },
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
      const [{ entries, ms: firstMs, modelMs: firstModelMs, seenAt }, periodicMs] = [first!, periodic.map((s) => s.ms)];
      return {
        ...{ services, executor, entries, startToFirstSyncMs: seenAt - c.startedAt, firstMs, firstModelMs },
        ...{ periodicMs, medianMs: median(periodicMs), transactionMs, transactionMedianMs: median(transactionMs) },
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

  /** A controller with --min-sync-period 0: its memory with the Services cached. */
  async memory(services: number, nodeFlags: string[]): Promise<MemoryResult> {
    this.cluster.serve(services);
    const c = this.controller({ minSyncPeriod: '0s', nodeFlags });
    try {
      await c.waitForSyncs('full', 1, this.startupTimeoutMs(services));
      const flags = nodeFlags.length > 0 ? `, node ${nodeFlags.join(' ')}` : '';
      log(`memory, ${services.toLocaleString('en-US')} Services${flags}`);
      const { idle, heap, afterGc } = await c.settledMemory();
      const mib = (bytes: number) => bytes / MiB;
      return {
        ...{ services, nodeFlags: nodeFlags.join(' '), rssIdleMiB: mib(idle.rssBytes) },
        ...{ fileRssMiB: mib(idle.fileRssBytes), rssAfterGcMiB: mib(afterGc.rssBytes) },
        ...{ peakRssMiB: mib(afterGc.peakRssBytes), heapUsedMiB: mib(heap.heapUsed) },
        ...{ heapTotalMiB: mib(heap.heapTotal), externalMiB: mib(heap.external) },
      };
    } finally {
      await c.stop();
    }
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
    backends: [],
    probeFrom: options.probeFrom,
  };
  const bench = await Bench.start(options);
  try {
    const endToEnd = options.only.has('startup') || options.only.has('packet-latency');
    const otherBackends: E2eBackend[] = options.only.has('memory') ? options.backends.filter((b) => b !== 'nft') : [];
    let context: EndToEndContext | undefined;
    if (endToEnd || otherBackends.length > 0) {
      probeNode(options.probeFrom === 'pod' ? { pod: { address: svc.POD_ADDRESS, gateway: svc.POD_GATEWAY } } : {});
      const probeBinary = compilePacketProbe(bench.workDir);
      const { cluster, workDir } = bench;
      context = { cluster, workDir, probeBinary, probeFrom: options.probeFrom, random: seededRandom(10) };
    }
    const memoryAt = (services: number) => options.only.has('memory') && MEMORY_SIZES.includes(services);
    const memory = async (services: number) => {
      for (const nodeFlags of MEMORY_NODE_FLAGS) results.memory.push(await bench.memory(services, nodeFlags));
    };
    if (memoryAt(0)) await memory(0);
    for (const services of options.sizes) {
      if (options.only.has('full')) {
        for (const executor of ['addon', 'cli'] as const)
          results.fullSync.push(await bench.fullSync(services, executor));
      }
      if (memoryAt(services)) await memory(services);
    }
    for (const backend of options.backends) {
      const memory = otherBackends.includes(backend);
      if (!endToEnd && !memory) continue;
      const { startupRuns, changes, iptablesChanges, latencySyncPeriod: syncPeriod, only } = options;
      const measures = { memory, startup: only.has('startup'), packetLatency: only.has('packet-latency') };
      const asked = { services: LATENCY_SERVICES, startupRuns, changes, iptablesChanges, syncPeriod, ...measures };
      results.backends!.push(await measureBackend(context!, backend, asked));
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
  try {
    parseOptions(args);
  } catch (err) {
    console.error(`bench: ${(err as Error).message}`);
    process.exit(2);
  }
  await inPrivateNamespaces(benchmark);
}
