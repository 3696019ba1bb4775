// What the reconciler tells its subscribers (src/driver/kernel-change.ts): each change of what
// the kernel holds of ours, one at a time and in the order of the writes, each starting where
// the one before ended; and each window the driver saw our translations bypassed, as the driver
// tells it, outside every write.

import type { Driver } from '../driver/driver.js';
import type { KernelSubscriber } from '../driver/kernel-change.js';
import type { DesiredState } from '../model/types.js';

export class Publication {
  /** What subscribers were last told the kernel holds (undefined: not known). */
  private told: DesiredState | undefined;
  /** Subscribers are told one change at a time. */
  private queue: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly subscribers: readonly KernelSubscriber[],
    driver: Driver,
  ) {
    driver.watchBypasses?.((bypass) => {
      for (const s of subscribers) s.translationsBypassed?.(bypass);
    });
  }

  /** What subscribers were last told the kernel holds; undefined before the first change. */
  get held(): DesiredState | undefined {
    return this.told;
  }

  /** Tells subscribers that the kernel holds `next`, after every change told before. */
  publish(next: DesiredState): Promise<void> {
    const previous = this.told;
    this.told = next;
    const told = this.queue.then(async () => {
      for (const s of this.subscribers) await s.kernelChanged({ previous, next });
    });
    this.queue = told.catch(() => undefined);
    return told;
  }
}
