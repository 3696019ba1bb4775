// A restart of the nft backend over the table it left, as at every start of the DaemonSet's pod:
// a fresh reconciler, driver and addon executor, whose first sync writes both families whole
// over a table that already holds exactly what they must. The table of --entries LoadBalancer
// entries of the benchmark (bench/services.ts) is written once, then --runs restarts are timed
// (the sync alone: the first sync of a new reconciler, its key-lookup probe included). Prints the
// median, the fastest and the slowest, and how the last map write went where the build says.
// Prints figures; asserts nothing. Re-runs itself inside `unshare --net --mount`.
//
//   node dist/bench/nft-restart.js [--entries 10000] [--runs 11]

import { performance } from 'node:perf_hooks';
import { loadNftAddon } from '../src/backends/nft/addon-executor.js';
import { NftDriver } from '../src/backends/nft/nft-driver.js';
import { buildDesiredState } from '../src/model/desired-state.js';
import { Reconciler } from '../src/reconciler/reconciler.js';
import { inPrivateNamespaces } from './namespace.js';
import { BENCH_MODEL, benchModelInput } from './services.js';
import { options } from './stats.js';

async function benchmark(args: string[]): Promise<void> {
  const { entries, runs } = options(args, { entries: 10_000, runs: 11 });
  const { services, node } = benchModelInput(entries);
  const desired = buildDesiredState(services, node, { ...BENCH_MODEL, maxEntries: entries });
  const executor = () => {
    const load = loadNftAddon();
    if (!load.executor) throw new Error(load.reason);
    return load.executor;
  };
  const first = new Reconciler(new NftDriver(executor()));
  const firstStart = performance.now();
  await first.sync(desired, { full: true });
  const firstMs = performance.now() - firstStart;
  const times: number[] = [];
  let maps: unknown[] = [];
  for (let i = 0; i < runs; i++) {
    const restarted = executor();
    // How each family's map was written, where the build tells (replaceElements, lastMapWrite).
    const written: unknown[] = [];
    const replace = (restarted as { replaceElements?: (...a: never[]) => Promise<unknown> }).replaceElements;
    if (replace) {
      Object.assign(restarted, {
        replaceElements: async (...a: never[]) => {
          const commit = await replace.apply(restarted, a);
          written.push({ family: a[0], ...(restarted as { lastMapWrite?: object }).lastMapWrite });
          return commit;
        },
      });
    }
    const reconciler = new Reconciler(new NftDriver(restarted));
    const start = performance.now();
    const result = await reconciler.sync(desired, { full: true });
    times.push(performance.now() - start);
    if (result.mode !== 'full') throw new Error(`a restart's first sync was ${result.mode}`);
    maps = written;
  }
  await first.cleanup();
  times.sort((a, b) => a - b);
  const ms = (t: number) => `${t.toFixed(1)} ms`;
  console.log(`nft restart over an identical table of ${desired.ipv4.entries.length} entries (IPv4), ${runs} runs`);
  console.log(`  first write (empty kernel): ${ms(firstMs)}`);
  console.log(
    `  restart, whole write: median ${ms(times[Math.floor(runs / 2)]!)}, fastest ${ms(times[0]!)}, slowest ${ms(times[runs - 1]!)}`,
  );
  for (const map of maps) console.log(`  the last restart's map write: ${JSON.stringify(map)}`);
}

await inPrivateNamespaces(import.meta.url, 'nft-restart', benchmark);
