// The kernel's floor under an nft full sync, and where our path spends the time above it. For N
// LoadBalancer Services of the main benchmark (same Services, same model), each size in a
// network namespace of its own, with the map unsized (the kernel's resizable hash) and sized
// (`size`, a hash of fixed buckets):
// - floor: the N map elements (with their comments) as one netlink batch into the empty map,
//   built by the addon with libnftnl; "kernel" is sendmsg of the batch plus reading its acks
//   (nfnetlink runs the whole transaction inside sendmsg), "build" the batch's construction;
//   "no comment" the same without the element comments;
// - structure: the table, chains, rules and empty map as one JSON transaction;
// - the JSON path, as the controller's first sync runs it on a node without our table: the
//   document built in JavaScript (render + JSON.stringify, both families), and the whole
//   transaction through the addon; "above floor" is the whole less floor and structure:
//   libnftables' parse, evaluation and netlink build, and what the kernel does more for it;
// - again: the JSON path over the table it made (the map replaced and refilled), and the same
//   with the map flushed instead of replaced.
// Medians of --repeats runs after one that is not counted. Prints figures; asserts nothing.
//
//   node dist/bench/nft-floor.js [--sizes 10000,50000] [--repeats 5]

import { spawnSync } from 'node:child_process';
import { loadavg } from 'node:os';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { elementLines, loadNftAddon, type NftablesAddon } from '../src/backends/nft/addon-executor.js';
import { JsonWriter, Transaction, type MapObject } from '../src/backends/nft/objects.js';
import { MAP_NAME, TABLE_NAME, desiredTable, mapElement } from '../src/backends/nft/render.js';
import { deleteTables, writeTable } from '../src/backends/nft/transactions.js';
import { toNodeInfo, toServiceInfo } from '../src/kube/objects.js';
import { buildDesiredState } from '../src/model/desired-state.js';
import { FAMILIES, type DesiredState, type ModelConfig } from '../src/model/types.js';
import { benchNode, benchService } from './services.js';
import { median } from './stats.js';

const IN_NAMESPACE_FLAG = '--in-private-network-namespace';
/** The main benchmark's model settings (bench/run.ts). */
const MODEL: ModelConfig = {
  detectLocalMode: 'NodeCIDR',
  clusterCidrs: [],
  masqueradeBit: 14,
  localTrafficPolicyOnly: false,
};

type MapShape = 'unsized' | 'sized';

/** The full-sync transaction of both families, with the map sized as the renderer sizes it or not. */
function fullSync(desired: DesiredState, shape: MapShape, withEntries = true, flushMap = false): Transaction {
  const tx = new Transaction();
  for (const family of FAMILIES) {
    const state = withEntries ? desired[family] : { ...desired[family], entries: [] };
    const table = desiredTable(family, state, desired.masqueradeMark);
    // Sized for the entries even when written without them (the structure of the floor).
    if (!withEntries)
      table.maps = table.maps.map((m) => ({
        ...m,
        size: desiredTable(family, desired[family], desired.masqueradeMark).maps[0]!.size,
      }));
    if (shape === 'unsized') table.maps = table.maps.map((m): MapObject => ({ ...m, size: undefined }));
    writeTable(tx, table);
  }
  if (!flushMap) return tx;
  // The map flushed instead of replaced (how full syncs wrote it before maps were sized).
  const flushed = new Transaction();
  for (let i = 0; i < tx.operations.length; i++) {
    const op = tx.operations[i]!;
    if (op.verb === 'delete' && op.object.kind === 'map') {
      flushed.flush(op.object);
      i++; // the add of the map that follows
    } else {
      flushed.operations.push(op);
    }
  }
  return flushed;
}

async function ms(work: () => Promise<unknown> | unknown): Promise<number> {
  const started = performance.now();
  await work();
  return performance.now() - started;
}

async function measure(addon: NftablesAddon, services: number, repeats: number): Promise<string[]> {
  const infos = Array.from({ length: services }, (_, i) => toServiceInfo(benchService(i))).filter(
    (s) => s !== undefined,
  );
  const desired = buildDesiredState(infos, toNodeInfo(benchNode()), MODEL);
  const elements = desired.ipv4.entries.map(mapElement);
  const added = elementLines(elements, true)!;
  const addedBare = elementLines(
    elements.map((e) => ({ ...e, comment: undefined })),
    true,
  )!;
  const json = new JsonWriter();
  const dropTables = json.document(deleteTables(new Transaction(), FAMILIES));
  const flushMap = JSON.stringify({
    nftables: [{ flush: { map: { family: 'ip', table: TABLE_NAME, name: MAP_NAME } } }],
  });
  const rows: string[] = [];
  for (const shape of ['unsized', 'sized'] as const) {
    const structure = json.document(fullSync(desired, shape, false));
    const document = json.document(fullSync(desired, shape));
    const floor = { kernel: [] as number[], build: [] as number[], bare: [] as number[] };
    const flushDocument = json.document(fullSync(desired, shape, true, true));
    const path = { render: [] as number[], run: [] as number[], again: [] as number[], againFlush: [] as number[] };
    const structureMs: number[] = [];
    for (let r = 0; r <= repeats; r++) {
      const counted = r > 0;
      await addon.run(dropTables).catch(() => undefined);
      const s = await ms(() => addon.run(structure));
      const batch = await addon.writeElements!('ip', TABLE_NAME, MAP_NAME, '', added);
      await addon.run(flushMap);
      const bare = await addon.writeElements!('ip', TABLE_NAME, MAP_NAME, '', addedBare);
      await addon.run(dropTables);
      const render = await ms(() => json.document(fullSync(desired, shape)));
      const run = await ms(() => addon.run(document));
      const again = await ms(() => addon.run(document));
      const againFlush = await ms(() => addon.run(flushDocument));
      if (!counted) continue;
      structureMs.push(s);
      floor.kernel.push(batch.kernelMs);
      floor.build.push(batch.buildMs);
      floor.bare.push(bare.kernelMs);
      path.render.push(render);
      path.run.push(run);
      path.again.push(again);
      path.againFlush.push(againFlush);
    }
    await addon.run(dropTables);
    const f = (values: number[], width = 9) => `${median(values).toFixed(1)} ms`.padStart(width);
    // What the JSON path spends above the kernel's floor for the same objects.
    const above = path.run.map((v, i) => v - floor.kernel[i]! - structureMs[i]!);
    rows.push(
      [
        services.toLocaleString('en-US').padStart(8),
        shape.padEnd(8),
        f(floor.kernel),
        f(floor.bare, 10),
        f(floor.build, 8),
        f(structureMs),
        f(path.render, 10),
        f(path.run, 10),
        f(above, 12),
        f(path.again, 9),
        f(path.againFlush, 12),
      ].join('  '),
    );
  }
  return rows;
}

async function benchmark(sizes: number[], repeats: number): Promise<void> {
  console.log(
    `load average at start: ${loadavg()
      .map((l) => l.toFixed(2))
      .join(' ')}`,
  );
  console.log(
    'floor: the elements as one netlink batch into the empty map (kernel: sendmsg + acks); the JSON path: the first-sync document',
  );
  console.log(
    '   Services  map         floor   no comment    build  structure  JS document       whole  above floor      again  again flush',
  );
  for (const services of sizes) {
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
      ],
      { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] },
    );
    if (run.error) throw new Error(`cannot start the measure in a network namespace (unshare): ${run.error.message}`);
    if (run.status !== 0) throw new Error(`the floor measure at ${services} failed (exit ${run.status})`);
    process.stdout.write(run.stdout);
  }
  console.log(
    `load average at end: ${loadavg()
      .map((l) => l.toFixed(2))
      .join(' ')}`,
  );
}

/** `node dist/bench/nft-floor.js` and `--only nft-floor` of the main benchmark. */
export async function runNftFloor(sizes: number[], repeats: number): Promise<void> {
  await benchmark(sizes, repeats);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({
    options: {
      sizes: { type: 'string', default: '10000,50000' },
      repeats: { type: 'string', default: '5' },
      [IN_NAMESPACE_FLAG.slice(2)]: { type: 'boolean', default: false },
    },
  });
  const sizes = values.sizes.split(',').map(Number);
  const repeats = Math.max(1, Number(values.repeats));
  if (values[IN_NAMESPACE_FLAG.slice(2)]) {
    const load = loadNftAddon();
    if (!load.executor) throw new Error(load.reason);
    const addon = load.executor.addon;
    if (!addon.writeElements) throw new Error('the nftables addon was built without libnftnl: no element batches');
    for (const row of await measure(addon, sizes[0]!, repeats)) console.log(`   ${row}`);
  } else {
    await benchmark(sizes, repeats);
  }
}
