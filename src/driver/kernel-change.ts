// What the reconciler publishes of the kernel, and to whom: each change of what the kernel holds
// of ours, and each window in which a driver saw new connections pass our translations by. The
// composition root (src/cli/) hands the reconciler its subscribers; the conntrack clean-up
// (src/conntrack/conntrack-subscriber.ts) is one.

import type { DesiredState, Entry, Family } from '../model/types.js';

/**
 * How one family's entries changed in the kernel: the reconciler's one difference (the model's,
 * model/entry-diff.ts), composed over the writes since subscribers were last told.
 */
export interface FamilyChange {
  family: Family;
  /** What the kernel held of ours before is not known (nothing told since the start): `added` is every entry. */
  previousUnknown: boolean;
  /**
   * The family's shape changed (the local-pod match): every translation of the family may have
   * changed for pods, those whose entries stayed too.
   */
  shapeChanged: boolean;
  /** Entries whose elements went (an element whose value changed is removed and added). */
  removed: readonly Entry[];
  added: readonly Entry[];
}

/** What the kernel held of ours before a change and holds after it: what subscribers are told. */
export interface KernelChange {
  /** Undefined: not known (nothing programmed since the start). */
  previous: DesiredState | undefined;
  next: DesiredState;
  /** Per family, the difference from `previous` to `next`. */
  families: readonly FamilyChange[];
}

/**
 * A window in which new connections to a family's translations may have gone untranslated
 * (another writer's rule ran before ours); closed when this is told. Their flows, if nobody
 * answered them, stay pinned to the untranslated path until forgotten.
 */
export interface TranslationsBypassed {
  family: Family;
  /** The family's entries the reconciler had programmed when the window closed (its ledger's). */
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
