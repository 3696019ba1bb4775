// Pods started and stopped beside --services Services, as the model sees them: each pod is a
// veth pair (its host side up, with the `fe80::` address the kernel gives it, its peer in a
// network namespace of its own), made and removed for real in the bench's namespace; after each
// start and each stop the model is updated with the node's interface addresses as the build reads
// them (src/node/interface-addresses.ts), as the controller does within a second of the change.
// Prints, per build: the model update's median and slowest time and CPU per pod event, against
// the update with nothing changed. With --compare REF, REF is built in a worktree
// (bench/react-builds.ts) and measured in the same run. Prints figures; asserts nothing. Re-runs
// itself inside `unshare --net --mount`.
//
//   node dist/bench/pod-churn.js [--services 10000] [--pods 100] [--compare REF]

import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { networkInterfaces, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { inPrivateNamespaces } from './namespace.js';
import { makeRefBuild, removeRefBuilds } from './react-builds.js';
import { BENCH_MODEL, benchModelInput } from './services.js';

function ip(...args: string[]): void {
  execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

/** A pod's start: a veth pair, the host side up, the peer in `pod-<i>`; resolves once the host side has its link-local address. */
async function startPod(i: number): Promise<void> {
  ip('netns', 'add', `pod-${i}`);
  ip('link', 'add', `vethbench${i}`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', `pod-${i}`);
  ip('-n', `pod-${i}`, 'link', 'set', 'eth0', 'up');
  ip('link', 'set', `vethbench${i}`, 'up');
  for (let t = 0; t < 500; t++) {
    if ((networkInterfaces()[`vethbench${i}`] ?? []).some((a) => a.family === 'IPv6')) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`vethbench${i} got no IPv6 link-local address`);
}

function stopPod(i: number): void {
  ip('netns', 'delete', `pod-${i}`);
}

interface Model {
  update(services: unknown[], node: unknown, interfaceAddresses?: readonly string[]): unknown;
}

async function measure(label: string, dist: string, services: number, pods: number): Promise<string[]> {
  const m = (path: string) => import(join(dist, path)) as Promise<Record<string, unknown>>;
  const { DesiredStateModel } = (await m('src/model/desired-state.js')) as {
    DesiredStateModel: new (c: unknown) => Model;
  };
  const { interfaceAddresses } = (await m('src/node/interface-addresses.js')) as {
    interfaceAddresses: () => string[];
  };
  const { services: svcs, node } = benchModelInput(services);
  const model = new DesiredStateModel({ ...BENCH_MODEL, maxEntries: services * 2 });
  model.update(svcs, node, interfaceAddresses());
  const timed = () => {
    const addresses = interfaceAddresses();
    const cpu = process.cpuUsage();
    const start = performance.now();
    model.update(svcs, node, addresses);
    const used = process.cpuUsage(cpu);
    return { ms: performance.now() - start, cpuMs: (used.user + used.system) / 1000 };
  };
  const idle = Array.from({ length: 10 }, timed);
  const events: Array<ReturnType<typeof timed>> = [];
  for (let i = 0; i < pods; i++) {
    await startPod(i);
    events.push(timed());
  }
  for (let i = 0; i < pods; i++) {
    stopPod(i);
    // The host side goes with its peer's namespace.
    for (let t = 0; t < 500 && networkInterfaces()[`vethbench${i}`]; t++) await new Promise((r) => setTimeout(r, 10));
    events.push(timed());
  }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  const ms = (t: number) => `${t.toFixed(1)} ms`;
  return [
    `${label}:`,
    `  nothing changed: median ${ms(median(idle.map((e) => e.ms)))}`,
    `  a pod started or stopped (${events.length} events): median ${ms(median(events.map((e) => e.ms)))}, CPU ${ms(median(events.map((e) => e.cpuMs)))}, slowest ${ms(Math.max(...events.map((e) => e.ms)))}`,
  ];
}

async function benchmark(args: string[]): Promise<void> {
  const { values } = parseArgs({
    args,
    options: {
      services: { type: 'string', default: '10000' },
      pods: { type: 'string', default: '100' },
      compare: { type: 'string' },
    },
  });
  const services = Number(values.services);
  const pods = Number(values.pods);
  for (const [name, n] of [
    ['services', services],
    ['pods', pods],
  ] as const) {
    if (!Number.isInteger(n) || n < 1) throw new Error(`--${name} takes a whole number of at least 1`);
  }
  const here = join(dirname(fileURLToPath(import.meta.url)), '..');
  const root = join(here, '..');
  const workDir = mkdtempSync(join(tmpdir(), 'pod-churn-'));
  // The bench's own /run/netns (a tmpfs of this mount namespace) holds the pods' namespaces.
  execFileSync('sh', ['-c', 'mkdir -p /run/netns && mount -t tmpfs -o mode=0755 bench-netns /run/netns']);
  try {
    const builds: Array<[string, string]> = [];
    if (values.compare) {
      const build = await makeRefBuild(root, values.compare, workDir);
      builds.push([build.label, join(dirname(build.bundle), '..')]);
    }
    builds.push(['this tree', here]);
    console.log(
      `model: ${services} Services, ${pods} pods started then stopped (veth pairs), the model updated after each`,
    );
    for (const [label, dist] of builds)
      for (const line of await measure(label, dist, services, pods)) console.log(line);
  } finally {
    removeRefBuilds(root, workDir);
    rmSync(workDir, { recursive: true, force: true });
  }
}

await inPrivateNamespaces(import.meta.url, 'pod-churn', benchmark);
