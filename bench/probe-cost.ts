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

import { spawn, execFileSync } from 'node:child_process';
import * as dgram from 'node:dgram';
import { mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import * as net from 'node:net';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { probeNode } from './packet-probe.js';
import { ShippedController } from './react-controller.js';
import { StandInProcess } from './react-api.js';
import { nodeBinary, thisTree } from './react-builds.js';
import type { NodeBinary } from './react-measure.js';
import {
  BENCH_PORT,
  CLUSTER_RANGE,
  INGRESS_RANGE,
  NODE_ADDRESS,
  NODE_NAME,
  benchNode,
  benchService,
  clusterIp,
} from './services.js';
import { median } from './stats.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const RUN_JS = fileURLToPath(new URL('./run.js', import.meta.url));
const INNER_FLAG = '--probe-cost-inner';
const SERVICES = 1_000;
const ANNOTATED = 64;
const SECOND_PORT = BENCH_PORT + 1;
const SETTLE_MS = 15_000;
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
  standInMain: string;
  workDir: string;
  resultsFile: string;
  callerNetNamespace: string;
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

export function probeCostRequested(argv: string[]): boolean {
  return argv.some((a, i) => (a === '--only' && argv[i + 1] === 'probe-cost') || a === '--only=probe-cost');
}

export async function runProbeCost(argv: string[]): Promise<void> {
  try {
    const inner = argv.indexOf(INNER_FLAG);
    if (inner >= 0) await measure(JSON.parse(readFileSync(argv[inner + 1]!, 'utf8')) as Spec);
    else await outer(argv);
  } catch (err) {
    process.stderr.write(`bench: probe-cost: ${(err as Error).stack ?? String(err)}\n`);
    process.exitCode = 1;
  }
}

async function outer(argv: string[]): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('run it as root: it programs nftables in a namespace of its own');
  const { values } = parseArgs({
    args: argv,
    options: {
      only: { type: 'string' },
      rounds: { type: 'string', default: '2' },
      window: { type: 'string', default: '60' },
      node: { type: 'string', default: '24' },
    },
  });
  const rounds = Number(values.rounds);
  const windowS = Number(values.window);
  if (!Number.isInteger(rounds) || rounds < 1)
    throw new Error(`--rounds: '${values.rounds}' is not a positive integer`);
  if (!Number.isInteger(windowS) || windowS < 5)
    throw new Error(`--window: '${values.window}' is not an integer of at least 5 (s)`);
  const workDir = mkdtempSync(join(tmpdir(), 'ipvs-node-controller-probe-cost-'));
  try {
    const spec: Spec = {
      node: await nodeBinary(ROOT, values.node),
      rounds,
      windowMs: windowS * 1000,
      standInMain: join(ROOT, 'dist', 'testbed', 'api-server-main.js'),
      workDir,
      resultsFile: join(workDir, 'results.json'),
      callerNetNamespace: readlinkSync('/proc/self/ns/net'),
    };
    const specFile = join(workDir, 'spec.json');
    writeFileSync(specFile, JSON.stringify(spec));
    const loadAtStart = loadavg();
    const child = spawn(
      'unshare',
      ['--net', '--mount', '--propagation', 'private', '--pid', '--fork', '--mount-proc', '--kill-child', '--'].concat(
        process.execPath,
        RUN_JS,
        '--only',
        'probe-cost',
        INNER_FLAG,
        specFile,
      ),
      { stdio: ['ignore', 'inherit', 'inherit'] },
    );
    const code = await new Promise<number | null>((resolve, reject) => {
      child.once('error', reject);
      child.once('exit', resolve);
    });
    if (code !== 0) throw new Error(`the measure exited with ${code}`);
    const results = JSON.parse(readFileSync(spec.resultsFile, 'utf8')) as RowResult[];
    process.stdout.write(report(argv, spec, results, loadAtStart, loadavg()));
  } finally {
    rmSync(workDir, { recursive: true, force: true });
  }
}

function report(argv: string[], spec: Spec, results: RowResult[], start: number[], end: number[]): string {
  const load = (l: number[]) => l.map((x) => x.toFixed(2)).join(' ');
  let out = `\nnpm run bench -- ${argv.join(' ')}\n`;
  out += `${spec.node.label}, the bundle of this tree with package.json's Node flags; API stand-in in another process over TLS; ${SERVICES} Services, ${ANNOTATED} annotated, 4 paths each; window ${spec.windowMs / 1000} s after ${SETTLE_MS / 1000} s settling\n`;
  out += `load average (1, 5, 15 min): ${load(start)} at the start, ${load(end)} at the end\n\n`;
  out +=
    "| probe | round | CPU ms per s | the probe's sockets at once (max) | the process's sockets (max / at rest) | RSS MiB | paths probed (answered) | slowest path ms |\n";
  out += '| --- | --- | --- | --- | --- | --- | --- | --- |\n';
  for (const r of results) {
    out += `| ${r.row} | ${r.round} | ${r.cpuMsPerS.toFixed(2)} | ${r.probeSocketsMax} | ${r.socketsMax} / ${r.socketsAtRest} | ${r.rssMiB.toFixed(1)} | ${r.pathsProbed} (${r.pathsAnswered}) | ${r.slowestMs.toFixed(1)} |\n`;
  }
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

function sum(text: string, name: string, filter = ''): number {
  let total = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith(name + '{') && line.includes(filter)) total += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return total;
}

function max(text: string, name: string): number {
  let m = 0;
  for (const line of text.split('\n'))
    if (line.startsWith(name + '{')) m = Math.max(m, Number(line.slice(line.lastIndexOf(' ') + 1)));
  return m;
}

async function until(what: string, check: () => Promise<boolean>, limitMs = 60_000): Promise<void> {
  const deadline = Date.now() + limitMs;
  for (;;) {
    if (await check().catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function measure(spec: Spec): Promise<void> {
  if (readlinkSync('/proc/self/ns/net') === spec.callerNetNamespace)
    throw new Error('the probe-cost measure runs only in a network namespace of its own');
  probeNode({ sinkRanges: [], clusterRange: CLUSTER_RANGE, nodeAddress: `${NODE_ADDRESS}/24` });
  execFileSync('ip', ['route', 'replace', 'local', INGRESS_RANGE, 'dev', 'lo']);
  const servers = await endpoints();
  const api = await StandInProcess.start(process.execPath, spec.standInMain, spec.workDir, 'probe-cost');
  const results: RowResult[] = [];
  try {
    const objects = [benchNode()];
    for (let i = 0; i < SERVICES; i++) objects.push(i < ANNOTATED ? probedService(i) : benchService(i));
    await api.create(objects);
    const build = thisTree(ROOT);
    for (let round = 1; round <= spec.rounds; round++) {
      for (const row of ROWS) {
        log(`round ${round}: ${row.label}`);
        const c = ShippedController.start(spec.node.path, build, {
          kubeconfig: api.kubeconfig,
          nodeName: NODE_NAME,
          nodeAddress: NODE_ADDRESS,
          extraArgs: [...row.args],
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
          await new Promise((r) => setTimeout(r, SETTLE_MS));
          const atRest = sockets(c.pid);
          const before = await metrics();
          const cpuBefore = c.cpuMs();
          const started = performance.now();
          const counts: number[] = [];
          while (performance.now() - started < spec.windowMs) {
            counts.push(sockets(c.pid));
            await new Promise((r) => setTimeout(r, SAMPLE_EVERY_MS));
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
            slowestMs: max(after, 'ipvs_node_controller_probe_duration_seconds') * 1000,
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
