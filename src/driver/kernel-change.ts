// What the reconciler publishes of the kernel, and to whom: each change of what the kernel holds
// of ours, and each window in which a driver saw new connections pass our translations by. The
// composition root (src/cli/) hands the reconciler its subscribers; the conntrack clean-up
// (src/conntrack/conntrack-subscriber.ts) is one.

import type { DesiredState, Entry, Family } from '../model/types.js';

/** What the kernel held of ours before a change and holds after it: what subscribers are told. */
export interface KernelChange {
  /** Undefined: not known (nothing programmed since the start). */
  previous: DesiredState | undefined;
  next: DesiredState;
}

/**
 * A window in which new connections to a family's translations may have gone untranslated
 * (another writer's rule ran before ours); closed when this is told. Their flows, if nobody
 * answered them, stay pinned to the untranslated path until forgotten.
 */
export interface TranslationsBypassed {
  family: Family;
  /** The family's programmed entries when the window closed. */
  entries: readonly Entry[];
}

export interface KernelSubscriber {
  /**
   * Awaited before the sync that made the change ends; a failure is the subscriber's own to report.
   * Changes come one at a time, in the order they were written: each `previous` is the `next` before.
   */
  kernelChanged(change: KernelChange): Promise<void> | void;
  /** Told outside every write and sync, not awaited (the driver's watchBypasses). */
  translationsBypassed?(bypass: TranslationsBypassed): void;
}
