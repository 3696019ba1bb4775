// Addon vs CLI: one full transaction of the controller's table with 10,000 map elements, and
// 200 single-element transactions (add, delete, add, ...) as partial syncs write them.
// Prints figures; asserts nothing. Re-runs itself inside `unshare --net` so the machine's own
// firewall is never touched.
//
//   node dist/bench/nft-executor.js

import { spawnSync } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { loadNftAddon } from '../src/backends/nft/addon-executor.js';
import { NftCliExecutor, type NftExecutor } from '../src/backends/nft/executor.js';
import {
  nftDocument,
  renderDeleteTablesJson,
  renderFullSyncJson,
  renderMapChangesJson,
} from '../src/backends/nft/render.js';
import type { Entry, FamilyState } from '../src/model/types.js';

const IN_NAMESPACE_FLAG = '--in-private-network-namespace';
const FULL_ELEMENTS = 10_000;
const FULL_REPEATS = 5;
const SINGLE_TRANSACTIONS = 200;

function entry(i: number): Entry {
  return {
    family: 'ipv4',
    externalIp: `198.${18 + ((i >> 16) & 1)}.${(i >> 8) & 255}.${i & 255}`,
    protocol: 'TCP',
    port: 443,
    clusterIp: `10.96.${(i >> 8) & 255}.${i & 255}`,
    service: `bench/service-${i}`,
  };
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? NaN;
}

async function timed(work: () => Promise<unknown>): Promise<number> {
  const start = performance.now();
  await work();
  return performance.now() - start;
}

async function measure(executor: NftExecutor): Promise<{ fullMs: number[]; singleMs: number }> {
  const state: FamilyState = {
    entries: Array.from({ length: FULL_ELEMENTS }, (_, i) => entry(i)),
    localPodMatch: { kind: 'cidrs', cidrs: ['10.244.1.0/24'] },
  };
  const full = nftDocument(renderFullSyncJson('ipv4', state, 0x4000));
  const fullMs: number[] = [];
  for (let i = 0; i < FULL_REPEATS; i++) fullMs.push(await timed(() => executor.run(full)));

  // Rendered beforehand: only the transactions are timed.
  const extra = entry(FULL_ELEMENTS);
  const add = nftDocument(renderMapChangesJson('ipv4', [], [extra]));
  const remove = nftDocument(renderMapChangesJson('ipv4', [extra], []));
  const singleMs = await timed(async () => {
    for (let i = 0; i < SINGLE_TRANSACTIONS; i++) await executor.run(i % 2 === 0 ? add : remove);
  });
  await executor.run(nftDocument(renderDeleteTablesJson(['ipv4'])));
  return { fullMs, singleMs };
}

async function benchmark(): Promise<void> {
  const load = loadNftAddon();
  if (!load.executor) throw new Error(load.reason);
  const executors: NftExecutor[] = [load.executor, new NftCliExecutor()];
  console.log(
    `full: one transaction of the whole table with ${FULL_ELEMENTS} map elements (median and min of ${FULL_REPEATS})`,
  );
  console.log(`single: ${SINGLE_TRANSACTIONS} transactions of one element each (add, delete, add, ...)`);
  console.log('executor  full median  full min  single total  single each');
  const ms = (value: number, digits: number, width: number) => `${value.toFixed(digits)} ms`.padStart(width);
  for (const executor of executors) {
    const { fullMs, singleMs } = await measure(executor);
    const columns = [
      executor.kind.padEnd(8),
      ms(median(fullMs), 1, 11),
      ms(Math.min(...fullMs), 1, 8),
      ms(singleMs, 0, 12),
      ms(singleMs / SINGLE_TRANSACTIONS, 2, 11),
    ];
    console.log(columns.join('  '));
  }
}

if (process.argv.includes(IN_NAMESPACE_FLAG)) {
  await benchmark();
} else {
  const self = fileURLToPath(import.meta.url);
  const run = spawnSync('unshare', ['--net', '--', process.execPath, self, IN_NAMESPACE_FLAG], { stdio: 'inherit' });
  if (run.error) throw new Error(`cannot start the benchmark in a network namespace (unshare): ${run.error.message}`);
  process.exitCode = run.status ?? 1;
}
