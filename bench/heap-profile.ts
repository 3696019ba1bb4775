// What the controller's V8 heap holds per Service: the controller bundle runs against the API
// stand-in with 0 and then N bench Services, writes a heap snapshot after its first sync and a
// few periodic resyncs, and this module reads the snapshot (bench/heap-snapshot.ts: the dominator
// tree; bench/heap-summary.ts: the grouping) and prints, per structure, (bytes at N - bytes at 0) / N beside V8's heap used and the RSS:
// by class, by owner (what holds a class's objects) and by single retainer.
// Usage (root): node dist/bench/heap-profile.js [--sizes 0,10000]
// Run alone it re-executes itself in a private network and mount namespace (unshare): the
// machine's firewall is never touched. heapProfile() expects its caller to be isolated already.

import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Controller, MiB, sleep } from './controller.js';
import { computeDominators, parseHeapSnapshot } from './heap-snapshot.js';
import { retainerGrowth, summarizeHeap, type HeapSummary, type RetainerGrowth } from './heap-summary.js';
import { inPrivateNamespaces } from './namespace.js';
import { NODE_NAME, ServedCluster } from './services.js';
import { markdown, options } from './stats.js';

/** The sizes profiled: numbers of Services, the smallest the baseline. */
const DEFAULT_SIZES = [0, 10_000];
/** Periodic full resyncs waited for after the first sync, before the snapshot. */
const RESYNCS = 2;
/** Rows in each table. */
const ROWS = 25;

export interface HeapProfileRun {
  services: number;
  /** Before the snapshot's full GC, then after it. */
  rssBytes: number;
  rssAfterGcBytes: number;
  heapUsedBytes: number;
  heapTotalBytes: number;
  externalBytes: number;
  summary: HeapSummary;
}

interface HeapProfileRow {
  name: string;
  /** Differences to the baseline, per Service. */
  countPerService: number;
  selfPerService: number;
  retainedPerService: number;
  /** Self bytes of the class per Service by owner (dominator and edge), most first. */
  ownersPerService: [string, number][];
}

export interface HeapProfileResult {
  runs: HeapProfileRun[];
  /** The largest size against the baseline, by class, and the single retainers that grew. */
  perService: { services: number; baseline: number; rows: HeapProfileRow[]; retainers: RetainerGrowth[] };
}

async function waitForFile(dir: string, suffix: string, timeoutMs: number, alive: () => boolean): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const found = readdirSync(dir).find((f) => f.endsWith(suffix));
    if (found) return join(dir, found);
    if (Date.now() > deadline) throw new Error(`no heap snapshot after ${timeoutMs} ms`);
    if (!alive()) throw new Error('the controller exited before writing its heap snapshot');
    await sleep(200);
  }
}

/** The controller's heap with `services` Services served: its snapshot, summarised. */
async function profileOnce(kubeconfig: string, services: number, workDir: string): Promise<HeapProfileRun> {
  const dir = mkdtempSync(join(workDir, `run-${services}-`));
  // SIGWINCH: the controller's hook (bench/controller.ts) writes its snapshot into BENCH_HEAP_DIR.
  const env = { ...process.env, BENCH_HEAP_DIR: dir };
  const c = Controller.start({ kubeconfig, nodeName: NODE_NAME, syncPeriod: '2s', env });
  try {
    await c.waitForSyncs('full', 1 + RESYNCS, 60_000 + services * 4 + RESYNCS * (10_000 + services));
    const rss = c.residentMemory().rssBytes;
    process.kill(c.pid, 'SIGWINCH');
    const file = await waitForFile(dir, '.heapsnapshot', 300_000, () => !c.exited);
    const memory = JSON.parse(readFileSync(file.replace(/\.heapsnapshot$/, '.memory.json'), 'utf8')) as {
      rss: number;
      heapUsed: number;
      heapTotal: number;
      external: number;
    };
    await c.stop();
    const graph = parseHeapSnapshot(readFileSync(file, 'utf8'));
    rmSync(dir, { recursive: true, force: true });
    return {
      services,
      rssBytes: rss,
      rssAfterGcBytes: memory.rss,
      heapUsedBytes: memory.heapUsed,
      heapTotalBytes: memory.heapTotal,
      externalBytes: memory.external,
      summary: summarizeHeap(graph, computeDominators(graph)),
    };
  } finally {
    await c.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Profiles the controller's heap at each size. The caller must run in namespaces of its own. */
export async function heapProfile(sizesAsked: number[] = DEFAULT_SIZES): Promise<HeapProfileResult> {
  const sizes = [...new Set(sizesAsked)].sort((a, b) => a - b);
  if (sizes.length < 2) throw new Error('heap profile: give at least two sizes (the smallest is the baseline)');
  const workDir = mkdtempSync(join(tmpdir(), 'bench-heap-'));
  const cluster = await ServedCluster.start(workDir);
  const runs: HeapProfileRun[] = [];
  try {
    for (const n of sizes) {
      cluster.serve(n);
      runs.push(await profileOnce(cluster.kubeconfig, n, workDir));
    }
  } finally {
    await cluster.stop();
    rmSync(workDir, { recursive: true, force: true });
  }
  const base = runs[0]!;
  const top = runs[runs.length - 1]!;
  const n = top.services - base.services;
  const rows: HeapProfileRow[] = [...top.summary.classes.values()].map((f) => {
    const b = base.summary.classes.get(f.name) ?? { count: 0, selfBytes: 0, retainedBytes: 0 };
    return {
      name: f.name,
      countPerService: (f.count - b.count) / n,
      selfPerService: (f.selfBytes - b.selfBytes) / n,
      retainedPerService: (f.retainedBytes - b.retainedBytes) / n,
      ownersPerService: [...(top.summary.owners.get(f.name) ?? [])]
        .map(([owner, bytes]): [string, number] => [
          owner,
          (bytes - (base.summary.owners.get(f.name)?.get(owner) ?? 0)) / n,
        ])
        .filter(([, perService]) => perService >= 0.5)
        .sort((x, y) => y[1] - x[1]),
    };
  });
  return {
    runs,
    perService: {
      services: top.services,
      baseline: base.services,
      rows,
      retainers: retainerGrowth(base.summary.retainers, top.summary.retainers, n),
    },
  };
}

const fmt = (x: number, digits = 0) =>
  x.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
/** Text in a Markdown table cell. */
const cell = (text: string) => text.replace(/\|/g, '\\|');

/** Markdown tables: memory per run, then bytes per Service by class, by owner and by single retainer. */
export function formatHeapProfile(r: HeapProfileResult): string {
  const { services, baseline, rows } = r.perService;
  const n = services - baseline;
  const mib = (bytes: number) => fmt(bytes / MiB, 1);
  const figures = Array<string>(9).fill('---:');
  const out = ['### Controller heap (snapshot after the first sync and periodic resyncs, after a full GC)', ''];
  const header =
    'Services|RSS (MiB)|RSS after GC (MiB)|V8 heap used (MiB)|heap total (MiB)|external (MiB)|snapshot nodes|snapshot self sizes (MiB)|reachable (MiB)';
  const runRow = (x: HeapProfileRun) => [
    ...[fmt(x.services), mib(x.rssBytes), mib(x.rssAfterGcBytes), mib(x.heapUsedBytes), mib(x.heapTotalBytes)],
    ...[mib(x.externalBytes), fmt(x.summary.nodes), mib(x.summary.totalBytes), mib(x.summary.reachableBytes)],
  ];
  out.push(...markdown(header, r.runs.map(runRow), figures));
  const [first, last] = [r.runs[0]!, r.runs[r.runs.length - 1]!];
  const per = (f: (x: HeapProfileRun) => number) => `${fmt((f(last) - f(first)) / n)} B`;
  out.push(
    '',
    `Per Service (${fmt(services)} minus ${fmt(baseline)}, divided by ${fmt(n)}): RSS ${per((x) => x.rssBytes)} (after GC ` +
      `${per((x) => x.rssAfterGcBytes)}), V8 heap total ${per((x) => x.heapTotalBytes)}, V8 heap used ${per((x) => x.heapUsedBytes)}, ` +
      `reachable in the snapshot ${per((x) => x.summary.reachableBytes)}, external ${per((x) => x.externalBytes)}.`,
    '',
  );
  const bySelf = [...rows].sort((a, b) => b.selfPerService - a.selfPerService);
  const selfTotal = rows.reduce((s, x) => s + Math.max(x.selfPerService, 0), 0);
  out.push(`#### Bytes per Service by class (${fmt(services)} minus ${fmt(baseline)})`, '');
  const classes = bySelf
    .slice(0, ROWS)
    .map((x) => [
      ...[cell(x.name), fmt(x.countPerService, 2), fmt(x.selfPerService, 1)],
      ...[`${fmt((100 * x.selfPerService) / selfTotal, 1)}%`, fmt(x.retainedPerService, 1)],
    ]);
  const classHeader =
    'class|objects per Service|self B per Service|share|retained B per Service (top-most objects of the class)';
  out.push(...markdown(classHeader, classes, ['---', ...figures]));
  out.push('', '#### Whose they are (self bytes per Service by owner: dominator.edge)', '');
  const owners = bySelf
    .slice(0, 15)
    .filter((x) => x.ownersPerService.length > 0)
    .map((x) => [
      cell(x.name),
      x.ownersPerService
        .slice(0, 8)
        .map(([o, b]) => `${cell(o)}: ${fmt(b, 1)}`)
        .join('<br>'),
    ]);
  out.push(...markdown(['class', 'owner: self B per Service'], owners));
  out.push(
    '',
    `#### Single retainers that grow with Services (dominator tree, by class and the edge holding them)`,
    '',
  );
  const retainers = r.perService.retainers
    .slice(0, ROWS)
    .map((x) => [cell(x.label), fmt(x.retainedBytes / MiB, 2), fmt(x.perService, 1)]);
  out.push(
    ...markdown(['object', `retained at ${fmt(services)} (MiB)`, 'growth B per Service'], retainers, [
      '---',
      ...figures,
    ]),
  );
  return out.join('\n') + '\n';
}

/** The sizes of --sizes: whole numbers the benchmark's addresses reach (131,000 at most). */
function sizesOf(text: string): number[] {
  const sizes = text.split(',').map((s) => Number(s.trim()));
  if (sizes.some((s) => !Number.isInteger(s) || s < 0 || s > 131_000))
    throw new Error(`--sizes: whole numbers from 0 to 131000, comma-separated, not '${text}'`);
  return sizes;
}

if (process.argv[1] && fileURLToPath(pathToFileURL(process.argv[1])) === fileURLToPath(import.meta.url)) {
  await inPrivateNamespaces(import.meta.url, 'heap-profile', async (args) => {
    const { sizes } = options(args, { sizes: DEFAULT_SIZES.join(',') });
    process.stdout.write(formatHeapProfile(await heapProfile(sizesOf(sizes))));
  });
}
