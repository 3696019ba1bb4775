// The controller's full-sync transaction on its own: the document the controller writes for N
// LoadBalancer Services of the main benchmark (same Services, same model, both families), run
// through the addon and through the CLI, each size in a network namespace of its own.
// - first: the first run of the process, on no table (what a controller's first sync pays:
//   libnftables' memory is new to the process, every page of it faulted in);
// - again: the same document over the table it made (median and min of the following runs).
// Wall time moves with the machine's load; CPU time (the process's user + system, libnftables'
// worker thread included; the CLI's own process is not counted) moves much less. Then 200
// single-element transactions (add, delete, add, ...) as partial syncs write them.
// Prints figures; asserts nothing.
//
//   node dist/bench/nft-executor.js [--sizes 10000,50000] [--repeats 5] [--executors addon,cli]

import { spawnSync } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { loadNftAddon } from '../src/backends/nft/addon-executor.js';
import { NftCliExecutor, type NftExecutor } from '../src/backends/nft/executor.js';
import { desiredTable, mapElement } from '../src/backends/nft/render.js';
import { deleteTables, mapChanges, writeTable } from '../src/backends/nft/transactions.js';
import { JsonWriter, Transaction } from '../src/backends/nft/objects.js';
import { toNodeInfo, toServiceInfo } from '../src/kube/objects.js';
import { buildDesiredState } from '../src/model/desired-state.js';
import { FAMILIES, type Entry, type ModelConfig } from '../src/model/types.js';
import { benchNode, benchService } from './services.js';

const IN_NAMESPACE_FLAG = '--in-private-network-namespace';
const SINGLE_TRANSACTIONS = 200;
/** The main benchmark's model settings (bench/run.ts). */
const MODEL: ModelConfig = {
  detectLocalMode: 'NodeCIDR',
  clusterCidrs: [],
  masqueradeBit: 14,
  localTrafficPolicyOnly: false,
};

const { values } = parseArgs({
  options: {
    sizes: { type: 'string', default: '10000,50000' },
    repeats: { type: 'string', default: '5' },
    executors: { type: 'string', default: 'addon,cli' },
    [IN_NAMESPACE_FLAG.slice(2)]: { type: 'boolean', default: false },
  },
});

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? NaN;
}

interface Run {
  wallMs: number;
  cpuMs: number;
}

async function timed(work: () => Promise<unknown>): Promise<Run> {
  const cpu = process.cpuUsage();
  const start = performance.now();
  await work();
  const wallMs = performance.now() - start;
  const used = process.cpuUsage(cpu);
  return { wallMs, cpuMs: (used.user + used.system) / 1000 };
}

/** The full-sync document of the controller for `services` Services, and one extra entry. */
function documents(services: number): { full: Transaction; bytes: number; extra: Entry } {
  const infos = Array.from({ length: services + 1 }, (_, i) => toServiceInfo(benchService(i))).filter(
    (s) => s !== undefined,
  );
  const desired = buildDesiredState(infos.slice(0, services), toNodeInfo(benchNode()), MODEL);
  const full = new Transaction();
  for (const f of FAMILIES) writeTable(full, desiredTable(f, desired[f], desired.masqueradeMark));
  const extra = buildDesiredState(infos.slice(services), toNodeInfo(benchNode()), MODEL).ipv4.entries[0]!;
  return { full, bytes: Buffer.byteLength(new JsonWriter().document(full)), extra };
}

async function measure(kind: string, services: number, repeats: number): Promise<string> {
  const executor: NftExecutor | undefined = kind === 'addon' ? loadNftAddon().executor : new NftCliExecutor();
  if (!executor) throw new Error(`the nftables addon does not load: ${JSON.stringify(loadNftAddon())}`);
  const { full, bytes, extra } = documents(services);
  const first = await timed(() => executor.run(full));
  const again: Run[] = [];
  for (let i = 1; i < repeats; i++) again.push(await timed(() => executor.run(full)));
  const add = mapChanges(new Transaction(), 'ipv4', [], [mapElement(extra)]);
  const remove = mapChanges(new Transaction(), 'ipv4', [mapElement(extra)], []);
  const single = await timed(async () => {
    for (let i = 0; i < SINGLE_TRANSACTIONS; i++) await executor.run(i % 2 === 0 ? add : remove);
  });
  await executor.run(deleteTables(new Transaction(), FAMILIES));
  const ms = (v: number, width = 8) => `${v.toFixed(1)} ms`.padStart(width + 3);
  const wall = again.map((r) => r.wallMs);
  const cpu = again.map((r) => r.cpuMs);
  return [
    kind.padEnd(6),
    services.toLocaleString('en-US').padStart(8),
    `${(bytes / 1024).toFixed(0)} KiB`.padStart(10),
    ms(first.wallMs),
    ms(first.cpuMs),
    ms(median(wall)),
    ms(Math.min(...wall)),
    ms(median(cpu)),
    ms(single.wallMs / SINGLE_TRANSACTIONS, 5),
  ].join('  ');
}

async function benchmark(): Promise<void> {
  const sizes = values.sizes.split(',').map(Number);
  const repeats = Math.max(2, Number(values.repeats));
  console.log(
    `load average at start: ${(await import('node:os'))
      .loadavg()
      .map((l) => l.toFixed(2))
      .join(' ')}`,
  );
  console.log(
    `full: the controller's first-sync document, both families; first run, then ${repeats - 1} over its own table`,
  );
  console.log(`single: ${SINGLE_TRANSACTIONS} transactions of one element each (add, delete, add, ...), mean`);
  console.log(
    'executor  Services    document   first wall    first CPU   again median   again min  again CPU med  single each',
  );
  for (const kind of values.executors.split(',')) {
    for (const services of sizes) {
      // A process per size and executor: the first run is the process's first, as in a controller.
      const run = spawnSync(
        'unshare',
        [
          '--net',
          '--',
          process.execPath,
          fileURLToPath(import.meta.url),
          IN_NAMESPACE_FLAG,
          '--sizes',
          String(services),
          '--repeats',
          String(repeats),
          '--executors',
          kind,
        ],
        { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] },
      );
      if (run.error)
        throw new Error(`cannot start the benchmark in a network namespace (unshare): ${run.error.message}`);
      if (run.status !== 0) throw new Error(`the ${kind} measure at ${services} failed (exit ${run.status})`);
      process.stdout.write(run.stdout);
    }
  }
}

if (values[IN_NAMESPACE_FLAG.slice(2)]) {
  const [services] = values.sizes.split(',').map(Number);
  console.log(await measure(values.executors, services!, Math.max(2, Number(values.repeats))));
} else {
  await benchmark();
}
