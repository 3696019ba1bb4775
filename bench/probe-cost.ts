// What the continuous probe costs a node (`npm run bench -- --only probe-cost`, root): the
// controller as the image runs it (its bundle, package.json's Node flags, the image's Node.js
// from node-linux-<arch>), the API stand-in in another process over TLS, in network, mount and
// PID namespaces of its own, with 1,000 Services of which 64 are annotated for the probe, each
// with 4 paths (TCP and UDP on two ports). The ingress addresses are the node's own, as
// kube-ipvs0 binds them (the node's translation is for those only), but nothing listens on them;
// a TCP server and a UDP echo of this process listen on each probed Service's ClusterIP, so an
// answered probe is a translated one. Rows, interleaved, `--rounds` times:
//   off       --probe-max-services=0
//   defaults  16 Services (64 paths) every 30 s
//   limit     64 Services (256 paths) every 5 s: the most the flags allow
// Per row: the controller's CPU time per second of a window after it settled (`--window`, 60 s),
// its sockets (the most seen at once: sampled every 10 ms in that window, then as fast as they
// can be read for one probe interval; and at rest), its resident memory, the paths probed in the
// window and the slowest path of the last round. Prints a table; asserts nothing.

import { execFileSync } from 'node:child_process';
import * as dgram from 'node:dgram';
import { mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import * as net from 'node:net';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { StandInProcess } from './api-process.js';
import { nodeBinary, thisTree, type NodeBinary } from './builds.js';
import { Controller, SETTLE_MS, sleep, until } from './controller.js';
import { innerSpec, runInner } from './namespace.js';
import { probeNode } from './prober.js';
import { BENCH_PORT, INGRESS_RANGE, NODE_ADDRESS, NODE_NAME, benchNode, benchService, clusterIp } from './services.js';
import { markdown, median, options } from './stats.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const SERVICES = 1_000;
const ANNOTATED = 64;
const SECOND_PORT = BENCH_PORT + 1;
const SAMPLE_EVERY_MS = 10;

const log = (message: string) => process.stderr.write(`[probe-cost] ${message}\n`);

const ROWS = [
  { label: 'off', args: ['--probe-max-services=0'], paths: 0, intervalMs: 5_000 },
  { label: 'defaults (16 Services, 64 paths, every 30 s)', args: [], paths: 64, intervalMs: 30_000 },
  {
    label: 'limit (64 Services, 256 paths, every 5 s)',
    args: ['--probe-max-services=64', '--probe-interval=5s'],
    paths: 256,
    intervalMs: 5_000,
  },
] as const;

interface Spec {
  node: NodeBinary;
  rounds: number;
  windowMs: number;
  workDir: string;
  resultsFile: string;
}

interface RowResult {
  row: string;
  round: number;
  cpuMsPerS: number;
  socketsMax: number;
  /** The probe's own sockets open at once, at most. */
  probeSocketsMax: number;
  socketsAtRest: number;
  rssMiB: number;
  pathsProbed: number;
  pathsAnswered: number;
  slowestMs: number;
}

export async function main(argv: string[]): Promise<void> {
  const spec = innerSpec<Spec>(argv);
  if (spec) await measure(spec);
  else await outer(argv);
}

async function outer(argv: string[]): Promise<void> {
  const o = options(argv, { only: '', rounds: 2, window: 60, node: '24' }, { window: 5 });
  const workDir = mkdtempSync(join(tmpdir(), 'ipvs-node-controller-probe-cost-'));
  const removeWorkDir = () => rmSync(workDir, { recursive: true, force: true });
  try {
    const node = await nodeBinary(ROOT, o.node);
    const resultsFile = join(workDir, 'results.json');
    const spec: Spec = { node, rounds: o.rounds, windowMs: o.window * 1000, workDir, resultsFile };
    const loadAtStart = loadavg();
    const code = await runInner('probe-cost', spec, workDir, removeWorkDir);
    if (code !== 0) throw new Error(`the measure exited with ${code}`);
    const results = JSON.parse(readFileSync(spec.resultsFile, 'utf8')) as RowResult[];
    process.stdout.write(report(argv, spec, results, loadAtStart, loadavg()));
  } finally {
    removeWorkDir();
  }
}

function report(argv: string[], spec: Spec, results: RowResult[], start: number[], end: number[]): string {
  const load = (l: number[]) => l.map((x) => x.toFixed(2)).join(' ');
  let out = `\nnpm run bench -- ${argv.join(' ')}\n`;
  out += `${spec.node.label}, the bundle of this tree with package.json's Node flags; API stand-in in another process over TLS; ${SERVICES} Services, ${ANNOTATED} annotated, 4 paths each; window ${spec.windowMs / 1000} s after ${SETTLE_MS / 1000} s settling\n`;
  out += `load average (1, 5, 15 min): ${load(start)} at the start, ${load(end)} at the end\n\n`;
  const header =
    "probe|round|CPU ms per s|the probe's sockets at once (max)|the process's sockets (max / at rest)|RSS MiB|paths probed (answered)|slowest path ms";
  const rows = results.map((r) => [
    ...[r.row, r.round, r.cpuMsPerS.toFixed(2), r.probeSocketsMax, `${r.socketsMax} / ${r.socketsAtRest}`],
    ...[r.rssMiB.toFixed(1), `${r.pathsProbed} (${r.pathsAnswered})`, r.slowestMs.toFixed(1)],
  ]);
  out += markdown(header, rows).join('\n') + '\n';
  return out;
}

/** Service i with TCP and UDP on two ports (4 paths); the first ANNOTATED ask to be probed. */
function probedService(i: number): Record<string, unknown> {
  const s = benchService(i) as { metadata: Record<string, unknown>; spec: Record<string, unknown> };
  s.spec.ports = [BENCH_PORT, SECOND_PORT].flatMap((port) =>
    (['TCP', 'UDP'] as const).map((protocol) => ({ name: `${protocol.toLowerCase()}-${port}`, port, protocol })),
  );
  s.metadata.annotations = { ...(s.metadata.annotations as object), 'ipvs-node-controller/probe': 'true' };
  return s;
}

/** A TCP server and a UDP echo on both ports of each probed Service's ClusterIP. */
async function endpoints(): Promise<Array<{ close(): void }>> {
  const servers: Array<{ close(): void }> = [];
  for (let i = 0; i < ANNOTATED; i++) {
    for (const port of [BENCH_PORT, SECOND_PORT]) {
      const tcp = net.createServer((s) => {
        s.on('error', () => undefined);
        s.end();
      });
      await new Promise<void>((r) => tcp.listen(port, clusterIp(i), r));
      const udp = dgram.createSocket('udp4');
      udp.on('message', (m, from) => udp.send(m, from.port, from.address));
      await new Promise<void>((r) => udp.bind(port, clusterIp(i), r));
      servers.push(tcp, udp);
    }
  }
  return servers;
}

/**
 * Sockets of this namespace connected to an ingress address (198.18.0.0/15), from /proc/net: the
 * probe's (nothing else here dials one), those a process holds (an inode).
 */
function probeSockets(): number {
  let n = 0;
  for (const table of ['tcp', 'udp']) {
    for (const line of readFileSync(`/proc/net/${table}`, 'utf8').split('\n')) {
      const f = line.trim().split(/\s+/);
      // rem_address is ADDR:PORT, the address's bytes in host (little-endian) order: 198.18 last.
      const rem = f[2]?.split(':')[0] ?? '';
      // inode 0: an orphan the kernel closes (LAST_ACK, FIN_WAIT), no longer the process's.
      if ((rem.endsWith('12C6') || rem.endsWith('13C6')) && f[3] !== '06' && f[9] !== '0') n++;
    }
  }
  return n;
}

function sockets(pid: number): number {
  let n = 0;
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      if (readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith('socket:')) n++;
    } catch {
      // closed meanwhile
    }
  }
  return n;
}

async function metrics(): Promise<string> {
  const answer = await fetch(`http://${NODE_ADDRESS}:9477/metrics`);
  return answer.text();
}

/** The values of a metric's series (those whose line holds `filter`). */
const values = (text: string, name: string, filter = '') =>
  text
    .split('\n')
    .filter((line) => line.startsWith(name + '{') && line.includes(filter))
    .map((line) => Number(line.slice(line.lastIndexOf(' ') + 1)));
const sum = (text: string, name: string, filter = '') => values(text, name, filter).reduce((a, b) => a + b, 0);

async function measure(spec: Spec): Promise<void> {
  probeNode({ sinkRanges: [] });
  execFileSync('ip', ['route', 'replace', 'local', INGRESS_RANGE, 'dev', 'lo']);
  const servers = await endpoints();
  const api = await StandInProcess.start(spec.workDir, 'probe-cost');
  const results: RowResult[] = [];
  try {
    const objects = [benchNode()];
    for (let i = 0; i < SERVICES; i++) objects.push(i < ANNOTATED ? probedService(i) : benchService(i));
    await api.create(objects);
    const build = thisTree(ROOT);
    for (let round = 1; round <= spec.rounds; round++) {
      for (const row of ROWS) {
        log(`round ${round}: ${row.label}`);
        const c = Controller.asDaemonSet({
          ...{ node: spec.node.path, build, kubeconfig: api.kubeconfig },
          ...{ nodeName: NODE_NAME, address: NODE_ADDRESS, extraArgs: [...row.args] },
        });
        try {
          await until('the controller ready', async () => {
            c.checkRunning();
            return (await fetch(`http://${NODE_ADDRESS}:9478/readyz`)).status === 200;
          });
          if (row.paths > 0)
            await until(
              'a first probe round',
              async () => sum(await metrics(), 'ipvs_node_controller_probes_total') >= row.paths,
            );
          await sleep(SETTLE_MS);
          const atRest = sockets(c.pid);
          const before = await metrics();
          const cpuBefore = c.cpuMs();
          const started = performance.now();
          const counts: number[] = [];
          while (performance.now() - started < spec.windowMs) {
            counts.push(sockets(c.pid));
            await sleep(SAMPLE_EVERY_MS);
          }
          const cpuMs = c.cpuMs() - cpuBefore;
          const elapsedS = (performance.now() - started) / 1000;
          const after = await metrics();
          // Then, apart from the CPU window (this loop takes a core): the sockets as often as
          // they can be read, for a whole interval, so that a round's sockets are seen.
          const tight = performance.now();
          let socketsMax = Math.max(...counts);
          let probing = 0;
          while (performance.now() - tight < row.intervalMs + 1_000) {
            socketsMax = Math.max(socketsMax, sockets(c.pid));
            probing = Math.max(probing, probeSockets());
            await new Promise((r) => setImmediate(r));
          }
          const probed = (t: string, f = '') => sum(t, 'ipvs_node_controller_probes_total', f);
          results.push({
            row: row.label,
            round,
            cpuMsPerS: cpuMs / elapsedS,
            socketsMax,
            probeSocketsMax: probing,
            socketsAtRest: Math.min(atRest, median(counts)),
            rssMiB: c.residentMiB(),
            pathsProbed: probed(after) - probed(before),
            pathsAnswered: probed(after, 'outcome="answered"') - probed(before, 'outcome="answered"'),
            slowestMs: Math.max(0, ...values(after, 'ipvs_node_controller_probe_duration_seconds')) * 1000,
          });
          writeFileSync(spec.resultsFile, JSON.stringify(results, null, 2));
        } finally {
          await c.stop();
          execFileSync('nft', ['flush', 'ruleset']);
        }
      }
    }
  } finally {
    await api.stop();
    for (const s of servers) s.close();
  }
}
