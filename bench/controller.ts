// The controller as users run it: Node with a build's package.json `ipvsNodeController.nodeFlags`
// on its bundle (this tree's dist/bundle by default, the image's), in a process of its own fed by
// the API stand-in over TLS, programming the kernel of the benchmark's namespace. Started either
// plain (nothing added to the process: what it costs is what a node pays) or instrumented for
// bench/run.ts's measures: its debug log gives each backend sync's duration ('Synced', ms), and a
// preloaded hook collects the garbage on SIGUSR2. The
// collection is made available then (v8.setFlagsFromString), not by --expose-gc on the command
// line, which would make Node refuse its built-in modules' code cache (src/cli/v8-settings.ts).
// /proc gives its resident memory and CPU time.

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync, readdirSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { BUNDLE, NODE_FLAGS } from '../testbed/shipped-controller.js';

/** One build of the controller: its bundle and the Node flags its package.json names. */
export interface Build {
  /** What a table calls it: a commit, or 'this tree'. */
  label: string;
  bundle: string;
  nodeFlags: string[];
}

export const THIS_BUILD: Build = { label: 'this tree', bundle: BUNDLE, nodeFlags: [...NODE_FLAGS] };

/**
 * How long after its first sync the controller's resident memory is read: V8's memory reducer
 * compacts the heap about ten seconds after the start's allocations end (at 10,000 Services the
 * resident set goes from about 105 to 83 MiB then); what stays is what a node pays.
 */
export const SETTLE_MS = 15_000;
export const MiB = 1024 * 1024;
export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Resolves once `check` resolves true (a rejection counts as false), every `everyMs`; throws after `limitMs`. */
export async function until(
  what: string,
  check: () => Promise<boolean>,
  limitMs = 60_000,
  everyMs = 100,
): Promise<void> {
  const deadline = Date.now() + limitMs;
  while (!(await check().catch(() => false))) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(everyMs);
  }
}

// The instrumented controller's preloaded hook (node --import). SIGUSR2: a full collection, then
// process.memoryUsage() as one stderr line.
const HOOK = `data:text/javascript,${encodeURIComponent(`
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
let gc;
process.on('SIGUSR2', () => {
  if (!gc) { setFlagsFromString('--expose-gc'); gc = runInNewContext('gc'); }
  gc();
  process.stderr.write('bench-memory ' + JSON.stringify(process.memoryUsage()) + '\\n');
});
`)}`;

export interface SyncLine {
  mode: 'full' | 'partial';
  entries: number;
  ms: number;
  /** Of ms, deriving the desired state (the model); the rest is writing the kernel. */
  modelMs?: number;
  /** performance.now() of the benchmark process when the line was read. */
  seenAt: number;
}

export type BenchBackend = 'nft' | 'iptables' | 'ebpf';

/** The flags of the instrumented controller (bench/run.ts and its measures). */
export interface ControllerFlags {
  kubeconfig: string;
  nodeName: string;
  /** nft by default. */
  backend?: BenchBackend;
  nftExecutor?: 'addon' | 'cli';
  /** 1s and 1h by default. */
  minSyncPeriod?: string;
  syncPeriod?: string;
  /** Extra V8/Node flags, e.g. --optimize-for-size. */
  nodeFlags?: string[];
  /** Extra controller flags (the ebpf backend's --cgroup-path and --bpffs-path, say). */
  extraArgs?: string[];
}

/** Controller flags that select a backend. */
export function backendArgs(flags: Pick<ControllerFlags, 'backend' | 'nftExecutor' | 'extraArgs'>): string[] {
  const backend = flags.backend ?? 'nft';
  return [
    ...['--backend', backend],
    ...(backend === 'nft' ? ['--nft-executor', flags.nftExecutor ?? 'addon'] : []),
    ...(flags.extraArgs ?? []),
  ];
}

/** Runs the bundle with --cleanup (every object of ours, every backend) and waits for it. */
export function cleanupRules(flags: Pick<ControllerFlags, 'backend' | 'nftExecutor' | 'extraArgs'> = {}): void {
  const r = spawnSync(process.execPath, [BUNDLE, '--cleanup', ...backendArgs(flags)], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`--cleanup exited with ${r.status}: ${r.stderr.trim().split('\n').pop()}`);
}

/** process.memoryUsage() of the controller, bytes. */
type MemoryFigures = NodeJS.MemoryUsage;

export interface SpawnOptions {
  /** Controller flags. */
  args: string[];
  /** The Node.js binary: the bench's own by default. */
  node?: string;
  build?: Build;
  /** Node flags after the build's (the bench's --cpu-prof, a lever to try). */
  nodeFlags?: string[];
  /** Preload the hook above. */
  instrumented?: boolean;
}

interface DaemonSetArgs {
  kubeconfig: string;
  nodeName: string;
  address: string;
  extraArgs?: string[];
}

export class Controller {
  readonly syncs: SyncLine[] = [];
  private readonly waiters = new Set<() => void>();
  private readonly lastLines: string[] = [];
  private memoryWaiter: ((m: MemoryFigures) => void) | undefined;
  private exitedWith: string | undefined;
  /** performance.now() right after the spawn, of its first log line (its code loaded) and 'Caches synced'. */
  readonly startedAt = performance.now();
  firstLineAt: number | undefined;
  cachesSyncedAt: number | undefined;
  /** Its CPU time (all threads, ms) when the first log line and 'Caches synced' were read. */
  cpuAtFirstLineMs: number | undefined;
  cpuAtCachesSyncedMs: number | undefined;

  private constructor(
    private readonly child: ChildProcess,
    /** process.hrtime.bigint() and performance.now() right before the spawn (the probers' clock, this one's). */
    readonly spawnedAtNs: bigint,
    readonly spawnedAt: number,
  ) {
    createInterface({ input: child.stdout! }).on('line', (line) => this.onLogLine(line));
    createInterface({ input: child.stderr! }).on('line', (line) => this.onErrorLine(line));
    child.on('exit', (code, signal) => {
      this.exitedWith = signal ?? String(code);
      this.notify();
    });
  }

  static spawn(o: SpawnOptions): Controller {
    const build = o.build ?? THIS_BUILD;
    const argv = [
      ...build.nodeFlags,
      ...(o.nodeFlags ?? []),
      ...(o.instrumented ? ['--import', HOOK] : []),
      build.bundle,
      ...o.args,
    ];
    const [spawnedAtNs, spawnedAt] = [process.hrtime.bigint(), performance.now()];
    const child = spawn(o.node ?? process.execPath, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
    return new Controller(child, spawnedAtNs, spawnedAt);
  }

  /** The instrumented controller of bench/run.ts: debug log, the hook. */
  static start(flags: ControllerFlags): Controller {
    return Controller.spawn({
      instrumented: true,
      nodeFlags: flags.nodeFlags,
      args: [
        ...['--kubeconfig', flags.kubeconfig, '--node-name', flags.nodeName],
        ...backendArgs(flags),
        ...['--min-sync-period', flags.minSyncPeriod ?? '1s', '--sync-period', flags.syncPeriod ?? '1h'],
        ...['--log-level', 'debug'],
      ],
    });
  }

  /**
   * Plain, with the DaemonSet's flags (deploy/base/daemonset.yaml) and log level, but for
   * --min-sync-period: 0s makes each change a sync of its own (with the DaemonSet's 1s, a change
   * within a second of the previous sync waits for the rest). Metrics and health on `address`.
   */
  static asDaemonSet(o: Omit<SpawnOptions, 'args' | 'instrumented'> & DaemonSetArgs): Controller {
    return Controller.spawn({
      ...o,
      args: [
        ...['--kubeconfig', o.kubeconfig, '--node-name', o.nodeName, '--backend', 'nft'],
        ...[`--metrics-bind-address=${o.address}:9477`, `--healthz-bind-address=${o.address}:9478`],
        ...['--sync-period=30s', '--min-sync-period=0s', ...(o.extraArgs ?? [])],
      ],
    });
  }

  get pid(): number {
    return this.child.pid!;
  }

  private keep(line: string): void {
    this.lastLines.push(line);
    if (this.lastLines.length > 10) this.lastLines.shift();
  }

  private onLogLine(line: string): void {
    if (this.firstLineAt === undefined) {
      this.firstLineAt = performance.now();
      this.cpuAtFirstLineMs = this.schedStats().cpuMs;
    }
    let record: Record<string, unknown>;
    try {
      record = JSON.parse(line) as Record<string, unknown>;
    } catch {
      return this.keep(line);
    }
    if (record.msg === 'Synced' && typeof record.ms === 'number') {
      const entries = record.entries as { ipv4: number; ipv6: number };
      this.syncs.push({
        mode: record.mode as SyncLine['mode'],
        entries: entries.ipv4 + entries.ipv6,
        ms: record.ms,
        modelMs: typeof record.modelMs === 'number' ? record.modelMs : undefined,
        seenAt: performance.now(),
      });
      // 'caches synced' before the log messages were capitalised (a89b78b and earlier).
    } else if (String(record.msg).toLowerCase() === 'caches synced' && this.cachesSyncedAt === undefined) {
      this.cachesSyncedAt = performance.now();
      this.cpuAtCachesSyncedMs = this.schedStats().cpuMs;
    } else if (record.level === 'error' || record.level === 'fatal') {
      this.keep(line);
    }
    this.notify();
  }

  private onErrorLine(line: string): void {
    if (line.startsWith('bench-memory ')) {
      this.memoryWaiter?.(JSON.parse(line.slice('bench-memory '.length)) as MemoryFigures);
      this.memoryWaiter = undefined;
    } else this.keep(line);
  }

  private notify(): void {
    for (const waiter of [...this.waiters]) waiter();
  }

  get exited(): boolean {
    return this.exitedWith !== undefined;
  }

  /** Throws, with its last output, when the controller is no longer running. */
  checkRunning(): void {
    if (this.exited) throw new Error(`the controller exited (${this.exitedWith}): ${this.lastErrors()}`);
  }

  lastErrors(): string {
    return this.lastLines.join(' | ') || 'no error output';
  }

  /** Waits until `count` syncs of `mode` were logged in all (checked at each log line); rejects on exit or timeout. */
  async waitForSyncs(mode: SyncLine['mode'], count: number, timeoutMs: number): Promise<SyncLine[]> {
    const ofMode = () => this.syncs.filter((s) => s.mode === mode);
    const what = `${count} ${mode} syncs`;
    const done = () => ofMode().length >= count;
    if (done()) return ofMode();
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => finish(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)),
        timeoutMs,
      );
      const check = () => {
        if (done()) finish();
        else if (this.exited)
          finish(new Error(`the controller exited while waiting for ${what}: ${this.lastErrors()}`));
      };
      const finish = (err?: Error) => {
        clearTimeout(timer);
        this.waiters.delete(check);
        if (err) reject(err);
        else resolve();
      };
      this.waiters.add(check);
    });
    return ofMode();
  }

  /** VmRSS, VmHWM (the peak) and the pages of files in VmRSS (node binary, libraries: shared, reclaimable), bytes. */
  residentMemory(): { rssBytes: number; peakRssBytes: number; fileRssBytes: number } {
    const status = readFileSync(`/proc/${this.pid}/status`, 'utf8');
    const kib = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN) * 1024;
    return { rssBytes: kib('VmRSS'), peakRssBytes: kib('VmHWM'), fileRssBytes: kib('RssFile') };
  }

  residentMiB(): number {
    return this.residentMemory().rssBytes / MiB;
  }

  /**
   * From the scheduler (/proc/PID/task/TID/schedstat): CPU time of all the controller's threads so
   * far, and how long its main thread waited for a CPU while runnable. On a loaded machine the
   * second says how much of a wall-clock figure was waiting, not working.
   */
  schedStats(): { cpuMs: number; mainThreadWaitMs: number } {
    let cpuNs = 0;
    let mainWaitNs = 0;
    for (const tid of readdirSync(`/proc/${this.pid}/task`)) {
      try {
        const [onCpu, waiting] = readFileSync(`/proc/${this.pid}/task/${tid}/schedstat`, 'utf8').split(' ').map(Number);
        cpuNs += onCpu!;
        if (Number(tid) === this.pid) mainWaitNs = waiting!;
      } catch {
        // a thread that just ended
      }
    }
    return { cpuMs: cpuNs / 1e6, mainThreadWaitMs: mainWaitNs / 1e6 };
  }

  /** User and system CPU time of the whole process so far (utime, stime of proc_pid_stat(5), 10 ms ticks), ms. */
  cpuMs(): number {
    const stat = readFileSync(`/proc/${this.pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) * 10;
  }

  /** Asks the instrumented controller for a full garbage collection and its memory figures afterwards. */
  async collectGarbage(timeoutMs = 10_000): Promise<MemoryFigures> {
    const figures = new Promise<MemoryFigures>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('the controller did not report its memory')), timeoutMs);
      this.memoryWaiter = (m) => {
        clearTimeout(timer);
        resolve(m);
      };
    });
    this.child.kill('SIGUSR2');
    return figures;
  }

  /** Resident MiB settled (SETTLE_MS), then 2 s after a full collection (instrumented). */
  async settledMemory(): Promise<{
    idle: ReturnType<Controller['residentMemory']>;
    heap: MemoryFigures;
    afterGc: ReturnType<Controller['residentMemory']>;
  }> {
    await sleep(SETTLE_MS);
    const idle = this.residentMemory();
    const heap = await this.collectGarbage();
    await sleep(2_000);
    return { idle, heap, afterGc: this.residentMemory() };
  }

  /** SIGTERM, as a kubelet stops it (the rules stay in place); SIGKILL after 10 s. */
  async stop(): Promise<void> {
    if (this.exited) return;
    const exit = once(this.child, 'exit');
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 10_000);
    await exit;
    clearTimeout(timer);
  }
}
