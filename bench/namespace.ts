// The benchmark programs nftables and iptables: it only ever does so in network namespaces it
// creates, never in the machine's own. Each benchmark that runs alone re-runs itself inside them
// (inPrivateNamespaces); one that prepares outside them first (builds, Node.js binaries) hands
// what it prepared to its measuring half in network, mount and PID namespaces (runInner).

import { spawn, spawnSync } from 'node:child_process';
import { readFileSync, readlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

function namespaceOf(pid: number | 'self', kind: 'net' | 'mnt'): string | undefined {
  try {
    return readlinkSync(`/proc/${pid}/ns/${kind}`);
  } catch {
    return undefined; // a process we may not inspect
  }
}

function parentOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
}

/**
 * True when some ancestor process lives in another network namespace and some in another mount
 * namespace than this process: this process runs in namespaces made by `unshare` below them.
 */
export function isolatedFromMachine(): boolean {
  const own = { net: namespaceOf('self', 'net'), mnt: namespaceOf('self', 'mnt') };
  const differs = { net: false, mnt: false };
  for (let pid = process.ppid; pid > 1 && !(differs.net && differs.mnt); pid = parentOf(pid)) {
    for (const kind of ['net', 'mnt'] as const) {
      const theirs = namespaceOf(pid, kind);
      if (theirs !== undefined && theirs !== own[kind]) differs[kind] = true;
    }
  }
  return differs.net && differs.mnt;
}

/** Waits until process `pid` has left this process's network namespace (after its unshare). */
export async function waitForOwnNetworkNamespace(pid: number, timeoutMs = 5000): Promise<void> {
  const own = namespaceOf('self', 'net');
  const deadline = performance.now() + timeoutMs;
  while (performance.now() < deadline) {
    const theirs = namespaceOf(pid, 'net');
    if (theirs !== undefined && theirs !== own) return;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  throw new Error(`process ${pid} did not enter a network namespace of its own`);
}

/** The argument a benchmark re-run by inPrivateNamespaces is given. */
const IN_NAMESPACE_FLAG = '--in-private-namespaces';

/** The benchmark's own arguments, without the one inPrivateNamespaces adds. */
export function benchmarkArgs(): string[] {
  return process.argv.slice(2).filter((a) => a !== IN_NAMESPACE_FLAG);
}

/**
 * Runs `main` in network and mount namespaces of its own, with its loopback up: the script
 * (`moduleUrl`, its import.meta.url) runs itself again under `unshare --net --mount` with the
 * same arguments, and `main` runs there; this process takes the re-run's exit status. `args`:
 * the arguments `main` is given, without the flag. Root only (`name` names the benchmark in
 * the error otherwise).
 */
export async function inPrivateNamespaces(
  moduleUrl: string,
  name: string,
  main: (args: string[]) => Promise<void> | void,
): Promise<void> {
  const args = benchmarkArgs();
  if (process.argv.includes(IN_NAMESPACE_FLAG)) {
    spawnSync('ip', ['link', 'set', 'lo', 'up']);
    try {
      await main(args);
    } catch (err) {
      console.error(`${name}: ${(err as Error).stack ?? String(err)}`);
      process.exitCode = 1;
    }
    return;
  }
  if (process.getuid?.() !== 0) {
    console.error(`${name}: run it as root (it programs the kernel in network namespaces of its own)`);
    process.exitCode = 1;
    return;
  }
  const self = fileURLToPath(moduleUrl);
  const run = spawnSync(
    'unshare',
    ['--net', '--mount', '--propagation', 'private', '--', process.execPath, self, IN_NAMESPACE_FLAG, ...args],
    { stdio: 'inherit' },
  );
  if (run.error) console.error(`${name}: cannot create a network namespace (unshare): ${run.error.message}`);
  process.exitCode = run.status ?? 1;
}

const RUN_JS = fileURLToPath(new URL('./run.js', import.meta.url));
const INNER_FLAG = '--inner';

/**
 * The outer half: `run.js --only MEASURE --inner SPEC_FILE` in new network, mount and PID
 * namespaces, handed `spec`; every process in them ends with it (unshare --kill-child). SIGINT or
 * SIGTERM kills it, runs `onInterrupt` and exits. Resolves with its exit code.
 */
export async function runInner(
  measure: string,
  spec: object,
  workDir: string,
  onInterrupt?: () => void,
): Promise<number | null> {
  if (process.getuid?.() !== 0) throw new Error('run it as root: it programs nftables in a namespace of its own');
  const specFile = join(workDir, 'spec.json');
  writeFileSync(specFile, JSON.stringify({ ...spec, callerNetNamespace: readlinkSync('/proc/self/ns/net') }, null, 2));
  const namespaces = [
    '--net',
    '--mount',
    '--propagation',
    'private',
    '--pid',
    '--fork',
    '--mount-proc',
    '--kill-child',
  ];
  const child = spawn(
    'unshare',
    [...namespaces, '--', process.execPath, RUN_JS, '--only', measure, INNER_FLAG, specFile],
    {
      stdio: ['ignore', 'inherit', 'inherit'],
    },
  );
  const onSignal = () => {
    process.stderr.write(`[${measure}] interrupted: cleaning up\n`);
    child.kill('SIGKILL');
    onInterrupt?.();
    process.exit(130);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    return await new Promise<number | null>((resolve, reject) => {
      child.once('error', reject);
      child.once('exit', resolve);
    });
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

/** The inner half: the spec runInner handed this process (its loopback up), or undefined in the outer one. */
export function innerSpec<T>(argv: string[]): T | undefined {
  const i = argv.indexOf(INNER_FLAG);
  if (i < 0) return undefined;
  const spec = JSON.parse(readFileSync(argv[i + 1]!, 'utf8')) as T & { callerNetNamespace: string };
  if (readlinkSync('/proc/self/ns/net') === spec.callerNetNamespace)
    throw new Error('the measure runs only in a network namespace of its own');
  // PID 1 of its namespace: a signal without a handler would be ignored. Exiting ends the
  // namespace's every process.
  for (const signal of ['SIGINT', 'SIGTERM'] as const) process.on(signal, () => process.exit(130));
  spawnSync('ip', ['link', 'set', 'lo', 'up']);
  return spec;
}
