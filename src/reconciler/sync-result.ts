// What a sync is asked to do, and what the reconciler answers of it (the controller reports it:
// logs, metrics, /readyz).

import type { Rejection } from '../driver/driver.js';
import type { Family } from '../model/types.js';

export interface SyncOptions {
  /** Rebuild everything we own, repairing drift. Otherwise only what changed may be written. */
  full: boolean;
  /** Called when the kernel writes are done, before subscribers are told (they may take long). */
  onWritten?: () => void;
}

/** Why a family that was asked for a partial sync got a full one (the `fallback_reason` label). */
export type FallbackReason = 'not-programmed' | 'table-shape-changed' | 'partial-failed';

export interface SyncResult {
  /** What was actually done: a partial request can turn into a full sync (state lost, first run). */
  mode: 'full' | 'partial' | 'noop';
  /** Programmed entries per family after the sync. */
  entries: { ipv4: number; ipv6: number };
  /** Why a partial request became a full sync, when it did (a metric label and a debug log). */
  fallbackReason?: FallbackReason;
  /** Elements and chains a full sync found changed by someone else and wrote back. */
  repairedElements?: number;
  /**
   * Families a full sync could not verify: another process committed to the ruleset throughout
   * every read back the time bound allowed, even between our writes. Nothing was repaired; what
   * was programmed stays, and the next full sync verifies again.
   */
  unverified?: Family[];
  /** What the driver left out of the kernel (a value it refuses), every family, as held after the sync. */
  rejected?: Rejection[];
  /**
   * A removal of our objects (cleanup, stepping aside) was asked for after this sync: what it
   * would have written was left out or removed, and nothing of it is held.
   */
  superseded?: true;
}
