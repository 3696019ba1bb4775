// What one change costs the nft backend at N entries, its kernel write alone: the reconciler over
// the nft driver with the addon (as the controller runs them), N entries programmed whole, then
// one entry's address moved back and forth, each a partial sync (a netlink batch: one element
// removed, one added, in one transaction; and with the `set` key lookup of 5.10 and 6.1, the
// same in the key set). "floor": one element added to and removed from a map of one element in
// another table, by the same addon: what any nf_tables transaction costs on this kernel. Prints
// figures; asserts nothing. Re-runs itself inside `unshare --net`, so the machine's own firewall
// is never touched; run in the VM layer (scripts/vm/run.mjs) it measures a users' kernel.
//
//   node dist/bench/nft-change.js [--entries 10000] [--changes 50]

import { execFileSync } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { composeReconciler } from '../src/cli/compose.js';
import { loadNftAddon } from '../src/backends/nft/addon-executor.js';
import { NftDriver } from '../src/backends/nft/nft-driver.js';
import { DesiredStateModel } from '../src/model/desired-state.js';
import type { ModelConfig, ServiceInfo } from '../src/model/types.js';
import { pino } from 'pino';
import { inPrivateNamespaces } from './namespace.js';
import { median, options, percentile } from './stats.js';

const CONFIG: ModelConfig = {
  detectLocalMode: 'NodeCIDR',
  clusterCidrs: [],
  masqueradeBit: 14,
  localTrafficPolicyOnly: false,
  maxEntries: 300_000,
};
const NODE = { name: 'bench-node', podCIDRs: ['10.244.1.0/24'] };

const service = (i: number, ip: string): ServiceInfo => ({
  namespace: 'bench',
  name: `svc-${i}`,
  type: 'LoadBalancer',
  creationTimestamp: '2024-01-01T00:00:00Z',
  clusterIP: `10.96.${(i >> 8) & 255}.${i & 255}`,
  ports: [{ port: 443, protocol: 'TCP' }],
  ingress: [{ ip }],
});
const address = (i: number) => `100.64.${Math.floor(i / 250)}.${(i % 250) + 1}`;

async function benchmark(entries: number, changes: number): Promise<void> {
  const load = loadNftAddon();
  if (!load.executor) throw new Error(load.reason);
  const driver = new NftDriver(load.executor);
  const probe = await driver.probe();
  if (!probe.ok) throw new Error(probe.detail);
  const reconciler = composeReconciler(driver, { logger: pino({ level: 'silent' }), conntrack: null });
  const services = Array.from({ length: entries }, (_, i) => service(i, address(i)));
  // The model hands each state with what changed since the one before, as in the controller.
  const model = new DesiredStateModel(CONFIG);
  const wholeStart = performance.now();
  await reconciler.sync(model.update(services, NODE), { full: true });
  const wholeMs = performance.now() - wholeStart;
  const i = Math.floor(entries / 2);
  const changeMs: number[] = [];
  for (let k = 0; k < changes; k++) {
    services[i] = service(i, k % 2 === 0 ? `100.99.${k & 255}.1` : address(i));
    const desired = model.update(services, NODE);
    const start = performance.now();
    const result = await reconciler.sync(desired, { full: false });
    changeMs.push(performance.now() - start);
    if (result.mode !== 'partial') throw new Error(`a change was written ${result.mode}, not as a partial sync`);
  }
  // The floor: the same addon, one element in and out of a map of its own table.
  execFileSync('nft', ['-f', '-'], {
    input: 'table ip bench-floor {\n map m {\n  type ipv4_addr . inet_proto . inet_service : ipv4_addr\n }\n}\n',
  });
  const floorMs: number[] = [];
  const element = { key: ['192.0.2.1', 'tcp', 443], value: '10.96.0.1', comment: 'bench/floor' };
  const target = { table: 'bench-floor', map: 'm' };
  for (let k = 0; k < changes; k++) {
    const start = performance.now();
    await load.executor.applyElements('ip', { removed: [], added: [element] }, target);
    await load.executor.applyElements('ip', { removed: [element], added: [] }, target);
    floorMs.push((performance.now() - start) / 2);
  }
  await reconciler.cleanup();
  await reconciler.close();
  const ms = (v: number) => `${v.toFixed(2)} ms`;
  console.log(
    `${entries} entries (one TCP port each), key lookup '${probe.nftKeyLookup ?? 'map'}', ${changes} changes` +
      ` (one entry's address moved: a partial sync, the reconciler and the addon's netlink batch);` +
      ` floor: one element written to a map of its own table by the same addon.`,
  );
  console.log(
    `   first sync (the model and the whole write) ${ms(wholeMs)}; change p50 ${ms(median(changeMs))}, p99 ${ms(percentile(changeMs, 99))}; floor p50 ${ms(median(floorMs))}`,
  );
}

await inPrivateNamespaces(import.meta.url, 'nft-change', async (args: string[]) => {
  const { entries, changes } = options(args, { entries: 10_000, changes: 50 });
  await benchmark(entries, changes);
});
