// What the reconciler tells its subscribers (src/driver/kernel-change.ts): each change of what
// the kernel holds of ours, one at a time and in the order of the writes, each starting where
// the one before ended; and each window the driver saw a family's translations bypassed, outside
// every write, with the entries the ledger holds there.

import type { Driver } from '../driver/driver.js';
import type { FamilyChange, KernelSubscriber } from '../driver/kernel-change.js';
import { entryDiff, recorded } from '../model/entry-diff.js';
import {
  FAMILIES,
  entriesIdentity,
  type DesiredState,
  type Entry,
  type Family,
  type FamilyState,
} from '../model/types.js';
import type { Untold } from './ledger.js';

export class Publication {
  /** What subscribers were last told the kernel holds (undefined: not known). */
  private told: DesiredState | undefined;
  /** Subscribers are told one change at a time. */
  private queue: Promise<unknown> = Promise.resolve();

  /** `programmed`: a family's entries as the ledger holds them now. */
  constructor(
    private readonly subscribers: readonly KernelSubscriber[],
    driver: Driver,
    programmed: (family: Family) => readonly Entry[],
  ) {
    driver.watchBypasses((family) => {
      const entries = programmed(family);
      if (entries.length === 0) return;
      for (const s of subscribers) s.translationsBypassed?.({ family, entries });
    });
  }

  /** What subscribers were last told the kernel holds; undefined before the first change. */
  get held(): DesiredState | undefined {
    return this.told;
  }

  /**
   * Tells subscribers that the kernel holds `next`, after every change told before; `untold` is
   * what was written since then (the ledger's), or 'whole' for every family.
   */
  publish(next: DesiredState, untold: ReadonlyMap<Family, Untold> | 'whole'): Promise<void> {
    const previous = this.told;
    this.told = next;
    const families = FAMILIES.map((family) =>
      familyChange(family, previous?.[family], next[family], untold === 'whole' ? 'whole' : untold.get(family)),
    );
    const told = this.queue.then(async () => {
      for (const s of this.subscribers) await s.kernelChanged({ previous, next, families });
    });
    this.queue = told.catch(() => undefined);
    return told;
  }
}

/** A family's change from what subscribers were told to `after`, from what was written between. */
export function familyChange(
  family: Family,
  before: FamilyState | undefined,
  after: FamilyState,
  untold: Untold | undefined,
): FamilyChange {
  if (!before) return { family, previousUnknown: true, shapeChanged: false, removed: [], added: after.entries };
  const shapeChanged = JSON.stringify(before.localPodMatch) !== JSON.stringify(after.localPodMatch);
  // Nothing written, or written whole: the difference is found here, once (a write whole needs none).
  const diff =
    untold === undefined
      ? entriesIdentity(before) === entriesIdentity(after)
        ? { removed: [], added: [] }
        : entryDiff(recorded(before), after)
      : untold === 'whole'
        ? entryDiff(recorded(before), after)
        : untold.result();
  return { family, previousUnknown: false, shapeChanged, removed: diff.removed, added: diff.added };
}
