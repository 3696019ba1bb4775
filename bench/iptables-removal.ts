// The removal of one Service from a large iptables table, both variants, side by side: through
// the backend as it is (our chains written whole past REWRITE_ABOVE_DELETES rule deletes) and
// with that bound turned off (one `-D` per rule, the path before it existed), and, for smaller
// removals, the deletes and the rewrite each forced, which is where the bound was chosen.
//
// A table of --entries LoadBalancer entries (one pod CIDR: four rules each): --entries minus the
// removed size one-port Services of the benchmark (bench/services.ts) written whole, then the Service to remove (one address, that many
// ports) added by a partial sync, so its rules sit at the end of the chains, where a Service
// created last sits; then the timed partial sync that removes it. Each run starts from empty
// chains. Prints figures; asserts nothing. Re-runs itself inside `unshare --net --mount`.
//
//   node dist/bench/iptables-removal.js [--entries 20000] [--remove 10000] [--sweep 1,4,16,64,256]
//                                       [--variants legacy,nft]
//   npm run bench -- --only iptables-removal

import { performance } from 'node:perf_hooks';
import { IptablesCommands, type IptablesVariant } from '../src/backends/iptables/executor.js';
import { IptablesDriver, REWRITE_ABOVE_DELETES } from '../src/backends/iptables/iptables-driver.js';
import { Reconciler } from '../src/reconciler/reconciler.js';
import type { SyncResult } from '../src/reconciler/sync-result.js';
import { buildDesiredState } from '../src/model/desired-state.js';
import type { DesiredState, NodeInfo, ServiceInfo } from '../src/model/types.js';
import { inPrivateNamespaces } from './namespace.js';
import { BENCH_MODEL, benchModelInput } from './services.js';
import { options } from './stats.js';

/** Rules per entry: a mark and a DNAT rule in each of our two chains (one pod CIDR). */
const RULES_PER_ENTRY = 4;

/** One address, `entries` ports: the Service that is removed. */
function largeService(entries: number): ServiceInfo {
  return {
    namespace: 'tenant',
    name: 'large',
    type: 'LoadBalancer',
    creationTimestamp: '2024-01-02T00:00:00Z',
    clusterIP: '10.97.0.1',
    ports: Array.from({ length: entries }, (_, i) => ({ port: 20_000 + i, protocol: 'TCP' as const })),
    ingress: [{ ip: '203.0.113.7' }],
  };
}

function desiredState(list: ServiceInfo[], node: NodeInfo, total: number): DesiredState {
  return buildDesiredState(list, node, { ...BENCH_MODEL, maxEntries: total, maxEntriesPerService: total });
}

async function createKubeMarkMasq(variant: IptablesVariant): Promise<void> {
  await new IptablesCommands(variant, 'ipv4').restore(
    '*nat\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\nCOMMIT\n',
  );
}

interface Removal {
  ms: number;
  result: SyncResult;
}

/** Builds the table, adds the large Service, times its removal; `rewriteAboveDeletes` as the driver takes it. */
async function removal(
  variant: IptablesVariant,
  entries: number,
  removed: number,
  rewriteAboveDeletes: number | undefined,
): Promise<Removal> {
  const { services: base, node } = benchModelInput(entries - removed);
  const without = desiredState(base, node, entries);
  const withLarge = desiredState([...base, largeService(removed)], node, entries);
  const backend = new Reconciler(
    new IptablesDriver(variant, {
      jumpCheckIntervalMs: 0,
      ...(rewriteAboveDeletes !== undefined ? { rewriteAboveDeletes } : {}),
    }),
  );
  try {
    await backend.sync(without, { full: true });
    await backend.sync(withLarge, { full: false });
    const started = performance.now();
    const result = await backend.sync(without, { full: false });
    return { ms: performance.now() - started, result };
  } finally {
    await backend.cleanup();
  }
}

const seconds = (ms: number) => `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;

/** How the sync went: the path it took, and a fallback when a partial write failed. */
function how(r: Removal): string {
  return r.result.fallbackReason ? `${r.result.mode}, ${r.result.fallbackReason}` : r.result.mode;
}

async function benchmark(args: string[]): Promise<void> {
  const o = options(args, { entries: 20_000, remove: 10_000, sweep: '1,4,16,64,256', variants: 'legacy,nft' });
  const { entries, remove } = o;
  const sweep = o.sweep === '' ? [] : o.sweep.split(',').map(Number);
  const variants = o.variants.split(',') as IptablesVariant[];
  const cell = (text: string, width: number, left = false) => (left ? text.padEnd(width) : text.padStart(width));
  console.log(
    `iptables removal: a table of ${entries} IPv4 entries (${entries * RULES_PER_ENTRY} rules, ` +
      `${(entries * RULES_PER_ENTRY) / 2} per chain), one Service removed by a partial sync; its rules are at the ` +
      'end of the chains. KUBE-MARK-MASQ exists. Times: the removal sync (both families), one run each.',
  );
  console.log(
    `bound: our chains are written whole past ${REWRITE_ABOVE_DELETES.legacy} rule deletes (legacy), ` +
      `${REWRITE_ABOVE_DELETES.nft} (nft). "one -D per rule": the bound turned off, the path before it.`,
  );
  const header = 'variant|removed entries|rule deletes|one -D per rule|(sync did)|as shipped|(path)'.split('|');
  const widths = [16, 15, 12, 16, 22, 12, 10];
  const line = (cells: string[]) => cells.map((c, i) => cell(c, widths[i]!, i === 0 || i === 4 || i === 6)).join('  ');
  console.log(line(header));
  for (const variant of variants) {
    await createKubeMarkMasq(variant);
    const shipped = REWRITE_ABOVE_DELETES[variant];
    const before = await removal(variant, entries, remove, Number.POSITIVE_INFINITY);
    const after = await removal(variant, entries, remove, undefined);
    const deletes = remove * RULES_PER_ENTRY;
    const path = deletes > shipped ? 'rewrite' : 'deletes';
    console.log(
      line([
        `iptables-${variant}`,
        String(remove),
        String(deletes),
        seconds(before.ms),
        how(before),
        seconds(after.ms),
        path,
      ]),
    );
  }
  if (sweep.length === 0) return;
  console.log('');
  console.log('smaller removals from the same table, each path forced (where the bound was chosen):');
  const sweepHeader = 'variant|removed entries|rule deletes|one -D per rule|chains rewritten|shipped takes'.split('|');
  const sweepWidths = [16, 15, 12, 16, 16, 13];
  console.log(sweepHeader.map((c, i) => cell(c, sweepWidths[i]!, i === 0)).join('  '));
  for (const variant of variants) {
    for (const k of sweep) {
      const deletes = await removal(variant, entries, k, Number.POSITIVE_INFINITY);
      const rewrite = await removal(variant, entries, k, 0);
      const takes = k * RULES_PER_ENTRY > REWRITE_ABOVE_DELETES[variant] ? 'rewrite' : 'deletes';
      const cells = [
        `iptables-${variant}`,
        String(k),
        String(k * RULES_PER_ENTRY),
        `${seconds(deletes.ms)}${deletes.result.fallbackReason ? ' *' : ''}`,
        seconds(rewrite.ms),
        takes,
      ];
      console.log(cells.map((c, i) => cell(c, sweepWidths[i]!, i === 0)).join('  '));
    }
  }
  console.log("* the deletes ran past the restore's time limit; the sync then wrote the chains whole (partial-failed)");
}

await inPrivateNamespaces(import.meta.url, 'iptables-removal', benchmark);
