// One tenant's Service with loadBalancerSourceRanges, on the nft backend and the real kernel: one
// ingress IP, --ports TCP ports, --ranges ranges of which one (0.0.0.0/1) holds the LoadBalancer
// IP. Written whole once, then one range of it edited --edits times (each a partial sync of the
// reconciler, as a Service update arrives). Prints, per build: the objects the whole write and an
// edit send to the kernel (elements, rules, and the ranges inside rules), their time and the
// process's CPU (user + system: nf_tables works in the system time of the netlink sender).
// With --compare REF, REF is built in a worktree (bench/builds.ts) and measured in the same
// run, beside this tree. Prints figures; asserts nothing. Re-runs itself inside `unshare --net --mount`.
//
//   node dist/bench/source-range-edit.js [--ports 100] [--ranges 64] [--edits 5] [--compare REF]

import { join, dirname } from 'node:path';
import { tmpdir } from 'node:os';
import { mkdtempSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { performance } from 'node:perf_hooks';
import { inPrivateNamespaces } from './namespace.js';
import { makeRefBuild, removeRefBuilds } from './builds.js';
import { BENCH_MODEL } from './services.js';
import { options } from './stats.js';

interface Objects {
  elements: number;
  rules: number;
  /** Prefixes inside rules (anonymous sets). */
  inRules: number;
}

/** What a build under `dist` gives the bench (imported from that build: its own model and driver). */
interface Implementation {
  label: string;
  dist: string;
}

type Json = Record<string, unknown>;

function service(ports: number, ranges: string[]): Json {
  return {
    metadata: { name: 'ranged', namespace: 'tenant', uid: 'u-ranged', creationTimestamp: '2024-01-01T00:00:00Z' },
    spec: {
      type: 'LoadBalancer',
      clusterIP: '10.96.7.7',
      clusterIPs: ['10.96.7.7'],
      ipFamilies: ['IPv4'],
      ports: Array.from({ length: ports }, (_, i) => ({ name: `p${i}`, port: 10_000 + i, protocol: 'TCP' })),
      loadBalancerSourceRanges: ranges,
    },
    status: { loadBalancer: { ingress: [{ ip: '10.200.0.1' }] } },
  };
}

function node(): Json {
  return {
    metadata: { name: 'bench-node' },
    spec: { podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24'] },
    status: { addresses: [{ type: 'InternalIP', address: '192.168.50.1' }] },
  };
}

/** `count` ranges: 0.0.0.0/1 (the LoadBalancer IP 10.200.0.1 inside), then /24s of 172.16/12, the `edit`-th moved. */
function rangesOf(count: number, edit: number): string[] {
  const ranges = ['0.0.0.0/1'];
  for (let i = 1; i < count; i++) ranges.push(`172.${16 + (i >> 8)}.${i & 255}.0/24`);
  if (edit > 0 && count > 1) ranges[count - 1] = `192.168.${edit}.0/24`;
  return ranges;
}

function counted(tx: { operations: Array<{ object: Json }> }, into: Objects): void {
  for (const { object } of tx.operations) {
    if (object.kind === 'element') into.elements += (object.elements as unknown[]).length;
    if (object.kind === 'rule') {
      into.rules++;
      for (const s of object.statements as Json[]) {
        if (Array.isArray(s.prefixes)) into.inRules += s.prefixes.length;
      }
    }
  }
}

async function measure(impl: Implementation, ports: number, ranges: number, edits: number): Promise<string[]> {
  const m = (path: string) => import(join(impl.dist, path)) as Promise<Record<string, never>>;
  const { loadNftAddon } = (await m('src/backends/nft/addon-executor.js')) as unknown as {
    loadNftAddon: () => { executor?: { run: (tx: never) => Promise<unknown> }; reason?: string };
  };
  const { NftDriver } = (await m('src/backends/nft/nft-driver.js')) as unknown as {
    NftDriver: new (e: unknown) => unknown;
  };
  const { Reconciler } = (await m('src/reconciler/reconciler.js')) as unknown as {
    Reconciler: new (d: unknown) => {
      sync: (d: unknown, o: { full: boolean }) => Promise<{ mode: string }>;
      cleanup: () => Promise<void>;
    };
  };
  const { DesiredStateModel } = (await m('src/model/desired-state.js')) as unknown as {
    DesiredStateModel: new (c: unknown) => { update: (s: unknown[], n: unknown) => unknown };
  };
  const { toNodeInfo, toServiceInfo } = (await m('src/kube/objects.js')) as unknown as {
    toNodeInfo: (o: Json) => unknown;
    toServiceInfo: (o: Json) => unknown;
  };
  const load = loadNftAddon();
  if (!load.executor) throw new Error(load.reason);
  const executor = load.executor;
  let objects: Objects = { elements: 0, rules: 0, inRules: 0 };
  let commitMs = 0;
  const run = executor.run.bind(executor);
  executor.run = async (tx: never) => {
    counted(tx, objects);
    const start = performance.now();
    try {
      return await run(tx);
    } finally {
      commitMs += performance.now() - start;
    }
  };
  const model = new DesiredStateModel({ ...BENCH_MODEL, maxEntriesPerService: 100_000, maxEntries: 1_000_000 });
  const reconciler = new Reconciler(new NftDriver(executor));
  const nodeInfo = toNodeInfo(node());
  const timed = async (state: unknown, full: boolean) => {
    objects = { elements: 0, rules: 0, inRules: 0 };
    commitMs = 0;
    const cpu = process.cpuUsage();
    const start = performance.now();
    const result = await reconciler.sync(state, { full });
    const ms = performance.now() - start;
    const used = process.cpuUsage(cpu);
    return { ms, cpuMs: (used.user + used.system) / 1000, commitMs, objects, mode: result.mode };
  };
  const first = await timed(model.update([toServiceInfo(service(ports, rangesOf(ranges, 0)))], nodeInfo), true);
  const editRuns: Array<Awaited<ReturnType<typeof timed>>> = [];
  for (let e = 1; e <= edits; e++) {
    editRuns.push(await timed(model.update([toServiceInfo(service(ports, rangesOf(ranges, e)))], nodeInfo), false));
  }
  await reconciler.cleanup();
  const what = (o: Objects) =>
    `${o.elements} elements, ${o.rules} rules${o.inRules ? ` (${o.inRules} ranges in them)` : ''}`;
  const ms = (t: number) => `${t.toFixed(1)} ms`;
  editRuns.sort((a, b) => a.ms - b.ms);
  const median = editRuns[Math.floor(editRuns.length / 2)]!;
  return [
    `${impl.label}:`,
    `  whole write: ${what(first.objects)}; ${ms(first.ms)} (transactions ${ms(first.commitMs)}), CPU ${ms(first.cpuMs)}`,
    `  one range edited (${edits} edits, ${median.mode}): median ${what(median.objects)}; ${ms(median.ms)} (transactions ${ms(median.commitMs)}), CPU ${ms(median.cpuMs)}; slowest ${ms(editRuns.at(-1)!.ms)}`,
  ];
}

async function benchmark(args: string[]): Promise<void> {
  const { ports, ranges, edits, compare } = options(args, { ports: 100, ranges: 64, edits: 5, compare: undefined });
  const here = join(dirname(fileURLToPath(import.meta.url)), '..');
  const root = join(here, '..');
  const impls: Implementation[] = [];
  const workDir = mkdtempSync(join(tmpdir(), 'source-range-edit-'));
  try {
    if (compare) {
      const build = await makeRefBuild(root, compare, workDir);
      impls.push({ label: build.label, dist: join(dirname(build.bundle), '..') });
    }
    impls.push({ label: 'this tree', dist: here });
    console.log(
      `nft: one Service, 1 ingress IP x ${ports} TCP ports, ${ranges} loadBalancerSourceRanges (0.0.0.0/1 holds the IP)`,
    );
    for (const impl of impls) for (const line of await measure(impl, ports, ranges, edits)) console.log(line);
  } finally {
    removeRefBuilds(root, workDir);
    rmSync(workDir, { recursive: true, force: true });
  }
}

await inPrivateNamespaces(import.meta.url, 'source-range-edit', benchmark);
