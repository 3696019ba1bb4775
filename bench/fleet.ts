// What a fleet of agents costs the API server: AGENTS controllers (the bundle, with the image's
// Node flags, the nft backend, each in a network namespace of its own reached through a bridge)
// start together against one API stand-in holding SERVICES LoadBalancer Services shaped as the
// benchmark makes them (bench/services.ts), for each modelled API server release. Per agent:
// requests, response bytes, objects, and the reads that would reach etcd at the start; then the
// bytes each agent receives for one Service change, in JSON (what it reads) and in protobuf
// (what kube-proxy's client asks for); and the same extrapolated to 5,000 nodes.
//
// Root, inside namespaces of its own:
//   unshare --net --mount --propagation private -- sh -c 'mkdir -p /run/netns && mount -t tmpfs t /run/netns && exec node dist/bench/fleet.js'
// Options: --agents 50 --services 10000 --servers 1.30,1.31,1.34 (IPVS_NODE_CONTROLLER_BUNDLE
// points at another build's bundle, to measure it instead).

import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { parseArgs } from 'node:util';
import { ApiStandIn, type ClientReads, type ModelledVersion } from '../testbed/api-server.js';
import { BUNDLE, shippedArgs } from '../testbed/shipped-controller.js';
import { isolatedFromMachine } from './namespace.js';
import { jsonWatchEventBytes, protobufObject, protobufWatchEventBytes } from './protobuf-size.js';
import { benchNode, benchService, movedIp, NODE_NAME } from './services.js';

const HOST = '10.77.0.1';
const BRIDGE = 'fleet-br0';
const FLEET_NODES = 5000;

function ip(args: string[]): void {
  execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

function setUpNetwork(agents: number): void {
  ip(['link', 'add', BRIDGE, 'type', 'bridge']);
  ip(['addr', 'add', `${HOST}/16`, 'dev', BRIDGE]);
  ip(['link', 'set', BRIDGE, 'up']);
  for (let i = 0; i < agents; i++) {
    const ns = `fleet-${i}`;
    ip(['netns', 'add', ns]);
    ip(['link', 'add', `fl${i}`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
    ip(['link', 'set', `fl${i}`, 'master', BRIDGE, 'up']);
    ip(['-n', ns, 'addr', 'add', `10.77.${1 + (i >> 8)}.${i & 255}/16`, 'dev', 'eth0']);
    ip(['-n', ns, 'link', 'set', 'eth0', 'up']);
    ip(['-n', ns, 'link', 'set', 'lo', 'up']);
  }
}

function tearDownNetwork(agents: number): void {
  for (let i = 0; i < agents; i++) {
    try {
      ip(['netns', 'del', `fleet-${i}`]);
    } catch {
      // already gone
    }
  }
  try {
    ip(['link', 'del', BRIDGE]);
  } catch {
    // already gone
  }
}

class Agent {
  synced = false;
  exited = false;
  private readonly child: ChildProcess;
  private readonly errors: string[] = [];

  constructor(
    readonly index: number,
    kubeconfig: string,
  ) {
    const args = shippedArgs([
      '--kubeconfig',
      kubeconfig,
      '--node-name',
      NODE_NAME,
      '--backend',
      'nft',
      '--metrics-bind-address',
      '',
      '--healthz-bind-address',
      '',
      '--kube-proxy-metrics-address',
      '',
    ]);
    this.child = spawn('nsenter', [`--net=/run/netns/fleet-${index}`, process.execPath, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    createInterface({ input: this.child.stdout! }).on('line', (line) => {
      if (line.includes('"Caches synced"')) this.synced = true;
      if (line.includes('"level":"error"') || line.includes('"level":"fatal"')) this.errors.push(line.slice(0, 300));
    });
    createInterface({ input: this.child.stderr! }).on('line', (line) => this.errors.push(line.slice(0, 300)));
    this.child.on('exit', () => (this.exited = true));
  }

  lastErrors(): string {
    return this.errors.slice(-3).join(' | ') || 'no error output';
  }

  async stop(): Promise<void> {
    if (this.exited) return;
    const exited = new Promise((resolve) => this.child.once('exit', resolve));
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
  }
}

async function waitFor(cond: () => boolean, what: string, ms: number): Promise<void> {
  const until = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

interface ServerFigures {
  server: string;
  start: ClientReads;
  startMs: number;
  changeBytes: number;
  changeObjects: number;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[sorted.length >> 1] ?? NaN;
}

/** Per-agent medians of each counter. */
function medianReads(all: ClientReads[]): ClientReads {
  const keys = Object.keys(all[0]!) as Array<keyof ClientReads>;
  return Object.fromEntries(keys.map((k) => [k, median(all.map((r) => r[k]))])) as unknown as ClientReads;
}

async function measure(
  version: ModelledVersion,
  agents: number,
  services: number,
  dir: string,
): Promise<ServerFigures> {
  // Bookmarks far apart, so that the bytes of a change are the change's alone.
  const server = await ApiStandIn.start({ host: HOST, port: 0, serverVersion: version, bookmarkIntervalMs: 600_000 });
  const fleet: Agent[] = [];
  try {
    server.apply(benchNode());
    for (let i = 0; i < services; i++) server.apply(benchService(i));
    server.resetReads();
    const began = performance.now();
    for (let i = 0; i < agents; i++) {
      const kubeconfig = join(dir, `kubeconfig-${i}`);
      await server.writeKubeconfig(kubeconfig, `agent-${i}`);
      fleet.push(new Agent(i, kubeconfig));
    }
    await waitFor(
      () => {
        const dead = fleet.find((a) => a.exited);
        if (dead) throw new Error(`agent ${dead.index} exited: ${dead.lastErrors()}`);
        return fleet.every((a) => a.synced);
      },
      'every agent to sync its caches',
      600_000,
    );
    const startMs = performance.now() - began;
    // Each agent has its watches open once its Service watch has delivered.
    await waitFor(() => server.openWatchCount('Service') === agents, 'every agent to watch', 60_000);
    const start = server.readsByClient();
    const perAgent = fleet.map((a) => start[`agent-${a.index}`]!);

    // One change: a Service's ingress moves.
    const moved = benchService(7, movedIp(0));
    server.apply(moved);
    await waitFor(
      () => {
        const now = server.readsByClient();
        return fleet.every((a) => now[`agent-${a.index}`]!.objects > start[`agent-${a.index}`]!.objects);
      },
      'the change to reach every agent',
      60_000,
    );
    const after = server.readsByClient();
    const changeBytes = median(
      fleet.map((a) => after[`agent-${a.index}`]!.responseBytes - start[`agent-${a.index}`]!.responseBytes),
    );
    const changeObjects = median(
      fleet.map((a) => after[`agent-${a.index}`]!.objects - start[`agent-${a.index}`]!.objects),
    );
    return { server: version, start: medianReads(perAgent), startMs, changeBytes, changeObjects };
  } finally {
    await Promise.all(fleet.map((a) => a.stop()));
    await server.stop();
  }
}

function mib(bytes: number): string {
  return `${(bytes / (1 << 20)).toFixed(1)} MiB`;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      agents: { type: 'string', default: '50' },
      services: { type: 'string', default: '10000' },
      servers: { type: 'string', default: '1.30,1.31,1.34' },
    },
  });
  const agents = Number(values.agents);
  const services = Number(values.services);
  const versions = values.servers.split(',') as ModelledVersion[];
  if (!isolatedFromMachine()) {
    throw new Error(
      "the fleet benchmark makes network namespaces and a bridge: run it under unshare --net --mount (see the file's head)",
    );
  }
  console.log(`fleet: ${agents} agents, ${services} Services, bundle ${BUNDLE}`);

  // Encodings of one change, measured on the benchmark's Services.
  const sample = benchService(7, movedIp(0));
  (sample.metadata as Record<string, unknown>).resourceVersion = '10007';
  (sample.metadata as Record<string, unknown>).uid = '3f0c5a2e-6a5e-4c9e-9d0b-2b1d6f3c9a11';
  const jsonObject = Buffer.byteLength(JSON.stringify(sample));
  const pbObject = protobufObject(sample).length;
  const jsonEvent = jsonWatchEventBytes('MODIFIED', sample);
  const pbEvent = protobufWatchEventBytes('MODIFIED', sample);

  const dir = mkdtempSync(join(tmpdir(), 'fleet-'));
  setUpNetwork(agents);
  const results: ServerFigures[] = [];
  try {
    for (const version of versions) {
      console.log(`measuring against ${version} ...`);
      results.push(await measure(version, agents, services, dir));
    }
  } finally {
    tearDownNetwork(agents);
    rmSync(dir, { recursive: true, force: true });
  }

  console.log('\nPer agent at its start (median of the agents):\n');
  console.log(
    '| server | requests | lists | watches | WatchList streams | response bytes | objects | etcd list reads | objects read from etcd | etcd revision reads | fleet synced after |',
  );
  console.log('| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |');
  for (const r of results) {
    const s = r.start;
    console.log(
      `| ${r.server} | ${s.requests} | ${s.lists} | ${s.watches} | ${s.watchLists} | ${mib(s.responseBytes)} | ${s.objects} | ${s.etcdListReads} | ${s.etcdObjects} | ${s.etcdRevisionReads} | ${(r.startMs / 1000).toFixed(1)} s |`,
    );
  }
  console.log(`\n${FLEET_NODES} nodes restarting together (extrapolated: per-agent figures x ${FLEET_NODES}):\n`);
  console.log(
    '| server | requests | response bytes | objects sent | etcd list reads | objects read from etcd | etcd revision reads |',
  );
  console.log('| --- | ---: | ---: | ---: | ---: | ---: | ---: |');
  for (const r of results) {
    const s = r.start;
    console.log(
      `| ${r.server} | ${s.requests * FLEET_NODES} | ${((s.responseBytes * FLEET_NODES) / (1 << 30)).toFixed(1)} GiB | ${s.objects * FLEET_NODES} | ${s.etcdListReads * FLEET_NODES} | ${s.etcdObjects * FLEET_NODES} | ${s.etcdRevisionReads * FLEET_NODES} |`,
    );
  }
  console.log('\nOne Service change (its ingress moves), per agent:\n');
  for (const r of results) {
    console.log(
      `- ${r.server}: ${r.changeBytes} bytes in ${r.changeObjects} watch event(s) (measured at the stand-in)`,
    );
  }
  console.log(
    `\nEncodings of that change (the benchmark's Service, managedFields and last-applied annotation included):\n` +
      `| encoding | object | watch event | x ${FLEET_NODES} nodes |\n| --- | ---: | ---: | ---: |\n` +
      `| JSON (this agent) | ${jsonObject} | ${jsonEvent} | ${mib(jsonEvent * FLEET_NODES)} |\n` +
      `| protobuf (kube-proxy's client) | ${pbObject} | ${pbEvent} | ${mib(pbEvent * FLEET_NODES)} |\n` +
      `protobuf / JSON: ${(pbEvent / jsonEvent).toFixed(2)}`,
  );
}

main().catch((err: unknown) => {
  console.error(`fleet: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
});
