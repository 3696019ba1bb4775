// What the controller's V8 heap holds per Service: the controller bundle runs against the API
// stand-in with 0 and then N bench Services, writes a heap snapshot after its first sync and a
// few periodic resyncs, and this module reads the snapshot (bench/heap-snapshot.ts: the dominator
// tree; bench/heap-summary.ts: the grouping) and prints, per structure, (bytes at N - bytes at 0) / N beside V8's heap used and the RSS:
// by class, by owner (what holds a class's objects) and by single retainer.
// Usage (root): node dist/bench/heap-profile.js [--sizes 0,10000]
// Run alone it re-executes itself in a private network and mount namespace (unshare): the
// machine's firewall is never touched. heapProfile() expects its caller to be isolated already.

import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { ApiStandIn } from '../testbed/api-server.js';
import { ControllerProcess } from './controller-process.js';
import { computeDominators, parseHeapSnapshot } from './heap-snapshot.js';
import { retainerGrowth, summarizeHeap, type HeapSummary, type RetainerGrowth } from './heap-summary.js';
import { inPrivateNamespaces } from './namespace.js';
import { NODE_NAME, benchNode, benchService } from './services.js';

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

// Loaded into the controller (node --import): on SIGWINCH (ignored by default and by the
// controller) a full GC, the memory figures, then a heap snapshot, renamed when complete.
function hookSource(dir: string): string {
  return `import { writeHeapSnapshot } from 'node:v8';
import { renameSync, writeFileSync } from 'node:fs';
let k = 0;
process.on('SIGWINCH', () => {
  globalThis.gc?.();
  const base = ${JSON.stringify(dir)} + '/heap-' + process.pid + '-' + k++;
  writeFileSync(base + '.memory.json', JSON.stringify(process.memoryUsage()));
  writeHeapSnapshot(base + '.partial');
  renameSync(base + '.partial', base + '.heapsnapshot');
});
`;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

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
  const hook = join(dir, 'hook.mjs');
  writeFileSync(hook, hookSource(dir));
  const c = ControllerProcess.start({
    kubeconfig,
    nodeName: NODE_NAME,
    nftExecutor: 'addon',
    minSyncPeriod: '1s',
    syncPeriod: '2s',
    nodeFlags: ['--import', pathToFileURL(hook).href],
  });
  try {
    await c.waitForSyncs('full', 1 + RESYNCS, 60_000 + services * 4 + RESYNCS * (10_000 + services));
    const rss = c.residentMemory().rssBytes;
    let alive = true;
    void c.waitFor('exit', () => false, 24 * 3600_000).catch(() => (alive = false));
    process.kill(c.pid, 'SIGWINCH');
    const file = await waitForFile(dir, '.heapsnapshot', 300_000, () => alive);
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
  const api = await ApiStandIn.start();
  const runs: HeapProfileRun[] = [];
  try {
    const kubeconfig = join(workDir, 'kubeconfig');
    await api.writeKubeconfig(kubeconfig);
    api.apply(benchNode());
    let served = 0;
    for (const n of sizes) {
      for (; served < n; served++) api.apply(benchService(served));
      runs.push(await profileOnce(kubeconfig, n, workDir));
    }
  } finally {
    await api.stop();
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

const MiB = 1024 * 1024;
const fmt = (x: number, digits = 0) =>
  x.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
/** Text in a Markdown table cell. */
const cell = (text: string) => text.replace(/\|/g, '\\|');

/** Markdown tables: memory per run, then bytes per Service by class, by owner and by single retainer. */
export function formatHeapProfile(r: HeapProfileResult): string {
  const out: string[] = [];
  const { services, baseline, rows } = r.perService;
  const n = services - baseline;
  out.push('### Controller heap (snapshot after the first sync and periodic resyncs, after a full GC)', '');
  out.push(
    '| Services | RSS (MiB) | RSS after GC (MiB) | V8 heap used (MiB) | heap total (MiB) | external (MiB) | snapshot nodes | snapshot self sizes (MiB) | reachable (MiB) |',
  );
  out.push('| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |');
  for (const run of r.runs)
    out.push(
      `| ${fmt(run.services)} | ${fmt(run.rssBytes / MiB, 1)} | ${fmt(run.rssAfterGcBytes / MiB, 1)} | ${fmt(run.heapUsedBytes / MiB, 1)} | ${fmt(run.heapTotalBytes / MiB, 1)} | ${fmt(run.externalBytes / MiB, 1)} | ${fmt(run.summary.nodes)} | ${fmt(run.summary.totalBytes / MiB, 1)} | ${fmt(run.summary.reachableBytes / MiB, 1)} |`,
    );
  const first = r.runs[0]!;
  const last = r.runs[r.runs.length - 1]!;
  const per = (a: number, b: number) => fmt((a - b) / n);
  out.push(
    '',
    `Per Service (${fmt(services)} minus ${fmt(baseline)}, divided by ${fmt(n)}): RSS ${per(last.rssBytes, first.rssBytes)} B (after GC ${per(last.rssAfterGcBytes, first.rssAfterGcBytes)} B), V8 heap total ${per(last.heapTotalBytes, first.heapTotalBytes)} B, V8 heap used ${per(last.heapUsedBytes, first.heapUsedBytes)} B, reachable in the snapshot ${per(last.summary.reachableBytes, first.summary.reachableBytes)} B, external ${per(last.externalBytes, first.externalBytes)} B.`,
    '',
  );
  const bySelf = [...rows].sort((a, b) => b.selfPerService - a.selfPerService);
  const selfTotal = rows.reduce((s, x) => s + Math.max(x.selfPerService, 0), 0);
  out.push(`#### Bytes per Service by class (${fmt(services)} minus ${fmt(baseline)})`, '');
  out.push(
    '| class | objects per Service | self B per Service | share | retained B per Service (top-most objects of the class) |',
  );
  out.push('| --- | ---: | ---: | ---: | ---: |');
  for (const x of bySelf.slice(0, ROWS))
    out.push(
      `| ${cell(x.name)} | ${fmt(x.countPerService, 2)} | ${fmt(x.selfPerService, 1)} | ${fmt((100 * x.selfPerService) / selfTotal, 1)}% | ${fmt(x.retainedPerService, 1)} |`,
    );
  out.push('', '#### Whose they are (self bytes per Service by owner: dominator.edge)', '');
  out.push('| class | owner: self B per Service |');
  out.push('| --- | --- |');
  for (const x of bySelf.slice(0, 15))
    if (x.ownersPerService.length > 0)
      out.push(
        `| ${cell(x.name)} | ${x.ownersPerService
          .slice(0, 8)
          .map(([owner, b]) => `${cell(owner)}: ${fmt(b, 1)}`)
          .join('<br>')} |`,
      );
  out.push(
    '',
    `#### Single retainers that grow with Services (dominator tree, by class and the edge holding them)`,
    '',
  );
  out.push(`| object | retained at ${fmt(services)} (MiB) | growth B per Service |`);
  out.push('| --- | ---: | ---: |');
  for (const x of r.perService.retainers.slice(0, ROWS))
    out.push(`| ${cell(x.label)} | ${fmt(x.retainedBytes / MiB, 2)} | ${fmt(x.perService, 1)} |`);
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
    const { values } = parseArgs({ args, options: { sizes: { type: 'string', default: DEFAULT_SIZES.join(',') } } });
    process.stdout.write(formatHeapProfile(await heapProfile(sizesOf(values.sizes))));
  });
}
