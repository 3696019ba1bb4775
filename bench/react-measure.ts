// The measuring half of the react benchmark (bench/react.ts runs it in network, mount and PID
// namespaces of its own, so the kernel it programs is the namespace's and every process it starts
// ends with it). Two API stand-ins in processes of their own (bench/react-api.ts): one serving
// the Node and N LoadBalancer Services (externalTrafficPolicy Local; one of them UDP), one the
// Node and that UDP Service alone. Then, per Node.js binary, round and build, interleaved:
//   start: spawn the controller (bench/react-controller.ts) -> the first TCP connection through
//     the LoadBalancer IP of the last Service (bench/packet-probe.ts, an attempt every 2 ms);
//   memory at N: VmRSS SETTLE_MS after that;
//   react: PATCH the UDP Service's status to a fresh ingress IP; from the PATCH's answer to the
//     first datagram through the new address that reaches the Service (bench/react-udp-probe.ts,
//     an attempt every 2 ms), for each change, spec.spacingMs apart;
//   memory with one Service: the controller started again against the second stand-in, VmRSS
//     SETTLE_MS after the Service answered.
// The nft ruleset is flushed before each start. Results go to spec.resultsFile as they come.

import { execFileSync } from 'node:child_process';
import { readlinkSync, writeFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { SETTLE_MS } from './controller-process.js';
import { compilePacketProbe, msSince, PacketProbe, probeNode, type ProbeOutcome } from './packet-probe.js';
import { StandInProcess } from './react-api.js';
import { ShippedController, type Build } from './react-controller.js';
import { compileUdpProbe } from './react-udp-probe.js';
import {
  BENCH_PORT,
  CLUSTER_RANGE,
  INGRESS_RANGE,
  MOVED_RANGE,
  NODE_ADDRESS,
  NODE_NAME,
  benchNode,
  benchService,
  ingressIp,
  movedIp,
  serviceName,
} from './services.js';
import { seededRandom } from './stats.js';

export interface NodeBinary {
  /** What the table calls it, e.g. 'Node 24.21.0'. */
  label: string;
  path: string;
}

export interface ReactSpec {
  services: number;
  changes: number;
  /** The pause between two changes is drawn in [min, max) ms. */
  spacingMs: [number, number];
  rounds: number;
  /** In the order each round runs them. */
  builds: Build[];
  nodes: NodeBinary[];
  /** dist/testbed/api-server-main.js of this tree (the same stand-in for every build). */
  standInMain: string;
  workDir: string;
  resultsFile: string;
  /** The network namespace of the process that asked: this one must be another. */
  callerNetNamespace: string;
  /** Where the controllers write CPU profiles (--cpu-prof), if asked. */
  cpuProfileDir?: string;
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
  /** Changes whose new address did not answer within 5 s. */
  lost: number;
  /** Changes written after the first periodic resync was due (it may have delayed them). */
  afterResync: number;
  rssAtNMiB?: number;
  rssOneMiB?: number;
  /** Controller CPU time during the changes, per change. */
  cpuPerChangeMs?: number;
  /**
   * Per change that answered, on the probers' clock (CLOCK_MONOTONIC, us, a CPU profile's too):
   * from sending the PATCH to the first datagram through the new address.
   */
  reactWindowsUs?: Array<[number, number]>;
  /** Pid of the controller of the change phase (names its CPU profile). */
  pid?: number;
  loadAverage: number[];
  error?: string;
}

/** The Service whose ingress moves: index 0, UDP. The last one (N-1, TCP) is probed at start. */
const UDP_SERVICE = 0;
const CHANGE_TIMEOUT_MS = 5_000;
/** --sync-period of the controller (bench/react-controller.ts). */
const SYNC_PERIOD_MS = 30_000;
const PROBE_INTERVAL_US = 2_000;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const log = (message: string) => process.stderr.write(`[react] ${message}\n`);

function udpService(i: number): Record<string, unknown> {
  const service = benchService(i);
  const spec = service.spec as { ports: Array<Record<string, unknown>> };
  spec.ports = spec.ports.map((p) => ({ ...p, name: 'quic', protocol: 'UDP' }));
  return service;
}

/** Runs every measure of the spec; the caller made this process's namespaces. */
export async function measureInNamespace(spec: ReactSpec): Promise<void> {
  if (readlinkSync('/proc/self/ns/net') === spec.callerNetNamespace)
    throw new Error('the react measure runs only in a network namespace of its own');
  const children: Array<{ stop(): Promise<void> }> = [];
  const results: RunResult[] = [];
  try {
    execFileSync('ip', ['link', 'set', 'lo', 'up']);
    probeNode({
      sinkRanges: [INGRESS_RANGE, MOVED_RANGE],
      clusterRange: CLUSTER_RANGE,
      nodeAddress: `${NODE_ADDRESS}/24`,
    });
    const tcp = await PacketProbe.start(compilePacketProbe(spec.workDir), { port: BENCH_PORT });
    children.push(tcp);
    const udp = await PacketProbe.start(compileUdpProbe(spec.workDir), { port: BENCH_PORT });
    children.push(udp);

    log(`API stand-ins: ${spec.services.toLocaleString('en-US')} Services, and one`);
    const many = await StandInProcess.start(process.execPath, spec.standInMain, spec.workDir, 'many');
    children.push(many);
    const one = await StandInProcess.start(process.execPath, spec.standInMain, spec.workDir, 'one');
    children.push(one);
    const services = [benchNode(), udpService(UDP_SERVICE)];
    for (let i = 1; i < spec.services; i++) services.push(benchService(i));
    await many.create(services);
    await one.create([benchNode(), udpService(UDP_SERVICE)]);
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

interface RunContext {
  spec: ReactSpec;
  tcp: PacketProbe;
  udp: PacketProbe;
  many: StandInProcess;
  one: StandInProcess;
  /** Fresh addresses handed out so far (movedIp). */
  moved: number;
}

function flushRuleset(): void {
  execFileSync('nft', ['flush', 'ruleset']);
}

function startedAfter(c: ShippedController, outcome: ProbeOutcome, target: string): number {
  if (!outcome.ok)
    throw new Error(`${target} never answered (${outcome.attempts} attempts, ${outcome.firstError || 'no error'})`);
  if (outcome.firstOkNs < c.spawnedNs) throw new Error(`${target} answered before the controller started`);
  return msSince(c.spawnedNs, outcome);
}

async function measureRun(ctx: RunContext, node: NodeBinary, build: Build, round: number): Promise<RunResult> {
  const { spec } = ctx;
  const result: RunResult = {
    node: node.label,
    build: build.label,
    round,
    reactMs: [],
    lost: 0,
    afterResync: 0,
    loadAverage: loadavg().map((l) => Number(l.toFixed(2))),
  };
  const args = { nodeName: NODE_NAME, nodeAddress: NODE_ADDRESS };
  const startTimeoutMs = 60_000 + spec.services * 4;
  try {
    flushRuleset();
    const target = ingressIp(spec.services - 1);
    const probing = await ctx.tcp.begin(target, BENCH_PORT, startTimeoutMs, PROBE_INTERVAL_US, 0);
    const c = ShippedController.start(node.path, build, {
      ...args,
      kubeconfig: ctx.many.kubeconfig,
      extraNodeFlags: spec.cpuProfileDir
        ? ['--cpu-prof', '--cpu-prof-dir', spec.cpuProfileDir, '--cpu-prof-interval', '100']
        : [],
    });
    result.pid = c.pid;
    try {
      result.startMs = startedAfter(c, await probing.outcome, target);
      const since = (ns: bigint | undefined) => (ns === undefined ? undefined : Number(ns - c.spawnedNs) / 1e6);
      result.firstLogMs = since(c.firstLineNs);
      result.cachesSyncedMs = since(c.cachesSyncedNs);
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
    const only = ingressIp(UDP_SERVICE);
    const probingOne = await ctx.udp.begin(only, BENCH_PORT, startTimeoutMs, PROBE_INTERVAL_US, 0);
    const c1 = ShippedController.start(node.path, build, { ...args, kubeconfig: ctx.one.kubeconfig });
    try {
      startedAfter(c1, await probingOne.outcome, only);
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

async function changes(ctx: RunContext, c: ShippedController, result: RunResult, answeredAt: number): Promise<void> {
  const { namespace, name } = serviceName(UDP_SERVICE);
  // The same pauses for every build and round.
  const random = seededRandom(28);
  const cpuBefore = c.cpuMs();
  const windows: Array<[number, number]> = [];
  for (let k = 0; k < ctx.spec.changes; k++) {
    const address = movedIp(ctx.moved++);
    const probing = await ctx.udp.begin(address, BENCH_PORT, CHANGE_TIMEOUT_MS, PROBE_INTERVAL_US, 0);
    if (performance.now() > answeredAt + SYNC_PERIOD_MS - 500) result.afterResync++;
    const sentNs = process.hrtime.bigint();
    const answeredNs = await ctx.many.moveIngress(namespace, name, address);
    const outcome = await probing.outcome;
    if (outcome.ok) {
      result.reactMs.push(Number(outcome.firstOkNs - answeredNs) / 1e6);
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
