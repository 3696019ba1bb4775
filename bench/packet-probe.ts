// Real packets, end to end: when does a connection to an address first succeed? A long-lived C
// prober (packet-probe-program.ts) is asked to probe one address; it answers with the
// CLOCK_MONOTONIC time (process.hrtime.bigint()'s clock) at which the first attempt that got
// connected was started. The benchmark takes its own hrtime when it acts (spawns the controller,
// writes a Service): the difference is the figure.
//
// The node it probes from is set up by `probeNode()`: the ClusterIPs are local (a `local` route
// on lo, answered by the prober's listener on 0.0.0.0:PORT), and the LoadBalancer and moved
// ranges are routed to a bridge with no ports, where an untranslated SYN leaves and vanishes
// (no ENETUNREACH, no answer). So an attempt connects if and only if it was translated.

import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { PACKET_PROBE_C } from './packet-probe-program.js';

export interface ProbeOutcome {
  ok: boolean;
  /** hrtime (ns) when probing began. */
  beginNs: bigint;
  /** hrtime (ns) at which the first attempt that connected was started (0 when none did). */
  firstOkNs: bigint;
  /** hrtime (ns) at which its success was seen. */
  okSeenNs: bigint;
  /** The attempt started right before it (the translation appeared in between); 0 if unknown. */
  beforeOkNs: bigint;
  attempts: number;
  errors: number;
  firstError: string;
}

export interface ProbeRun {
  /** Resolves with the outcome once an attempt connected or the timeout passed. */
  outcome: Promise<ProbeOutcome>;
}

/** Node network of the benchmark's namespace: see the header. Idempotent; never leaves the namespace. */
export interface ProbeNodeLayout {
  /** Ranges whose traffic must vanish unless translated (ingress and moved addresses). */
  sinkRanges: string[];
  /** Range of the ClusterIPs, made local. */
  clusterRange: string;
  /** The node's address (the source of the probes), put on the sink bridge. */
  nodeAddress: string;
  /**
   * Also a pod: a network namespace joined to the node by a veth, with this address (in the
   * node's pod CIDR, so the prerouting rule takes its traffic) and the gateway on the node side.
   */
  pod?: { address: string; gateway: string };
}

/** Where the pod namespace of `probeNode` is (bench/run.ts mounts its own tmpfs on /run/netns). */
export const POD_NETNS = '/run/netns/bench-pod';

const SINK = 'lb-sink';

export function probeNode(layout: ProbeNodeLayout): void {
  const ip = (...args: string[]) => execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  ip('link', 'set', 'lo', 'up');
  // A bridge without ports: the `dummy` link type is not built into this kernel.
  if (spawnSync('ip', ['link', 'show', SINK], { stdio: 'ignore' }).status !== 0) {
    ip('link', 'add', SINK, 'type', 'bridge');
    ip('link', 'set', SINK, 'up');
  }
  ip('addr', 'replace', layout.nodeAddress, 'dev', SINK);
  for (const range of layout.sinkRanges) ip('route', 'replace', range, 'dev', SINK);
  ip('route', 'replace', 'local', layout.clusterRange, 'dev', 'lo');
  if (layout.pod && spawnSync('ip', ['netns', 'pid', 'bench-pod'], { stdio: 'ignore' }).status !== 0) {
    // A tmpfs of this mount namespace only: the netns name never appears on the machine.
    execFileSync('mkdir', ['-p', '/run/netns']);
    execFileSync('mount', ['-t', 'tmpfs', 'bench-netns', '/run/netns']);
    ip('netns', 'add', 'bench-pod');
    ip('link', 'add', 'bench-vpod', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', 'bench-pod');
    ip('addr', 'add', layout.pod.gateway, 'dev', 'bench-vpod');
    ip('link', 'set', 'bench-vpod', 'up');
    const inPod = (...args: string[]) => ip('-n', 'bench-pod', ...args);
    inPod('link', 'set', 'lo', 'up');
    inPod('addr', 'add', layout.pod.address, 'dev', 'eth0');
    inPod('link', 'set', 'eth0', 'up');
    inPod('route', 'add', 'default', 'via', layout.pod.gateway.split('/')[0]!);
  }
  // Untranslated attempts leave a SYN_SENT conntrack entry each; do not keep them for 2 min.
  try {
    execFileSync('sysctl', ['-qw', 'net.netfilter.nf_conntrack_tcp_timeout_syn_sent=5']);
  } catch {
    // not a per-namespace setting on this kernel: the default holds
  }
}

/** Compiles C `source` into `dir`/`name` with the first compiler found; `what` names the program in the error. */
export function compileC(dir: string, name: string, source: string, what: string): string {
  const sourcePath = join(dir, `${name}.c`);
  const binary = join(dir, name);
  writeFileSync(sourcePath, source);
  for (const compiler of ['cc', 'clang']) {
    const r = spawnSync(compiler, ['-O2', '-Wall', '-o', binary, sourcePath], { stdio: 'inherit' });
    if (r.status === 0) return binary;
  }
  throw new Error(`${what} needs a C compiler: install gcc (or clang)`);
}

export function compilePacketProbe(dir: string): string {
  return compileC(dir, 'packet-probe', PACKET_PROBE_C, 'the packet prober');
}

export class PacketProbe {
  private readonly lines: string[] = [];
  private waiter: (() => void) | undefined;
  private exited = false;
  private busy = false;

  private constructor(private readonly child: ChildProcess) {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      this.lines.push(line);
      this.waiter?.();
    });
    child.on('exit', () => {
      this.exited = true;
      this.waiter?.();
    });
  }

  /**
   * Starts the prober. `cgroupProcs`: a cgroup.procs file it joins before exec (the ebpf backend
   * translates only sockets of processes below its cgroup).
   */
  static async start(
    binary: string,
    options: { port: number; cgroupProcs?: string; netns?: string },
  ): Promise<PacketProbe> {
    const env = { ...process.env, LISTEN_PORT: String(options.port) };
    // nsenter, not `ip netns exec`: that remounts /sys, which would hide the cgroup tree.
    const command = options.netns ? ['nsenter', `--net=${options.netns}`, binary] : [binary];
    const child = options.cgroupProcs
      ? spawn('sh', ['-c', 'echo $$ > "$0" && exec "$@"', options.cgroupProcs, ...command], {
          stdio: ['pipe', 'pipe', 'inherit'],
          env,
        })
      : spawn(command[0]!, command.slice(1), { stdio: ['pipe', 'pipe', 'inherit'], env });
    const probe = new PacketProbe(child);
    const ready = await probe.nextLine(5_000);
    if (ready !== 'ready') throw new Error(`the packet prober did not start: ${ready}`);
    return probe;
  }

  private async nextLine(timeoutMs: number): Promise<string> {
    const deadline = performance.now() + timeoutMs;
    while (this.lines.length === 0) {
      if (this.exited) throw new Error('the packet prober exited');
      const left = deadline - performance.now();
      if (left <= 0) throw new Error(`the packet prober said nothing for ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiter = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.waiter = undefined;
    }
    return this.lines.shift()!;
  }

  /**
   * Starts probing `address:port` every `intervalUs` (with `spread` > 0, every 1/spread of the
   * time probed so far once that is longer); resolves once the first attempt is out, so that
   * what the caller does next happens while probing runs.
   */
  async begin(address: string, port: number, timeoutMs: number, intervalUs = 150, spread = 0): Promise<ProbeRun> {
    if (this.busy) throw new Error('the packet prober is already probing');
    this.busy = true;
    this.child.stdin!.write(`probe ${address} ${port} ${timeoutMs} ${intervalUs} ${spread}\n`);
    const started = await this.nextLine(5_000);
    if (!started.startsWith('started ')) throw new Error(`packet prober: ${started}`);
    const outcome = this.nextLine(timeoutMs + 5_000).then((line) => {
      this.busy = false;
      const r = JSON.parse(line) as Record<string, unknown>;
      if (typeof r.error === 'string') throw new Error(`packet prober: ${r.error}`);
      return {
        ok: r.ok === true,
        beginNs: BigInt(r.beginNs as string),
        firstOkNs: BigInt(r.firstOkNs as string),
        okSeenNs: BigInt(r.okSeenNs as string),
        beforeOkNs: BigInt(r.beforeOkNs as string),
        attempts: r.attempts as number,
        errors: r.errors as number,
        firstError: r.firstError as string,
      };
    });
    return { outcome };
  }

  async stop(): Promise<void> {
    if (this.exited) return;
    const exit = once(this.child, 'exit');
    this.child.stdin!.end();
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 5_000);
    await exit;
    clearTimeout(timer);
  }
}

/** Milliseconds from `fromNs` (an hrtime) to when the first attempt that connected started. */
export function msSince(fromNs: bigint, outcome: ProbeOutcome): number {
  return Number(outcome.firstOkNs - fromNs) / 1e6;
}
