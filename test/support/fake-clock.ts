// A clock the test moves by hand: timers fire when advance() passes their time, in order, each
// followed by a turn of the event loop so that the promises they start can settle.

import type { Clock } from '../../src/sync/runner.js';

interface Timer {
  at: number;
  seq: number;
  callback: () => void;
}

/** One turn of the event loop: pending promise callbacks and immediates run. */
export function turn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

export class FakeClock implements Clock {
  private time = 1000;
  private seq = 0;
  private readonly timers = new Set<Timer>();

  now(): number {
    return this.time;
  }

  setTimeout(callback: () => void, ms: number): unknown {
    const timer = { at: this.time + Math.max(0, ms), seq: this.seq++, callback };
    this.timers.add(timer);
    return timer;
  }

  clearTimeout(handle: unknown): void {
    this.timers.delete(handle as Timer);
  }

  /** Timers waiting to fire. */
  get pending(): number {
    return this.timers.size;
  }

  /** Moves time forward by `ms`, firing each timer that falls due on the way. */
  async advance(ms: number): Promise<void> {
    const end = this.time + ms;
    for (;;) {
      await turn();
      let next: Timer | undefined;
      for (const t of this.timers)
        if (t.at <= end && (!next || t.at < next.at || (t.at === next.at && t.seq < next.seq))) next = t;
      if (!next) break;
      this.timers.delete(next);
      this.time = next.at;
      next.callback();
    }
    this.time = end;
    await turn();
  }
}
