// The controller of the react benchmark (bench/react.ts), started as the image starts it: the
// given Node.js binary with the build's package.json `ipvsNodeController.nodeFlags` on the
// build's bundle, with the DaemonSet's flags (deploy/base/daemonset.yaml) and its default log
// level. Nothing is added to the process (no preloaded module, no debug log): what it costs is
// what a node pays. Its resident memory and CPU time are read from /proc.

import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';

/** One build of the controller: its bundle and the Node flags its package.json names. */
export interface Build {
  /** What the table calls it: a commit, or 'this tree'. */
  label: string;
  bundle: string;
  nodeFlags: string[];
}

export interface ControllerArgs {
  kubeconfig: string;
  nodeName: string;
  nodeAddress: string;
  /** Extra Node flags (the bench's --cpu-prof). */
  extraNodeFlags?: string[];
  /** Extra controller flags (the probe-cost measure's --probe-*). */
  extraArgs?: string[];
}

export class ShippedController {
  private readonly lastLines: string[] = [];
  private exitedWith: string | undefined;
  /** process.hrtime.bigint() when its first log line was read (its code is loaded) and 'Caches synced'. */
  firstLineNs: bigint | undefined;
  cachesSyncedNs: bigint | undefined;

  private constructor(
    private readonly child: ChildProcess,
    /** process.hrtime.bigint() right before the spawn (the probers' clock). */
    readonly spawnedNs: bigint,
  ) {
    const keep = (line: string) => {
      this.lastLines.push(line);
      if (this.lastLines.length > 10) this.lastLines.shift();
    };
    createInterface({ input: child.stdout! }).on('line', (line) => {
      this.firstLineNs ??= process.hrtime.bigint();
      // 'caches synced' before the log messages were capitalised (a89b78b and earlier).
      if (this.cachesSyncedNs === undefined && /"msg":"[Cc]aches synced"/.test(line))
        this.cachesSyncedNs = process.hrtime.bigint();
      keep(line);
    });
    createInterface({ input: child.stderr! }).on('line', keep);
    child.on('exit', (code, signal) => {
      this.exitedWith = signal ?? String(code);
    });
  }

  static start(nodePath: string, build: Build, args: ControllerArgs): ShippedController {
    const argv = [
      ...build.nodeFlags,
      ...(args.extraNodeFlags ?? []),
      build.bundle,
      '--kubeconfig',
      args.kubeconfig,
      '--node-name',
      args.nodeName,
      '--backend',
      'nft',
      // The DaemonSet's, but for --min-sync-period: 0s makes each change a sync of its own (with
      // the DaemonSet's 1s, a change within a second of the previous sync waits for the rest).
      `--metrics-bind-address=${args.nodeAddress}:9477`,
      `--healthz-bind-address=${args.nodeAddress}:9478`,
      '--sync-period=30s',
      '--min-sync-period=0s',
      ...(args.extraArgs ?? []),
    ];
    const spawnedNs = process.hrtime.bigint();
    const child = spawn(nodePath, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
    return new ShippedController(child, spawnedNs);
  }

  get pid(): number {
    return this.child.pid!;
  }

  /** Throws, with its last output, when the controller is no longer running. */
  checkRunning(): void {
    if (this.exitedWith !== undefined)
      throw new Error(`the controller exited (${this.exitedWith}): ${this.lastLines.join(' | ')}`);
  }

  /** VmRSS in MiB. */
  residentMiB(): number {
    const status = readFileSync(`/proc/${this.pid}/status`, 'utf8');
    return Number(/^VmRSS:\s+(\d+) kB/m.exec(status)?.[1] ?? NaN) / 1024;
  }

  /** User and system CPU time of the whole process (all threads) so far, in ms. */
  cpuMs(): number {
    const stat = readFileSync(`/proc/${this.pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // utime and stime are fields 14 and 15 of proc_pid_stat(5) (fields[0] is field 3), in clock
    // ticks of 10 ms (USER_HZ on Linux).
    return (Number(fields[11]) + Number(fields[12])) * 10;
  }

  /** SIGTERM, as a kubelet stops it (the rules stay); SIGKILL after 10 s. */
  async stop(): Promise<void> {
    if (this.exitedWith !== undefined) return;
    const exit = once(this.child, 'exit');
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 10_000);
    await exit;
    clearTimeout(timer);
  }
}
