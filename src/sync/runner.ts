// Bounded-frequency sync runner (kube-proxy's BoundedFrequencyRunner is the model):
// - a request after a quiet period runs at once;
// - requests during a sync or within minInterval of the last one coalesce into one later run;
// - a full sync runs at least every fullInterval (and after any failure), repairing drift;
// - a failed sync is retried with backoff, never faster than minInterval;
// - with partialDuringFull, a change is served by a partial sync while a periodic full sync is
//   under way (the backend orders its own writes), so a long resync never holds a change back.

export interface SyncRequestInfo {
  full: boolean;
  /** When the oldest change served by this sync was requested (performance.now() ms), if any. */
  changedAt?: number;
}

export interface SyncRunnerOptions {
  minIntervalMs: number;
  fullIntervalMs: number;
  sync(info: SyncRequestInfo): Promise<void>;
  onError?(err: Error, retryInMs: number): void;
  /** Partial syncs may run while a full sync runs (once a sync has succeeded). */
  partialDuringFull?: boolean;
  /** Time and timers; the real ones by default. */
  clock?: Clock;
  /** Jitter source for retry delays, in [0, 1); Math.random by default. */
  random?: () => number;
}

export class SyncRunner {
  private pending = false;
  private pendingFull = false;
  private changedAt: number | undefined;
  /** Syncs in flight: at most one full and one partial. */
  private readonly running = new Set<Promise<void>>();
  private fullRunning = false;
  private partialRunning = false;
  private succeeded = false;
  /** Cancels the scheduled run; set while one is scheduled. */
  private cancelScheduled: (() => void) | undefined;
  private fullTimer: unknown;
  private lastRunAt = Number.NEGATIVE_INFINITY;
  private failures = 0;
  /** performance.now() before which a retry after a failure does not start. */
  private retryNotBefore = 0;
  private stopped = true;

  private readonly clock: Clock;

  constructor(private readonly options: SyncRunnerOptions) {
    this.clock = options.clock ?? systemClock;
  }

  /** Starts with a full sync now, then full syncs every fullInterval. */
  start(): void {
    this.stopped = false;
    this.requestFull();
  }

  /** Something changed: sync soon (at once after a quiet period). */
  request(): void {
    this.changedAt ??= this.clock.now();
    this.pending = true;
    this.schedule(0);
  }

  requestFull(): void {
    this.pendingFull = true;
    this.pending = true;
    this.schedule(0);
  }

  /** Stops scheduling and waits for a sync in flight. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.cancelScheduled?.();
    this.cancelScheduled = undefined;
    this.clock.clearTimeout(this.fullTimer);
    await Promise.all(this.running);
  }

  /** What may start now, if anything is pending. */
  private startable(): 'full' | 'partial' | undefined {
    if (!this.pending) return undefined;
    if (this.pendingFull) return this.fullRunning || this.partialRunning ? undefined : 'full';
    if (this.partialRunning) return undefined;
    if (this.fullRunning && !(this.options.partialDuringFull && this.succeeded)) return undefined;
    return 'partial';
  }

  private schedule(extraDelayMs: number): void {
    if (this.stopped || this.cancelScheduled || !this.startable()) return;
    const sinceLast = this.clock.now() - this.lastRunAt;
    const delay = Math.max(
      extraDelayMs,
      this.options.minIntervalMs - sinceLast,
      this.pendingFull ? this.retryNotBefore - this.clock.now() : 0,
      0,
    );
    const fire = () => {
      this.cancelScheduled = undefined;
      void this.run();
    };
    // setTimeout waits at least 1 ms even when asked for 0: a sync due now runs on the next turn.
    if (delay > 0) {
      const timer = this.clock.setTimeout(fire, delay);
      this.cancelScheduled = () => this.clock.clearTimeout(timer);
    } else {
      const immediate = setImmediate(fire);
      this.cancelScheduled = () => clearImmediate(immediate);
    }
  }

  private async run(): Promise<void> {
    const kind = this.stopped ? undefined : this.startable();
    if (!kind) return;
    const info: SyncRequestInfo = { full: kind === 'full', changedAt: this.changedAt };
    this.pending = false;
    this.pendingFull = false;
    this.changedAt = undefined;
    this.lastRunAt = this.clock.now();
    if (info.full) this.fullRunning = true;
    else this.partialRunning = true;
    let retryDelay = 0;
    const attempt = this.options.sync(info);
    const settled = attempt.then(
      () => undefined,
      () => undefined,
    );
    this.running.add(settled);
    try {
      await attempt;
      this.failures = 0;
      this.retryNotBefore = 0;
      this.succeeded = true;
      if (info.full) this.armFullTimer();
    } catch (err) {
      this.failures++;
      // Up to a quarter longer at random: nodes that failed together (an API or kernel hiccup
      // across a fleet) do not retry in lockstep. Never shorter than the backoff step itself.
      const step = Math.max(this.options.minIntervalMs, 1000) * 2 ** (this.failures - 1);
      retryDelay = Math.min(this.options.fullIntervalMs, step * (1 + 0.25 * (this.options.random ?? Math.random)()));
      // Retry as a full sync: the kernel state after a failure is unknown.
      this.pending = true;
      this.pendingFull = true;
      this.changedAt =
        info.changedAt !== undefined ? Math.min(info.changedAt, this.changedAt ?? Infinity) : this.changedAt;
      this.retryNotBefore = this.clock.now() + retryDelay;
      this.options.onError?.(err instanceof Error ? err : new Error(String(err)), retryDelay);
      // A retry is due later: a run scheduled sooner (for a change) waits for it.
      this.cancelScheduled?.();
      this.cancelScheduled = undefined;
    } finally {
      this.running.delete(settled);
      if (info.full) this.fullRunning = false;
      else this.partialRunning = false;
    }
    if (this.pending) this.schedule(retryDelay);
  }

  private armFullTimer(): void {
    this.clock.clearTimeout(this.fullTimer);
    if (this.stopped) return;
    this.fullTimer = this.clock.setTimeout(() => this.requestFull(), this.options.fullIntervalMs);
  }
}

// The time source of the sync runner: the real one in the product, a driven one in its tests
// (test/support/fake-clock.ts), so that they assert ordering without sleeping.

export interface Clock {
  /** Milliseconds on a monotonic scale (performance.now()). */
  now(): number;
  setTimeout(callback: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export const systemClock: Clock = {
  now: () => performance.now(),
  setTimeout: (callback, ms) => setTimeout(callback, ms),
  clearTimeout: (handle) => clearTimeout(handle as NodeJS.Timeout | undefined),
};
