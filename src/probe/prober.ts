// The continuous probe (--probe-service, the annotation `ipvs-node-controller/probe: "true"`):
// every --probe-interval, from the controller's process (the node's network namespace, as a
// DaemonSet with hostNetwork runs it), the paths of the chosen Services are tried as `check`
// tries them: a TCP connect, closed at once without data, or one UDP datagram (PROBE_DATAGRAM)
// on a connected socket, answered or not within --probe-timeout. No conntrack entry is read: a
// probe says whether the path answers; `check` says why not.
//
// Bounded by what the operator sets, never by what a Service asks for: at most
// --probe-max-services Services (probe-selection.ts), MAX_PATHS_PER_SERVICE paths each,
// CONCURRENCY tries at once, one round at a time (the next starts an interval after the
// last one started, or when it ends if it ran longer). A round lasts at most
// ceil(paths / CONCURRENCY) x --probe-timeout.

import type { Logger } from 'pino';
import type { DesiredState, ServiceInfo } from '../model/types.js';
import { tryPath, type PathOutcome } from './path-probe.js';
import { probedServices, type ProbeOrigin } from './probe-selection.js';

/** Paths a round tries at once, at most (a finished try's socket closes on a later turn of the event loop: up to twice as many sockets for a moment). */
export const CONCURRENCY = 4;

export interface ProbeSettings {
  /** --probe-service: the operator's, `namespace/name`, probed first. */
  services: readonly string[];
  /** --probe-max-services: Services probed in all (0: no probe). */
  maxServices: number;
  intervalMs: number;
  timeoutMs: number;
  /** --probe-readiness: /readyz fails while a --probe-service Service's last round failed. */
  readiness: boolean;
}

export interface PathResult {
  address: string;
  protocol: string;
  port: number;
  outcome: PathOutcome;
  ms: number;
}

export interface ProbeResult {
  service: string;
  origin: ProbeOrigin;
  /** Every path answered. False also when nothing of it could be tried (notProbed). */
  ok: boolean;
  /** The slowest path's time. */
  ms: number;
  paths: PathResult[];
  notProbed?: string;
}

export interface ProbeObserver {
  /** Each round's results, every probed Service once. */
  onProbeRound(results: readonly ProbeResult[]): void;
}

type TryPath = (
  protocol: 'TCP' | 'UDP' | 'SCTP',
  address: string,
  port: number,
  timeoutMs: number,
) => Promise<{ outcome: PathOutcome; ms: number }>;

const tryWithoutConntrack: TryPath = (protocol, address, port, timeoutMs) =>
  tryPath(protocol, address, port, timeoutMs, undefined, null);

export class ContinuousProber {
  private desired: DesiredState | undefined;
  private timer: NodeJS.Timeout | undefined;
  private round: Promise<void> | undefined;
  private stopped = false;
  private started = false;
  private last: readonly ProbeResult[] = [];

  constructor(
    private readonly settings: ProbeSettings,
    private readonly services: { list(): ServiceInfo[] },
    private readonly observer: ProbeObserver,
    private readonly logger: Logger,
    private readonly tryOne: TryPath = tryWithoutConntrack,
  ) {}

  /** The controller's latest desired state: what is translated, so what can be tried. */
  onDesiredState(desired: DesiredState): void {
    this.desired = desired;
  }

  /** The first sync that ended without an error starts the rounds: its state is in the kernel. */
  onSync(report: { error?: Error }): void {
    if (report.error || !this.desired || this.started || this.stopped || this.settings.maxServices === 0) return;
    this.started = true;
    this.schedule(0);
  }

  /** For /readyz: the --probe-service Services whose last round failed, when --probe-readiness asks. */
  failingForReadiness(): ProbeResult[] {
    if (!this.settings.readiness) return [];
    return this.last.filter((r) => r.origin === 'flag' && !r.ok);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    this.timer = undefined;
    await this.round;
  }

  private schedule(delayMs: number): void {
    this.timer = setTimeout(() => {
      this.timer = undefined;
      const started = performance.now();
      this.round = this.runRound()
        .catch((err: Error) => this.logger.warn({ err }, 'A probe round failed'))
        .finally(() => {
          this.round = undefined;
          if (!this.stopped) this.schedule(Math.max(0, this.settings.intervalMs - (performance.now() - started)));
        });
    }, delayMs);
    this.timer.unref();
  }

  private async runRound(): Promise<void> {
    const { services, maxServices, timeoutMs } = this.settings;
    const chosen = probedServices(services, this.services.list(), this.desired, maxServices);
    const tries = chosen.flatMap((c, s) => c.paths.map((e) => ({ s, e })));
    const tried = new Array<PathResult>(tries.length);
    let next = 0;
    const worker = async () => {
      while (next < tries.length && !this.stopped) {
        const i = next++;
        const { e } = tries[i]!;
        const t = await this.tryOne(e.protocol, e.externalIp, e.port, timeoutMs);
        tried[i] = { address: e.externalIp, protocol: e.protocol, port: e.port, outcome: t.outcome, ms: t.ms };
      }
    };
    await Promise.all(Array.from({ length: Math.min(CONCURRENCY, tries.length) }, worker));
    if (this.stopped) return;
    const results: ProbeResult[] = chosen.map((c) => ({
      service: c.service,
      origin: c.origin,
      ok: c.paths.length > 0,
      ms: 0,
      paths: [],
      ...(c.notProbed !== undefined ? { notProbed: c.notProbed } : {}),
    }));
    tries.forEach(({ s }, i) => {
      const r = results[s]!;
      const p = tried[i]!;
      r.paths.push(p);
      r.ms = Math.max(r.ms, p.ms);
      if (p.outcome !== 'answered') r.ok = false;
    });
    this.logChanges(results);
    this.last = results;
    this.observer.onProbeRound(results);
  }

  /** One line per Service whose verdict changed (at most --probe-max-services a round). */
  private logChanges(results: readonly ProbeResult[]): void {
    const before = new Map(this.last.map((r) => [r.service, r.ok]));
    for (const r of results) {
      const was = before.get(r.service);
      if (was === r.ok) continue;
      if (!r.ok) {
        const failed = r.paths.filter((p) => p.outcome !== 'answered');
        const why = r.notProbed ?? failed.map((p) => `${p.address}:${p.port}/${p.protocol} ${p.outcome}`).join(', ');
        this.logger.warn({ service: r.service, origin: r.origin, why }, 'Probe failing');
      } else if (was === false) {
        this.logger.info({ service: r.service, origin: r.origin }, 'Probe answered again');
      }
    }
  }
}
