// The removal of what other backends left on the node (their tables or chains would translate
// what this one no longer does): tried after the first successful sync, and again with back-off
// until it succeeds; meanwhile its status says why (/readyz) and the observer is told (a metric).

import type { Logger } from '../log.js';

export interface LeftoverStatus {
  /** Date.now() of the first failed attempt. */
  failingSince: number;
  attempts: number;
  error: string;
  /** Date.now() of the next attempt. */
  retryAt: number;
}

/** Retries of the removal: 5 s, then doubled up to 5 minutes. */
export const LEFTOVER_RETRY_MS = { initial: 5_000, max: 300_000 };

export interface LeftoverRemovalOptions {
  remove: (() => Promise<void>) | undefined;
  logger: Logger;
  /** Between retries: the first wait, doubled after each failure up to the second. */
  retryMs?: { initial: number; max: number } | undefined;
  /** Leftovers remain after a failed removal (true), or are gone (false). */
  onPending?: (pending: boolean) => void;
}

export class LeftoverRemoval {
  /** While leftovers could not be removed: since when, why, the next attempt. */
  status: LeftoverStatus | undefined;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;

  constructor(private readonly options: LeftoverRemovalOptions) {}

  /**
   * One attempt; after a failure the next is scheduled with back-off, and `status` says so until
   * one succeeds. Never throws.
   */
  async attempt(): Promise<void> {
    const { remove, logger } = this.options;
    if (!remove || this.stopped) return;
    this.timer = undefined;
    try {
      await remove();
      if (this.status) {
        logger.info({ attempts: this.status.attempts + 1 }, 'Removed leftovers of other backends');
        this.status = undefined;
        this.options.onPending?.(false);
      }
    } catch (err) {
      const retry = this.options.retryMs ?? LEFTOVER_RETRY_MS;
      const attempts = (this.status?.attempts ?? 0) + 1;
      const retryInMs = Math.min(retry.max, retry.initial * 2 ** (attempts - 1));
      const now = Date.now();
      this.status = {
        failingSince: this.status?.failingSince ?? now,
        attempts,
        error: (err as Error).message,
        retryAt: now + retryInMs,
      };
      logger.warn({ attempts, retryInMs, err }, 'Failed to remove leftovers of other backends');
      this.options.onPending?.(true);
      if (this.stopped) return;
      this.timer = setTimeout(() => void this.attempt(), retryInMs);
      // The controller's own work keeps the process alive, not this.
      this.timer.unref();
    }
  }

  /** No attempt from now on. */
  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }
}
