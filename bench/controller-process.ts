// The controller as users run it: dist/bundle/ipvs-node-controller.mjs (the bundle the image ships) in a process of its own, fed by the API
// stand-in, programming the kernel of the benchmark's network namespace. Its debug log gives
// the duration of each backend sync ('synced', ms); /proc gives its resident memory.

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync, readdirSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { BUNDLE, NODE_FLAGS } from '../testbed/shipped-controller.js';

// The bundle, as the image ships it (npm run build makes it).
const CLI = BUNDLE;
const GC_HOOK = pathToFileURL(fileURLToPath(new URL('./gc-on-signal.js', import.meta.url))).href;

/**
 * How long after its first sync the controller's resident memory is read: V8's memory reducer
 * compacts the heap about ten seconds after the start's allocations end (at 10,000 Services the
 * resident set goes from about 105 to 83 MiB then); what stays is what a node pays.
 */
export const SETTLE_MS = 15_000;

export interface SyncLine {
  mode: 'full' | 'partial';
  entries: number;
  ms: number;
  /** Of ms, deriving the desired state (the model); the rest is writing the kernel. */
  modelMs?: number;
  /** performance.now() of the benchmark process when the line was read. */
  seenAt: number;
}

export interface ControllerFlags {
  kubeconfig: string;
  nodeName: string;
  /** nft by default. */
  backend?: BenchBackend;
  nftExecutor: 'addon' | 'cli';
  minSyncPeriod: string;
  syncPeriod: string;
  /** Extra V8/Node flags, e.g. --optimize-for-size. */
  nodeFlags?: string[];
  /** Extra controller flags (the ebpf backend's --cgroup-path and --bpffs-path, say). */
  extraArgs?: string[];
}

export type BenchBackend = 'nft' | 'iptables' | 'ebpf';

/** Controller flags that select a backend, as `start` passes them. */
export function backendArgs(flags: Pick<ControllerFlags, 'backend' | 'nftExecutor' | 'extraArgs'>): string[] {
  const backend = flags.backend ?? 'nft';
  return [
    '--backend',
    backend,
    ...(backend === 'nft' ? ['--nft-executor', flags.nftExecutor] : []),
    ...(flags.extraArgs ?? []),
  ];
}

/** Runs the bundle with --cleanup (every object of ours, every backend) and waits for it. */
export function cleanupRules(flags: Pick<ControllerFlags, 'backend' | 'nftExecutor' | 'extraArgs'>): void {
  const r = spawnSync(process.execPath, [CLI, '--cleanup', ...backendArgs(flags)], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`--cleanup exited with ${r.status}: ${r.stderr.trim().split('\n').pop()}`);
}

export interface MemoryFigures {
  rssBytes: number;
  heapUsedBytes: number;
  heapTotalBytes: number;
  externalBytes: number;
}

export class ControllerProcess {
  readonly syncs: SyncLine[] = [];
  /** 'Service address skipped' log lines, with when they were read. */
  readonly skipLines: Array<Record<string, unknown> & { seenAt: number }> = [];
  private readonly waiters = new Set<() => void>();
  private readonly stderrLines: string[] = [];
  private memoryWaiter: ((m: MemoryFigures) => void) | undefined;
  private exited = false;
  readonly startedAt = performance.now();
  /** performance.now() when the controller said its caches synced. */
  cachesSyncedAt: number | undefined;
  /** performance.now() of its first log line (the process is up and its code loaded). */
  firstLineAt: number | undefined;
  /** Its CPU time (all threads, ms) when the first log line and 'caches synced' were read. */
  cpuAtFirstLineMs: number | undefined;
  cpuAtCachesSyncedMs: number | undefined;

  private constructor(
    private readonly child: ChildProcess,
    /** process.hrtime.bigint() right before the spawn (the packet prober's clock). */
    readonly spawnedAtNs: bigint,
  ) {
    createInterface({ input: child.stdout! }).on('line', (line) => this.onLogLine(line));
    createInterface({ input: child.stderr! }).on('line', (line) => this.onErrorLine(line));
    child.on('exit', () => {
      this.exited = true;
      this.notify();
    });
  }

  static start(flags: ControllerFlags): ControllerProcess {
    const args = [
      ...NODE_FLAGS,
      ...(flags.nodeFlags ?? []),
      '--import',
      GC_HOOK,
      CLI,
      '--kubeconfig',
      flags.kubeconfig,
      '--node-name',
      flags.nodeName,
      ...backendArgs(flags),
      '--min-sync-period',
      flags.minSyncPeriod,
      '--sync-period',
      flags.syncPeriod,
      '--log-level',
      'debug',
    ];
    const spawnedAtNs = process.hrtime.bigint();
    const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    return new ControllerProcess(child, spawnedAtNs);
  }

  get pid(): number {
    return this.child.pid!;
  }

  private onLogLine(line: string): void {
    let record: Record<string, unknown>;
    try {
      record = JSON.parse(line) as Record<string, unknown>;
    } catch {
      return;
    }
    if (this.firstLineAt === undefined) {
      this.firstLineAt = performance.now();
      this.cpuAtFirstLineMs = this.schedStats().cpuMs;
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
    } else if (record.msg === 'Service address skipped') {
      this.skipLines.push({ ...record, seenAt: performance.now() });
    } else if (record.msg === 'Caches synced') {
      this.cachesSyncedAt = performance.now();
      this.cpuAtCachesSyncedMs = this.schedStats().cpuMs;
    } else if (record.level === 'error' || record.level === 'fatal') {
      const err = record.err as { message?: string } | undefined;
      this.stderrLines.push(`controller: ${String(record.msg)}${err?.message ? `: ${err.message}` : ''}`);
    }
    this.notify();
  }

  private onErrorLine(line: string): void {
    const prefix = 'bench-memory ';
    if (line.startsWith(prefix)) {
      const m = JSON.parse(line.slice(prefix.length)) as Record<string, number>;
      this.memoryWaiter?.({
        rssBytes: m.rss!,
        heapUsedBytes: m.heapUsed!,
        heapTotalBytes: m.heapTotal!,
        externalBytes: m.external!,
      });
      this.memoryWaiter = undefined;
      return;
    }
    this.stderrLines.push(line);
  }

  private notify(): void {
    for (const waiter of [...this.waiters]) waiter();
  }

  /** Resolves when `done()` holds, checked after every log line; rejects on exit or timeout. */
  async waitFor(what: string, done: () => boolean, timeoutMs: number): Promise<void> {
    if (done()) return;
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
  }

  /** Waits until `count` syncs of `mode` have been logged in all. */
  async waitForSyncs(mode: SyncLine['mode'], count: number, timeoutMs: number): Promise<SyncLine[]> {
    const ofMode = () => this.syncs.filter((s) => s.mode === mode);
    await this.waitFor(`${count} ${mode} syncs`, () => ofMode().length >= count, timeoutMs);
    return ofMode();
  }

  lastErrors(): string {
    return this.stderrLines.slice(-5).join(' | ') || 'no error output';
  }

  /**
   * VmRSS and VmHWM (peak) of the controller process, and the part of VmRSS that is pages of
   * files (the node binary, shared libraries: shared and reclaimable), in bytes.
   */
  residentMemory(): { rssBytes: number; peakRssBytes: number; fileRssBytes: number } {
    const status = readFileSync(`/proc/${this.pid}/status`, 'utf8');
    const kib = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN) * 1024;
    return { rssBytes: kib('VmRSS'), peakRssBytes: kib('VmHWM'), fileRssBytes: kib('RssFile') };
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

  /** Asks the controller for a full garbage collection and its memory figures afterwards. */
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

  /** SIGTERM, as a kubelet stops it; the rules stay in place. */
  async stop(): Promise<void> {
    if (this.exited) return;
    const exit = once(this.child, 'exit');
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 10_000);
    await exit;
    clearTimeout(timer);
  }
}
