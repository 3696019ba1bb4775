// What the key set costs against the map looked up as a set (nft/render.ts, KeyLookup), side by
// side in one run, on the kernel this runs on: for N LoadBalancer Services of the main benchmark,
// each lookup in a network namespace of its own, through the reconciler and the nft driver as the
// controller runs them (the addon's netlink batches):
// - the first full sync of the N Services;
// - one change: a Service's ingress IP moves (one element out, one in, per family), a partial
//   sync, --changes times; p50 and p99 of the sync;
// - the kernel's memory for the table, read from /proc/meminfo's Slab before and after the first
//   sync (a rough figure: other allocations of the namespace count too).
// A lookup the kernel refuses is printed as refused, with the kernel's reason. Each lookup runs
// once at a tenth of the size first, not counted. Asserts nothing.
//
//   node dist/bench/key-lookup.js [--services 10000] [--changes 200] [--lookups map,set]

import { readFileSync } from 'node:fs';
import { release } from 'node:os';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { loadNftAddon } from '../src/backends/nft/addon-executor.js';
import { NftDriver } from '../src/backends/nft/nft-driver.js';
import type { KeyLookup } from '../src/backends/nft/render.js';
import { toNodeInfo, toServiceInfo } from '../src/kube/objects.js';
import { DesiredStateModel } from '../src/model/desired-state.js';
import type { ModelConfig, ServiceInfo } from '../src/model/types.js';
import { Reconciler } from '../src/reconciler/reconciler.js';
import { inPrivateNetworkNamespace } from './namespace.js';
import { benchNode, benchService, ingressIp } from './services.js';
import { percentile } from './stats.js';

/** The main benchmark's model settings (bench/run.ts). */
const MODEL: ModelConfig = {
  detectLocalMode: 'NodeCIDR',
  clusterCidrs: [],
  masqueradeBit: 14,
  localTrafficPolicyOnly: false,
};

interface Row {
  lookup: KeyLookup;
  refused?: string;
  fullSyncMs?: number;
  changeP50Ms?: number;
  changeP99Ms?: number;
  slabKiB?: number;
}

function slabKiB(): number {
  const line = readFileSync('/proc/meminfo', 'utf8')
    .split('\n')
    .find((l) => l.startsWith('Slab:'));
  return Number(line?.split(/\s+/)[1] ?? NaN);
}

async function measure(lookup: KeyLookup, services: number, changes: number): Promise<Row> {
  const load = loadNftAddon();
  if (!load.executor) throw new Error(`the nftables addon is needed: ${load.reason}`);
  const driver = new NftDriver(load.executor, { lookup });
  const probe = await driver.probe();
  if (!probe.ok) return { lookup, refused: probe.detail };
  const backend = new Reconciler(driver);
  const node = toNodeInfo(benchNode())!;
  const infos: ServiceInfo[] = Array.from({ length: services }, (_, i) => toServiceInfo(benchService(i))!);
  // The model as the controller keeps it: a change hands the reconciler its changed keys.
  const model = new DesiredStateModel(MODEL);
  const slabBefore = slabKiB();
  let started = performance.now();
  await backend.sync(model.update(infos, node), { full: true });
  const fullSyncMs = performance.now() - started;
  const slab = slabKiB() - slabBefore;
  const times: number[] = [];
  try {
    for (let c = 0; c < changes; c++) {
      // The ingress IP of one Service moves to an address no Service has.
      const i = (c * 7919) % services;
      infos[i] = toServiceInfo(benchService(i, ingressIp(services + c)))!;
      const desired = model.update(infos, node);
      started = performance.now();
      const result = await backend.sync(desired, { full: false });
      times.push(performance.now() - started);
      if (result.mode !== 'partial') throw new Error(`change ${c}: a ${result.mode} sync, not a partial one`);
    }
  } finally {
    await backend.cleanup();
    await backend.close?.();
  }
  return {
    lookup,
    fullSyncMs,
    changeP50Ms: percentile(times, 50),
    changeP99Ms: percentile(times, 99),
    slabKiB: slab,
  };
}

const fixed = (n: number | undefined, digits = 2) => (n === undefined ? '' : n.toFixed(digits));

await inPrivateNetworkNamespace(import.meta.url, async (args) => {
  const { values } = parseArgs({
    args,
    options: {
      services: { type: 'string', default: '10000' },
      changes: { type: 'string', default: '200' },
      lookups: { type: 'string', default: 'map,set' },
    },
  });
  const services = Number(values.services);
  const changes = Number(values.changes);
  console.log(`nft key lookup, ${services} LoadBalancer Services, ${changes} changes, Linux ${release()}`);
  console.log('| keys looked up in | first full sync (ms) | one change p50 (ms) | p99 (ms) | kernel slab (KiB) |');
  console.log('| --- | --- | --- | --- | --- |');
  const lookups = values.lookups.split(',') as KeyLookup[];
  // Not counted: the first run also pays for loading and compiling the code, whichever lookup it is.
  for (const lookup of lookups) await measure(lookup, Math.ceil(services / 10), Math.ceil(changes / 10));
  for (const lookup of lookups) {
    const row = await measure(lookup, services, changes);
    if (row.refused) {
      console.log(`| the ${lookup} | refused: ${row.refused} | | | |`);
      continue;
    }
    console.log(
      `| the ${lookup} | ${fixed(row.fullSyncMs, 0)} | ${fixed(row.changeP50Ms)} | ${fixed(row.changeP99Ms)} | ${row.slabKiB} |`,
    );
  }
});
