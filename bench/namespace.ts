// The benchmark programs nftables and iptables: it only ever does so in network namespaces it
// creates, never in the machine's own. bench/run.ts re-runs itself inside them (inPrivateNamespaces);
// a measure that prepares outside them first (builds, Node.js binaries: react, probe-cost) hands
// what it prepared to its measuring half in network, mount and PID namespaces (runInner).

import { spawn, spawnSync } from 'node:child_process';
import { readFileSync, readlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const RUN_JS = fileURLToPath(new URL('./run.js', import.meta.url));
/** The argument bench/run.ts re-run by inPrivateNamespaces is given. */
const IN_NAMESPACE_FLAG = '--in-private-namespaces';

/** The bench's own arguments, without the one inPrivateNamespaces adds. */
export function benchmarkArgs(): string[] {
  return process.argv.slice(2).filter((a) => a !== IN_NAMESPACE_FLAG);
}

/**
 * Runs `main` in network and mount namespaces of its own, with its loopback up: bench/run.ts runs
 * itself again under `unshare --net --mount` with the same arguments, and `main` runs there, given
 * them; this process takes the re-run's exit status. Root only.
 */
export async function inPrivateNamespaces(main: (args: string[]) => Promise<void>): Promise<void> {
  const name = 'bench';
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
  const command = ['--net', '--mount', '--propagation', 'private', '--', process.execPath, RUN_JS, IN_NAMESPACE_FLAG];
  const run = spawnSync('unshare', [...command, ...args], { stdio: 'inherit' });
  if (run.error) console.error(`${name}: cannot create a network namespace (unshare): ${run.error.message}`);
  process.exitCode = run.status ?? 1;
}

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
  const namespaces = '--net --mount --propagation private --pid --fork --mount-proc --kill-child'.split(' ');
  const command = [...namespaces, '--', process.execPath, RUN_JS, '--only', measure, INNER_FLAG, specFile];
  const child = spawn('unshare', command, { stdio: ['ignore', 'inherit', 'inherit'] });
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
