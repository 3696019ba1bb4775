// What the reconciler knows the kernel holds of ours, per family: the programmed entries and the
// shape of our objects, the newest state written and its model generation, what the driver left
// out, the driver's annex of its last write (driver.ts, DriverAnnex: what that write tells of the
// kernel beyond this record, handed back with the next operation on the family), and the ruleset
// generation at which the family was last known to hold exactly that. This is the one record of
// what the kernel holds: a driver keeps none between its applies, and a family forgotten here
// (a failed write, a removal, a whole write under way) takes its annex with it.
//
// Trust: where the driver reads the ruleset generation around each commit, a commit that moved it
// by exactly one was ours alone. A family made exact by such a commit (a whole write, a repair
// computed from a read at the generation just before) is trusted at the generation after it, and
// stays trusted through later commits that are ours alone; any other commit, or a failed write,
// ends the trust: the next resync verifies.

import {
  FAMILIES,
  entryCount,
  withoutEntries,
  type DesiredState,
  type Entry,
  type Family,
  type FamilyState,
} from '../model/types.js';
import type { Applied, Driver, DriverAnnex, FamilyShape, Rejection } from '../driver/driver.js';
import { ComposedDiff, type EntryDiff } from '../model/entry-diff.js';
import { ElementStorage } from './element-storage.js';

export interface ProgrammedFamily {
  elements: ElementStorage;
  /** The family's objects but its elements, as programmed: what a verification checks. */
  shape: FamilyShape;
  /** The driver's key of `shape`, compared to decide whether a partial sync is possible. */
  shapeKey: string;
  /** Entries the driver left out of its last whole write. */
  leftOut: number;
  /** Entries the family holds before it must be written whole again (driver.roomFor). */
  room: number;
  /** What the driver's last write of the family told of the kernel, for its next one (Applied.annex). */
  annex: DriverAnnex;
}

/** What was written of a family since subscribers were last told (Ledger.takeUntold). */
export type Untold = ComposedDiff | 'whole';

/** The state a family was last written with, and its generation. */
export interface Written {
  generation: number;
  desired: DesiredState;
}

/** The families a write leaves exactly as programmed (see Ledger.noteApplied). */
export interface Exact {
  families: readonly Family[];
  /** Only provided the ruleset was at this generation just before the write. */
  since?: number;
}

export function shapeOf(state: FamilyState, masqueradeMark: number): FamilyShape {
  return { state: withoutEntries(state), masqueradeMark };
}

export class Ledger {
  /** Per family, what is programmed; absent: not known (never written, or a write failed). */
  readonly programmed = new Map<Family, ProgrammedFamily>();
  /** Per family, the newest state written (recorded as each write commits); absent: none since the start or a removal. */
  readonly written = new Map<Family, Written>();
  /** Bumped whenever a family is written whole or removed: a verification begun before is void. */
  epoch = 0;
  /** Per family, a ruleset generation at which the kernel held exactly what `programmed` says. */
  private readonly trustedAt = new Map<Family, number>();
  /** Per family, what the driver left out of it, as it last said. */
  private readonly rejected = new Map<Family, readonly Rejection[]>();
  /**
   * Per family, what was written since subscribers were last told (takeUntold): the element
   * differences written, composed, or 'whole' when it was written whole (its difference is then
   * found when they are told: the write itself needed none).
   */
  private untold = new Map<Family, Untold>();

  constructor(private readonly driver: Driver) {}

  /** Forgets what was programmed and written: the kernel is to hold nothing of ours. */
  forget(): void {
    this.programmed.clear();
    this.trustedAt.clear();
    this.written.clear();
    this.rejected.clear();
    this.untold.clear();
    this.epoch++;
  }

  /** `families` are about to be written whole: nothing of them is known until each is recorded. */
  unprogram(families: readonly Family[]): void {
    this.epoch++;
    for (const family of families) {
      this.programmed.delete(family);
      this.untold.set(family, 'whole');
    }
  }

  /** Records `family` written whole with `target`'s state. */
  recordWhole(family: Family, target: Written, applied: Applied): void {
    const state = target.desired[family];
    const shape = shapeOf(state, target.desired.masqueradeMark);
    this.programmed.set(family, {
      elements: new ElementStorage(state),
      shape,
      shapeKey: this.driver.shapeKey(shape),
      leftOut: applied.leftOut?.[family] ?? 0,
      room: this.driver.roomFor(entryCount(state)),
      annex: applied.annex?.[family],
    });
    this.written.set(family, target);
    this.untold.set(family, 'whole');
  }

  /** Records that the family's elements now hold `target`'s entries, `changes` written to get there. */
  commit(family: Family, programmed: ProgrammedFamily, target: Written, changes: EntryDiff): void {
    programmed.elements.commit(target.desired[family], changes);
    this.written.set(family, target);
    let untold = this.untold.get(family);
    if (untold === 'whole') return;
    if (!untold) this.untold.set(family, (untold = new ComposedDiff()));
    untold.add(changes);
  }

  /** What was written since the last call, per family (see `untold`); forgotten here. */
  takeUntold(): ReadonlyMap<Family, Untold> {
    const untold = this.untold;
    this.untold = new Map();
    return untold;
  }

  /**
   * What a commit said: what the driver now leaves out, its annex of each family it wrote (kept
   * with a family programmed; one written whole takes it when recorded), and which families stay
   * or become trusted.
   */
  noteApplied(applied: Applied, exact: Exact): void {
    for (const family of FAMILIES) {
      const rejected = applied.rejected?.[family];
      if (rejected) this.rejected.set(family, rejected);
      const programmed = this.programmed.get(family);
      if (programmed && applied.annex && family in applied.annex) programmed.annex = applied.annex[family];
    }
    // Nothing committed (the kernel held it already): what was trusted still is.
    if (applied.unchanged) return;
    const g = applied.generations;
    const oursAlone = g !== undefined && g.after === g.before + 1;
    for (const family of FAMILIES) {
      const carried = this.trustedAt.get(family) === g?.before;
      const madeExact = exact.families.includes(family) && (exact.since === undefined || exact.since === g?.before);
      if (oursAlone && (carried || madeExact)) this.trustedAt.set(family, g.after);
      else this.trustedAt.delete(family);
    }
  }

  /** A write failed: what the kernel holds now is not known exactly. */
  distrust(): void {
    this.trustedAt.clear();
  }

  /** A read at `generation` found the family exactly as programmed. */
  trust(family: Family, generation: number): void {
    this.trustedAt.set(family, generation);
  }

  /** True when the kernel still holds exactly what was programmed for `family` (nobody else wrote). */
  async untouched(family: Family): Promise<boolean> {
    const trusted = this.trustedAt.get(family);
    if (trusted === undefined) return false;
    return (await this.driver.generation()) === trusted;
  }

  /** The entries programmed in `family` (none while it is not known). */
  entries(family: Family): Entry[] {
    return [...(this.programmed.get(family)?.elements.values() ?? [])];
  }

  /** Entries of `family` the kernel holds: those written, but those the driver left out. */
  count(family: Family): number {
    const written = this.written.get(family)?.desired[family];
    const count = written ? entryCount(written) : 0;
    return count - (this.programmed.get(family)?.leftOut ?? 0);
  }

  /** What the driver leaves out, every family. */
  rejections(): Rejection[] {
    return FAMILIES.flatMap((family) => this.rejected.get(family) ?? []);
  }

  /**
   * What the kernel holds of ours now, as written: each family's newest state. The other fields
   * are those of the newest of them. Every family is written by then: a sync that neither failed
   * nor was superseded by a removal wrote each family, whole or by its changes.
   */
  holding(): DesiredState {
    const ipv4 = this.written.get('ipv4')!;
    const ipv6 = this.written.get('ipv6')!;
    if (ipv4.desired === ipv6.desired) return ipv4.desired;
    const newest = ipv6.generation > ipv4.generation ? ipv6 : ipv4;
    return { ...newest.desired, ipv4: ipv4.desired.ipv4, ipv6: ipv6.desired.ipv6 };
  }
}
