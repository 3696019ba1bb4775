// Speed and memory of the controller as users run it, side by side with another build:
//
//   npm run bench -- --only react [--compare REF|none] [--rounds 2] [--changes 100]
//                    [--spacing 50-100] [--services 10000] [--node 24[,20|current|PATH]] [--cpu-prof]
//                    [--tcp-changes]
//
// Each build (REF, by default the latest tag, built in a temporary git worktree; and this tree)
// runs as the image runs it (bench/builds.ts: its bundle and package.json's Node flags under the
// image's Node.js; the DaemonSet's flags), nothing added to the process, on nft, in network, mount
// and PID namespaces of the bench. Two API stand-ins over TLS (bench/api-process.ts): the Node and
// N LoadBalancer Services (one of them UDP), and the Node and that UDP Service alone. Per Node.js
// binary (a table each), round and build, interleaved (REF first), the ruleset flushed before each start:
//   start: spawn the controller -> the first TCP connection through the last Service's LoadBalancer IP;
//   memory at N: VmRSS SETTLE_MS after that;
//   react: per change, --spacing ms apart, a status PATCH moving the UDP Service's ingress to a fresh
//     IP: the PATCH's answer -> the first datagram through the new address (an attempt every 2 ms,
//     the PATCH sent at a point of the attempts' cycle drawn per change; and a bound below: the
//     answer -> the attempt before, which did not get through);
//   memory with one Service: started again against the second stand-in, VmRSS SETTLE_MS after.
// --tcp-changes: every second change moves a TCP Service instead, probed by connections: what a
// change costs without the conntrack clean-up a UDP change is followed by.
// --cpu-prof: what each build's main thread did during the changes (bench/cpu-profile.ts). Progress
// goes to stderr; the tables and bench/results/react-<time>.json are the output. The worktree, the
// namespaces and every process started go away at the end, on failure and on SIGINT.

import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { StandInProcess } from './api-process.js';
import {
  latestTag,
  makeRefBuild,
  nodeBinary,
  removeRefBuilds,
  stopBuilds,
  thisTree,
  type NodeBinary,
} from './builds.js';
import { Controller, SETTLE_MS, sleep, type Build } from './controller.js';
import { changePhaseProfile } from './cpu-profile.js';
import { innerSpec, runInner } from './namespace.js';
import { compilePacketProbe, flushRuleset, PacketProbe, probeNode, throughAfter } from './prober.js';
import * as svc from './services.js';
import { markdown, options, percentile, seededRandom } from './stats.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const log = (message: string) => process.stderr.write(`[react] ${message}\n`);

interface ReactSpec {
  services: number;
  changes: number;
  /** The pause between two changes is drawn in [min, max) ms. */
  spacingMs: [number, number];
  rounds: number;
  /** In the order each round runs them. */
  builds: Build[];
  nodes: NodeBinary[];
  workDir: string;
  resultsFile: string;
  /** Where the controllers write CPU profiles (--cpu-prof), if asked. */
  cpuProfileDir?: string;
  /** --tcp-changes: every second change moves a TCP Service (no conntrack clean-up follows). */
  tcpChanges: boolean;
}

export interface RunResult {
  node: string;
  build: string;
  round: number;
  /** spawn -> first connection through the last Service's LoadBalancer IP. */
  startMs?: number;
  /** Of it: spawn -> the controller's first log line (its code loaded), and -> 'Caches synced'. */
  firstLogMs?: number;
  cachesSyncedMs?: number;
  /** Per change: the PATCH's answer -> first datagram through the new address. */
  reactMs: number[];
  /**
   * Per UDP change: the PATCH's answer -> the attempt before that first datagram, which did not
   * get through (0 when none was after the answer): the path took longer, a bound below.
   */
  reactBelowMs?: number[];
  /** With --tcp-changes, the TCP Service's changes: PATCH answered -> first connection through the new address. */
  reactTcpMs?: number[];
  /** Changes whose new address did not answer within 5 s. */
  lost: number;
  /** Changes written after the first periodic resync was due (it may have delayed them). */
  afterResync: number;
  rssAtNMiB?: number;
  rssOneMiB?: number;
  /** Controller CPU time during the changes, per change. */
  cpuPerChangeMs?: number;
  /** Per change that answered, on the probers' clock (CLOCK_MONOTONIC, us, a CPU profile's too): PATCH sent -> first datagram. */
  reactWindowsUs?: Array<[number, number]>;
  /** Pid of the controller of the change phase (names its CPU profile). */
  pid?: number;
  loadAverage: number[];
  error?: string;
}

/** The Service whose ingress moves: index 0, UDP. The last one (N-1, TCP) is probed at start. */
const UDP_SERVICE = 0;
/** With --tcp-changes, the TCP Service whose ingress moves too. */
const TCP_SERVICE = 1;
const CHANGE_TIMEOUT_MS = 5_000;
/** The controller's --sync-period. */
const SYNC_PERIOD_MS = 30_000;
const PROBE_INTERVAL_US = 2_000;

export async function main(argv: string[]): Promise<void> {
  const spec = innerSpec<ReactSpec>(argv);
  if (spec) await measureInNamespace(spec);
  else await outer(argv);
}

function parseOptions(argv: string[]) {
  const o = options(
    argv,
    {
      ...{ only: '', compare: undefined, rounds: 2, changes: 100, spacing: '50-100', services: 10_000 },
      ...{ node: '24', 'cpu-prof': false, 'tcp-changes': false },
    },
    { services: 2 },
  );
  if (o.only !== 'react') throw new Error(`--only react runs alone (not with '${o.only}')`);
  const compare = o.compare ?? latestTag(ROOT);
  if (o.compare === undefined)
    log(
      compare ? `comparing with the latest tag, ${compare}` : 'no tag to compare with: this tree alone (--compare REF)',
    );
  // `--spacing MIN-MAX`: the pause between two changes, in ms, drawn at random in [MIN, MAX).
  const m = /^(\d+)-(\d+)$/.exec(o.spacing);
  if (!m || Number(m[1]) > Number(m[2]))
    throw new Error(`--spacing: '${o.spacing}' is not MIN-MAX in ms (e.g. 50-100)`);
  const { rounds, changes, services } = o;
  const spacingMs: [number, number] = [Number(m[1]), Number(m[2])];
  return {
    compare: compare === 'none' ? undefined : compare,
    rounds,
    changes,
    spacingMs,
    services,
    nodes: o.node.split(','),
    cpuProfile: o['cpu-prof'],
    tcpChanges: o['tcp-changes'],
  };
}

async function outer(argv: string[]): Promise<void> {
  const options = parseOptions(argv);
  const workDir = mkdtempSync(join(tmpdir(), 'ipvs-node-controller-react-'));
  const cleanUp = () => {
    stopBuilds();
    removeRefBuilds(ROOT, workDir);
    rmSync(workDir, { recursive: true, force: true });
  };
  try {
    const startedAt = new Date();
    const loadAtStart = loadavg();
    const nodes: NodeBinary[] = [];
    for (const n of options.nodes) nodes.push(await nodeBinary(ROOT, n));
    const builds = [thisTree(ROOT)];
    if (options.compare) builds.unshift(await makeRefBuild(ROOT, options.compare, workDir));
    const { compare: _, cpuProfile: __, ...asked } = options;
    const profiles = options.cpuProfile ? { cpuProfileDir: join(workDir, 'cpu-profiles') } : {};
    const spec: ReactSpec = {
      ...asked,
      builds,
      nodes,
      workDir,
      resultsFile: join(workDir, 'results.json'),
      ...profiles,
    };
    if (spec.cpuProfileDir) mkdirSync(spec.cpuProfileDir);
    const perRunS =
      2 * (SETTLE_MS / 1000) + 5 + (options.changes * (options.spacingMs[0] + options.spacingMs[1] + 10)) / 2000;
    log(
      `${builds.length * options.rounds * nodes.length} runs of about ${Math.round(perRunS)} s each: ` +
        `${builds.map((b) => b.label).join(' vs ')}; ${nodes.map((n) => n.label).join(', ')}`,
    );
    const code = await runInner('react', spec, workDir, cleanUp);
    const results = existsSync(spec.resultsFile)
      ? (JSON.parse(readFileSync(spec.resultsFile, 'utf8')) as RunResult[])
      : [];
    if (code !== 0) log(`the measure exited with ${code}: ${results.length} runs done`);
    const loadAtEnd = loadavg();
    const command = `npm run bench -- ${argv.join(' ')}`;
    const load = (l: number[]) => l.map((x) => x.toFixed(2)).join(', ');
    let out = `\n${command}\nload average (1, 5, 15 min): ${load(loadAtStart)} at the start, ${load(loadAtEnd)} at the end; `;
    out += `${process.platform} ${readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim()}\n\n`;
    const of = (node: NodeBinary) => results.filter((r) => r.node === node.label);
    for (const node of nodes) out += formatTable(spec, node.label, of(node)) + '\n';
    if (spec.cpuProfileDir) out += changePhaseProfile(spec.cpuProfileDir, results);
    process.stdout.write(out);
    const resultsDir = join(ROOT, 'bench', 'results');
    mkdirSync(resultsDir, { recursive: true });
    const path = join(resultsDir, `react-${startedAt.toISOString().replace(/[:.]/g, '-')}.json`);
    const saved = { command, startedAt, loadAtStart, loadAtEnd, builds, nodes, runs: results };
    writeFileSync(path, JSON.stringify(saved, null, 2) + '\n');
    process.stdout.write(`results: ${relative(process.cwd(), path)}\n`);
    if (spec.cpuProfileDir) {
      const profiles = path.replace(/\.json$/, '-profiles');
      cpSync(spec.cpuProfileDir, profiles, { recursive: true });
      process.stdout.write(`CPU profiles: ${relative(process.cwd(), profiles)}\n`);
    }
    if (code !== 0) process.exitCode = 1;
  } finally {
    cleanUp();
  }
}

/** Per round, p50 / p99 of the bound below: `0.9 / 2.1, 1.0 / 2.4 ms`. */
function belowCell(rs: RunResult[]): string {
  const of = (r: RunResult) =>
    [50, 99].map((p) => (r.reactBelowMs?.length ? percentile(r.reactBelowMs, p).toFixed(1) : '–')).join(' / ');
  return `${rs.map(of).join(', ')} ms`;
}

function formatTable(spec: ReactSpec, node: string, results: RunResult[]): string {
  const n = spec.services.toLocaleString('en-US');
  const runs = (build: string) => results.filter((r) => r.build === build).sort((a, b) => a.round - b.round);
  const join = (values: Array<number | undefined>, digits: number) =>
    values.map((v) => (v === undefined || Number.isNaN(v) ? '–' : v.toFixed(digits))).join(' / ');
  /** A cell of one figure per round. */
  const per = (of: (r: RunResult) => number | undefined, digits: number, unit: string) => (rs: RunResult[]) =>
    `${join(rs.map(of), digits)} ${unit}`;
  const rows: Array<[string, (rs: RunResult[]) => string]> = [
    ['start to the last Service answered', per((r) => r.startMs && r.startMs / 1000, 2, 's')],
    ['react p50', per((r) => percentile(r.reactMs, 50), 1, 'ms')],
    ['react p99', per((r) => percentile(r.reactMs, 99), 1, 'ms')],
    ['react p50 / p99, the attempt before (a bound below)', (rs) => belowCell(rs)],
    ...(spec.tcpChanges
      ? ([
          ['react p50, TCP changes', per((r) => percentile(r.reactTcpMs ?? [], 50), 1, 'ms')],
          ['react p99, TCP changes', per((r) => percentile(r.reactTcpMs ?? [], 99), 1, 'ms')],
        ] as Array<[string, (rs: RunResult[]) => string]>)
      : []),
    [
      `resident memory at ${n} / with one Service`,
      (rs) => `${rs.map((r) => join([r.rssAtNMiB, r.rssOneMiB], 0)).join(', ')} MiB`,
    ],
  ];
  const labels = spec.builds.map((b) => b.label);
  const table = markdown(
    [`nft, ${n} Services, ${node}`, ...labels],
    rows.map(([label, cell]) => [label, ...labels.map((b) => cell(runs(b)))]),
  );
  const notes: string[] = [
    `Cells: round 1 / round 2${spec.rounds > 2 ? ' / ...' : ''}, run in the order ${labels.join(', ')} each round; memory: at ${n} / with one Service, per round.`,
    spec.tcpChanges
      ? `react: ${spec.changes} changes per round, ${spec.spacingMs.join('-')} ms apart, of one UDP Service's ingress IP and of one TCP Service's in turn (status PATCH answered -> first datagram, or connection, through the new address, an attempt every 2 ms, each PATCH sent at a point of the attempts' cycle drawn for it; the bound below: -> the attempt before the first datagram, which did not get through); a UDP change is followed by its conntrack clean-up (a deletion by filter in the kernel on Linux 6.12 and later, a walk of the conntrack table in a dump before), a TCP change by none.`
      : `react: ${spec.changes} changes per round of one UDP Service's ingress IP, ${spec.spacingMs.join('-')} ms apart (status PATCH answered -> first datagram through the new address, an attempt every 2 ms; the bound below: -> the attempt before it, which did not get through).`,
  ];
  for (const b of labels) {
    const rs = runs(b);
    const lost = rs.reduce((s, r) => s + r.lost, 0);
    const late = rs.reduce((s, r) => s + r.afterResync, 0);
    const s = (v: number | undefined) => v && v / 1000;
    notes.push(
      `${b}: start: first log line at ${per((r) => s(r.firstLogMs), 2, 's')(rs)}, ` +
        `caches synced at ${per((r) => s(r.cachesSyncedMs), 2, 's')(rs)}; ` +
        `controller CPU per change ${per((r) => r.cpuPerChangeMs, 2, 'ms')(rs)}; ` +
        `load average at each run's start ${rs.map((r) => r.loadAverage[0]!.toFixed(1)).join(' / ')}` +
        (lost ? `; ${lost} changes never answered` : '') +
        (late ? `; ${late} changes after the first periodic resync was due` : '') +
        rs.map((r) => (r.error ? `; round ${r.round} failed: ${r.error}` : '')).join(''),
    );
  }
  return table.join('\n') + '\n\n' + notes.map((l) => `- ${l}`).join('\n') + '\n';
}

/** Service i with its port UDP. */
function udpService(i: number): Record<string, unknown> {
  const service = svc.benchService(i);
  const spec = service.spec as { ports: Array<Record<string, unknown>> };
  spec.ports = spec.ports.map((p) => ({ ...p, name: 'quic', protocol: 'UDP' }));
  return service;
}

interface RunContext {
  spec: ReactSpec;
  tcp: PacketProbe;
  udp: PacketProbe;
  many: StandInProcess;
  one: StandInProcess;
  /** Fresh addresses handed out so far (movedIp). */
  moved: number;
}

/** Runs every measure of the spec, in the namespaces runInner made; results go to spec.resultsFile as they come. */
async function measureInNamespace(spec: ReactSpec): Promise<void> {
  const children: Array<{ stop(): Promise<void> }> = [];
  const started = <T extends { stop(): Promise<void> }>(child: T) => (children.push(child), child);
  const results: RunResult[] = [];
  try {
    probeNode();
    const prober = (protocol: 'tcp' | 'udp') =>
      PacketProbe.start(compilePacketProbe(spec.workDir, protocol), { port: svc.BENCH_PORT });
    const [tcp, udp] = [started(await prober('tcp')), started(await prober('udp'))];
    log(`API stand-ins: ${spec.services.toLocaleString('en-US')} Services, and one`);
    const many = started(await StandInProcess.start(spec.workDir, 'many'));
    const one = started(await StandInProcess.start(spec.workDir, 'one'));
    const services = [svc.benchNode(), udpService(UDP_SERVICE)];
    for (let i = 1; i < spec.services; i++) services.push(svc.benchService(i));
    await many.create(services);
    await one.create([svc.benchNode(), udpService(UDP_SERVICE)]);
    await many.warmUp();
    const ctx: RunContext = { spec, tcp, udp, many, one, moved: 0 };
    for (const node of spec.nodes) {
      for (let round = 1; round <= spec.rounds; round++) {
        for (const build of spec.builds) {
          log(`${node.label}, round ${round} of ${spec.rounds}: ${build.label}`);
          const result = await measureRun(ctx, node, build, round);
          if (result.error) log(`${build.label}: ${result.error}`);
          results.push(result);
          writeFileSync(spec.resultsFile, JSON.stringify(results, null, 2) + '\n');
        }
      }
    }
  } finally {
    for (const child of children.reverse()) await child.stop().catch(() => undefined);
  }
}

function startController(node: NodeBinary, build: Build, kubeconfig: string, nodeFlags: string[] = []): Controller {
  const where = { nodeName: svc.NODE_NAME, address: svc.NODE_ADDRESS };
  return Controller.asDaemonSet({ node: node.path, build, kubeconfig, nodeFlags, ...where });
}

async function measureRun(ctx: RunContext, node: NodeBinary, build: Build, round: number): Promise<RunResult> {
  const { spec } = ctx;
  const result: RunResult = {
    ...{ node: node.label, build: build.label, round, reactMs: [], lost: 0, afterResync: 0 },
    loadAverage: loadavg().map((l) => Number(l.toFixed(2))),
  };
  const startTimeoutMs = 60_000 + spec.services * 4;
  const port = svc.BENCH_PORT;
  try {
    flushRuleset();
    const target = svc.ingressIp(spec.services - 1);
    const probing = await ctx.tcp.begin(target, port, startTimeoutMs, PROBE_INTERVAL_US, 0);
    const profile = spec.cpuProfileDir;
    const nodeFlags = profile ? ['--cpu-prof', '--cpu-prof-dir', profile, '--cpu-prof-interval', '100'] : [];
    const c = startController(node, build, ctx.many.kubeconfig, nodeFlags);
    result.pid = c.pid;
    try {
      result.startMs = throughAfter(c.spawnedAtNs, await probing.outcome, target);
      const since = (at: number | undefined) => (at === undefined ? undefined : at - c.spawnedAt);
      result.firstLogMs = since(c.firstLineAt);
      result.cachesSyncedMs = since(c.cachesSyncedAt);
      const answeredAt = performance.now();
      log(`  started: ${(result.startMs / 1000).toFixed(2)} s; settling ${SETTLE_MS / 1000} s`);
      await sleep(SETTLE_MS);
      c.checkRunning();
      result.rssAtNMiB = c.residentMiB();
      log(`  ${result.rssAtNMiB.toFixed(1)} MiB; ${spec.changes} changes`);
      await changes(ctx, c, result, answeredAt);
    } finally {
      await c.stop();
    }
    flushRuleset();
    const only = svc.ingressIp(UDP_SERVICE);
    const probingOne = await ctx.udp.begin(only, port, startTimeoutMs, PROBE_INTERVAL_US, 0);
    const c1 = startController(node, build, ctx.one.kubeconfig);
    try {
      throughAfter(c1.spawnedAtNs, await probingOne.outcome, only);
      await sleep(SETTLE_MS);
      c1.checkRunning();
      result.rssOneMiB = c1.residentMiB();
      log(`  with one Service: ${result.rssOneMiB.toFixed(1)} MiB`);
    } finally {
      await c1.stop();
    }
  } catch (err) {
    result.error = (err as Error).message;
  }
  return result;
}

/**
 * Waits (spinning: a timer is late by a millisecond) until `fraction` of an interval after an
 * attempt of the probe begun at `startedNs`: the next such moment. Sent always at the same point
 * of the attempts' cycle, the PATCHes were answered about 0.5 ms before an attempt, so that any
 * path under 0.5 ms measured 0.5 and any path from 0.5 to 2.5 ms measured 2.5: p50 moved by
 * steps of 2 ms. At a phase drawn for each change, a change's figure is its path plus the wait
 * for the next attempt (1 ms on average).
 */
function inPhase(startedNs: bigint, fraction: number): void {
  const interval = BigInt(PROBE_INTERVAL_US * 1000);
  const offset = BigInt(Math.floor(fraction * PROBE_INTERVAL_US * 1000));
  const now = process.hrtime.bigint();
  let due = startedNs + offset;
  if (due <= now) due += ((now - due) / interval + 1n) * interval;
  while (process.hrtime.bigint() < due);
}

async function changes(ctx: RunContext, c: Controller, result: RunResult, answeredAt: number): Promise<void> {
  // The same pauses for every build and round.
  const random = seededRandom(28);
  const cpuBefore = c.cpuMs();
  const windows: Array<[number, number]> = [];
  // Where between two attempts each PATCH is sent, the same for every build and round.
  const phase = seededRandom(29);
  if (ctx.spec.tcpChanges) result.reactTcpMs = [];
  result.reactBelowMs = [];
  for (let k = 0; k < ctx.spec.changes; k++) {
    const tcp = ctx.spec.tcpChanges && k % 2 === 1;
    const { namespace, name } = svc.serviceName(tcp ? TCP_SERVICE : UDP_SERVICE);
    const address = svc.movedIp(ctx.moved++);
    const prober = tcp ? ctx.tcp : ctx.udp;
    const probing = await prober.begin(address, svc.BENCH_PORT, CHANGE_TIMEOUT_MS, PROBE_INTERVAL_US, 0);
    inPhase(probing.startedNs, phase());
    if (performance.now() > answeredAt + SYNC_PERIOD_MS - 500) result.afterResync++;
    const sentNs = process.hrtime.bigint();
    const answeredNs = await ctx.many.moveIngress(namespace, name, address);
    const outcome = await probing.outcome;
    if (outcome.ok) {
      (tcp ? result.reactTcpMs! : result.reactMs).push(Number(outcome.firstOkNs - answeredNs) / 1e6);
      if (!tcp) result.reactBelowMs!.push(Math.max(0, Number(outcome.beforeOkNs - answeredNs) / 1e6));
      windows.push([Number(sentNs / 1000n), Number(outcome.firstOkNs / 1000n)]);
    } else result.lost++;
    if (result.lost >= 3 && result.reactMs.length === 0)
      throw new Error(`the first changes never reached the Service (${outcome.firstError || 'no error'})`);
    c.checkRunning();
    // 50-100 ms apart by default: a change meets a controller done with the one before (a UDP
    // change's conntrack clean-up spawns processes after the write, for milliseconds on a busy
    // machine); closer, it measures changes in a burst.
    const [min, max] = ctx.spec.spacingMs;
    await sleep(min + Math.floor(random() * (max - min)));
  }
  result.cpuPerChangeMs = (c.cpuMs() - cpuBefore) / ctx.spec.changes;
  result.reactWindowsUs = windows;
}
