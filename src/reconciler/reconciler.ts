// The one owner of what the kernel holds of ours, whatever the backend. Per family it keeps the
// programmed entries, the shape of our objects and the ruleset generation at which the kernel
// was last known to hold exactly that; it decides what a sync writes, has a driver write it, and
// tells subscribers (conntrack clean-up) what changed.
//
// - A family nothing is known of, or whose shape changed, is written whole; both families in one
//   write where the driver's writes are atomic, else one by one, the last resort a replacement.
// - Between full syncs only the elements that changed are written. A failed partial write falls
//   back to a whole write of the family ('partial-failed').
// - A periodic full sync writes the shape again with the element changes (never touching other
//   elements), then verifies: reads the family back, and repairs only what drifted. Elements
//   written while the read ran are left to the next verification. A read that cannot finish (the
//   nft command restarts its listing whenever the ruleset changes) skips the verification, at
//   most MAX_SKIPPED_VERIFICATIONS times in a row, after which it runs between our writes.
// - Where the driver reads the ruleset generation around each commit, a commit that moved it by
//   exactly one was ours alone: a resync of a family nobody else touched since it was last exact
//   writes only the element changes and reads nothing back.
// - Writes run one at a time, in the order they were asked for: a partial sync may run while a
//   full sync verifies (ordersOwnWrites).
// - Every write carries the model's generation of the state it was asked for, and never takes a
//   family back: a write whose family already holds a newer state writes that state instead (a
//   full sync still repairs, toward the newer state). A removal of our objects (cleanup, stepping
//   aside) voids every write asked for before it that has not run yet.
// - What the kernel holds is recorded as each write commits, and subscribers are told in the
//   order of the writes, each change starting where the one before ended: a sync that ends after
//   a newer one never tells them of its older state.

import { FAMILIES, type DesiredState, type Entry, type Family, type FamilyState } from '../model/types.js';
import { ElementStorage, entryKey, isEmpty, type ElementChanges } from './element-storage.js';
import {
  BackendError,
  type Driver,
  type Applied,
  type DriverOperation,
  type EntryCapacity,
  type FallbackReason,
  type FamilyShape,
  type KernelElement,
  type KernelSubscriber,
  type ProbeResult,
  type ReadBack,
  type Rejection,
  type SyncOptions,
  type SyncResult,
} from './driver.js';

/** Elements written by partial syncs after which freed memory is handed back at once. */
const RELEASE_AFTER_ELEMENTS = 5000;

/** Verifications skipped in a row (the read could not finish) before one holds back our writes. */
export const MAX_SKIPPED_VERIFICATIONS = 10;

interface ProgrammedFamily {
  elements: ElementStorage;
  /** The family's objects but its elements, as programmed: what a verification checks. */
  shape: FamilyShape;
  /** The driver's key of `shape`, compared to decide whether a partial sync is possible. */
  shapeKey: string;
  /** Entries the driver left out of its last whole write. */
  leftOut: number;
  /** Entries the family holds before it must be written whole again (driver.roomFor). */
  room: number;
}

/** A sync or removal as asked for. */
interface Call {
  /** The generation of its state (DesiredState.generation). */
  generation: number;
  /** Removals asked for before it: one asked for since voids its writes. */
  removals: number;
}

/** The state a family was last written with, and its generation. */
interface Written {
  generation: number;
  desired: DesiredState;
}

function shapeOf(state: FamilyState, masqueradeMark: number): FamilyShape {
  return { state: { ...state, entries: [], changes: undefined }, masqueradeMark };
}

/** The same state with nothing programmed: what the kernel holds once our objects are removed. */
function withoutEntries(state: DesiredState): DesiredState {
  // Without `changes`: they describe the model's step, not this state's difference from the last.
  const empty = (family: FamilyState): FamilyState => ({ ...family, entries: [], changes: undefined });
  return { ...state, ipv4: empty(state.ipv4), ipv6: empty(state.ipv6) };
}

export class Reconciler {
  private readonly programmed = new Map<Family, ProgrammedFamily>();
  /** Writes run one at a time, in the order they were asked for. */
  private queue: Promise<unknown> = Promise.resolve();
  /** Keys written per family while a verification read was under way: not judged by it. */
  private readonly writtenDuringRead = new Map<Family, Set<string>>();
  /** Bumped whenever a family is written whole or removed: a verification begun before is void. */
  private epoch = 0;
  private readonly skippedVerifications = new Map<Family, number>();
  /**
   * Per family, a ruleset generation at which the kernel held exactly what `programmed` says,
   * carried forward through commits that were ours alone; absent: unknown, verify.
   */
  private readonly trustedAt = new Map<Family, number>();
  private writtenSinceRelease = 0;
  /** Per family, the newest state written (recorded as each write commits); absent: none since the start or a removal. */
  private readonly written = new Map<Family, Written>();
  /** Per family, what the driver left out of it, as it last said. */
  private readonly rejected = new Map<Family, readonly Rejection[]>();
  /** Removals of our objects asked for so far. */
  private removals = 0;
  /** The newest generation asked for: a state without one counts as that new. */
  private newestGeneration = 0;
  /** What subscribers were last told the kernel holds (undefined: not known). */
  private held: DesiredState | undefined;
  /** Subscribers are told one change at a time, in the order of the writes. */
  private publications: Promise<unknown> = Promise.resolve();
  private readonly subscribers: KernelSubscriber[] = [];
  /** Resyncs answered by the generation alone, without reading back (the tests read it). */
  verificationsSkipped = 0;

  constructor(readonly driver: Driver) {}

  get name() {
    return this.driver.name;
  }

  /** Whether the driver filters sources (entries with sourceRanges). */
  get filtersSources(): boolean {
    return this.driver.capabilities.filtersSources;
  }

  get capacity(): EntryCapacity {
    return this.driver.capacity;
  }

  get capabilities() {
    return this.driver.capabilities;
  }

  /** `subscriber` is told of every change of what the kernel holds, in order. */
  subscribe(subscriber: KernelSubscriber): void {
    this.subscribers.push(subscriber);
    if (subscriber.translationsBypassed) this.driver.watchBypasses?.((b) => subscriber.translationsBypassed!(b));
  }

  probe(): Promise<ProbeResult> {
    return this.driver.probe();
  }

  /** Makes the kernel hold `desired`. */
  async sync(desired: DesiredState, options: SyncOptions): Promise<SyncResult> {
    const { driver } = this;
    const call = this.call(desired);
    await driver.prepare?.(desired, options.full);
    const mark = desired.masqueradeMark;
    const modes: Array<SyncResult['mode']> = [];
    const failures: string[] = [];
    const rewrite: Family[] = [];
    const resync: Family[] = [];
    let fallbackReason: FallbackReason | undefined;
    const fallBack = (family: Family, reason: FallbackReason) => {
      rewrite.push(family);
      if (!options.full) fallbackReason ??= reason;
    };
    for (const family of FAMILIES) {
      const before = this.programmed.get(family);
      if (!before) fallBack(family, 'not-programmed');
      else if (
        before.shapeKey !== driver.shapeKey(shapeOf(desired[family], mark)) ||
        desired[family].entries.length > before.room
      ) {
        fallBack(family, 'table-shape-changed');
      } else if (options.full) {
        if (driver.capabilities.readsBack) resync.push(family);
        else rewrite.push(family);
      } else if (!driver.capabilities.writesElements) {
        const target = this.target(call, family, desired);
        const changes = target && before.elements.changesTo(target.desired[family]);
        if (changes && !isEmpty(changes)) rewrite.push(family);
        else {
          if (target && changes) this.commit(family, before, target, changes);
          modes.push('noop');
        }
      } else {
        const mode = await this.exclusive(() => this.writeChangedElements(call, family, desired));
        if (mode) modes.push(mode);
        else fallBack(family, 'partial-failed');
      }
    }
    const verify: Family[] = [];
    for (const family of resync) {
      const outcome = await this.exclusive(() => this.resync(call, family, desired));
      if (outcome === 'verify') verify.push(family);
      else if (outcome === 'untouched') modes.push('full');
      else if (outcome === false) rewrite.push(family);
    }
    if (rewrite.length > 0) {
      const written = await this.exclusive(() => this.writeWhole(call, rewrite, desired));
      failures.push(...written.failures);
      modes.push(written.wrote ? 'full' : 'noop');
    }
    let repaired = 0;
    for (const family of verify) {
      try {
        repaired += await this.verify(family);
        modes.push('full');
      } catch (err) {
        failures.push(`${driver.familyLabel(family)}: verifying the map: ${(err as Error).message}`);
      }
    }
    // A family written whole or verified (the start, every --sync-period, a fallback), or many
    // elements written (a large Service), follows large frees: glibc keeps freed memory of its
    // arenas until told (libnftables parses about 4 KiB per element of a document).
    if (modes.includes('full') || this.writtenSinceRelease >= RELEASE_AFTER_ELEMENTS) {
      this.writtenSinceRelease = 0;
      await this.releaseMemory().catch(() => undefined);
    }
    const superseded = call.removals !== this.removals;
    if (failures.length > 0 && !superseded) {
      throw new BackendError(`${driver.label} sync failed: ${failures.join('; ')}`, driver.name);
    }
    options.onWritten?.();
    // A removal asked for since: it tells subscribers that nothing is held.
    if (!superseded) await this.publish(this.holding(desired));
    const result: SyncResult = {
      mode: superseded ? 'noop' : modes.includes('full') ? 'full' : modes.includes('partial') ? 'partial' : 'noop',
      entries: { ipv4: this.programmedCount('ipv4'), ipv6: this.programmedCount('ipv6') },
      rejected: FAMILIES.flatMap((family) => this.rejected.get(family) ?? []),
    };
    if (superseded) result.superseded = true;
    if (fallbackReason) result.fallbackReason = fallbackReason;
    if (repaired > 0) result.repairedElements = repaired;
    return result;
  }

  /**
   * Removes every object of ours (--cleanup, stepping aside). `basis`, when given, is the state
   * the kernel is then said to hold with its entries left out, for subscribers; without it, what
   * was held last.
   */
  async cleanup(basis?: DesiredState): Promise<void> {
    // A barrier: writes asked for before it and not yet run are void (target()).
    this.removals++;
    this.forget();
    let told: Promise<void> | undefined;
    try {
      await this.exclusive(async () => {
        // A write that was under way when the removal was asked for may have recorded itself.
        this.forget();
        await this.driver.apply([{ kind: 'removeAll' }]);
        // In the order of the writes: before any write that comes after the removal.
        const held = basis ?? this.held;
        if (held) told = this.publish(withoutEntries(held));
      });
    } catch (err) {
      if (err instanceof BackendError) throw err;
      throw new BackendError(`${this.driver.label} cleanup failed: ${(err as Error).message}`, this.driver.name);
    }
    await told;
  }

  /** Forgets what was programmed and written: the kernel is to hold nothing of ours. */
  private forget(): void {
    this.programmed.clear();
    this.trustedAt.clear();
    this.written.clear();
    this.rejected.clear();
    this.epoch++;
  }

  /** Whether any object of ours exists in the kernel (used to find leftovers of another backend choice). */
  async hasState(): Promise<boolean> {
    return (await this.driver.hasState?.()) ?? false;
  }

  async releaseMemory(): Promise<void> {
    await this.driver.releaseMemory?.();
  }

  /** Releases the driver's resources; the kernel keeps what it holds. */
  async close(): Promise<void> {
    await this.driver.close?.();
  }

  private programmedCount(family: Family): number {
    const written = this.written.get(family)?.desired[family].entries.length ?? 0;
    return written - (this.programmed.get(family)?.leftOut ?? 0);
  }

  private call(desired: DesiredState): Call {
    const generation = desired.generation ?? this.newestGeneration;
    this.newestGeneration = Math.max(this.newestGeneration, generation);
    return { generation, removals: this.removals };
  }

  /**
   * The state a write of `family` asked for by `call` makes the kernel hold, decided when the
   * write's turn comes: the call's own, or the newer one the family was written with since (a
   * write never takes a family back). Undefined: a removal was asked for since the call.
   */
  private target(call: Call, family: Family, desired: DesiredState): Written | undefined {
    if (call.removals !== this.removals) return undefined;
    const written = this.written.get(family);
    return written && written.generation > call.generation ? written : { generation: call.generation, desired };
  }

  /** Records that the family's elements now hold `target`'s entries. */
  private commit(family: Family, programmed: ProgrammedFamily, target: Written, changes: ElementChanges): void {
    programmed.elements.commit(target.desired[family], changes);
    this.written.set(family, target);
  }

  /**
   * What the kernel holds of ours now, as written: each family's newest state. The other fields
   * are those of the newest of them.
   */
  private holding(desired: DesiredState): DesiredState {
    const ipv4 = this.written.get('ipv4');
    const ipv6 = this.written.get('ipv6');
    if (ipv4 && ipv4.desired === ipv6?.desired) return ipv4.desired;
    const newest = [ipv4, ipv6].reduce<Written | undefined>(
      (a, b) => (b && (!a || b.generation > a.generation) ? b : a),
      undefined,
    );
    return {
      ...(newest?.desired ?? desired),
      ipv4: ipv4?.desired.ipv4 ?? desired.ipv4,
      ipv6: ipv6?.desired.ipv6 ?? desired.ipv6,
    };
  }

  /** Tells subscribers that the kernel holds `next`, after every change told before. */
  private publish(next: DesiredState): Promise<void> {
    const previous = this.held;
    this.held = next;
    const told = this.publications.then(async () => {
      for (const s of this.subscribers) await s.kernelChanged({ previous, next });
    });
    this.publications = told.catch(() => undefined);
    return told;
  }

  /** Runs `work` after every write asked for before it. */
  private exclusive<T>(work: () => Promise<T>): Promise<T> {
    const run = this.queue.then(work, work);
    this.queue = run.catch(() => undefined);
    return run;
  }

  /**
   * Has the driver apply `operations`. `exact`: families the write leaves exactly as programmed
   * whatever they held before (a whole write), or, with `since`, provided the ruleset was at that
   * generation just before (a repair computed from a read taken there).
   */
  private async apply(
    operations: DriverOperation[],
    exact: { families: Family[]; since?: number } = { families: [] },
  ): Promise<Applied> {
    if (operations.length === 0) return { unchanged: true };
    let applied: Applied;
    try {
      applied = await this.driver.apply(operations);
    } catch (err) {
      this.trustedAt.clear();
      throw err;
    }
    for (const family of FAMILIES) {
      const rejected = applied.rejected?.[family];
      if (rejected) this.rejected.set(family, rejected);
    }
    // Nothing committed (the kernel held it already): what was trusted still is.
    if (applied.unchanged) return applied;
    const g = applied.generations;
    const oursAlone = g !== undefined && g.after === g.before + 1;
    for (const family of FAMILIES) {
      const carried = this.trustedAt.get(family) === g?.before;
      const madeExact = exact.families.includes(family) && (exact.since === undefined || exact.since === g?.before);
      if (oursAlone && (carried || madeExact)) this.trustedAt.set(family, g.after);
      else this.trustedAt.delete(family);
    }
    return applied;
  }

  /** True when the kernel still holds exactly what was programmed for `family` (nobody else wrote). */
  private async untouched(family: Family): Promise<boolean> {
    const trusted = this.trustedAt.get(family);
    if (trusted === undefined || !this.driver.generation) return false;
    return (await this.driver.generation()) === trusted;
  }

  private noteWritten(family: Family, changes: Pick<ElementChanges, 'removed' | 'added'>): void {
    const written = this.writtenDuringRead.get(family);
    if (!written) return;
    for (const e of changes.removed) written.add(entryKey(e));
    for (const e of changes.added) written.add(entryKey(e));
  }

  /**
   * A partial sync of one family: only the elements that changed. Undefined when the kernel
   * refused them (it no longer holds what we programmed): the family needs a whole write.
   */
  private async writeChangedElements(
    call: Call,
    family: Family,
    desired: DesiredState,
  ): Promise<'partial' | 'noop' | undefined> {
    const target = this.target(call, family, desired);
    if (!target) return 'noop';
    const before = this.programmed.get(family);
    if (!before) return undefined;
    const changes = before.elements.changesTo(target.desired[family]);
    let wrote = !isEmpty(changes);
    if (wrote) {
      try {
        const applied = await this.apply([{ kind: 'elements', family, remove: changes.removed, add: changes.added }]);
        const leftOut = applied.leftOut?.[family];
        if (leftOut !== undefined) before.leftOut = leftOut;
        // The driver's elements may hold less than an entry (no Service name): nothing to write.
        if (applied.unchanged) wrote = false;
      } catch {
        this.programmed.delete(family);
        return undefined;
      }
      this.noteWritten(family, changes);
      this.writtenSinceRelease += changes.removed.length + changes.added.length;
    }
    this.commit(family, before, target, changes);
    return wrote ? 'partial' : 'noop';
  }

  /**
   * The periodic resync of one family whose shape is unchanged. When nobody else has committed
   * since the kernel last held exactly what was programmed, only the element changes are written
   * ('untouched'). Otherwise the shape is written again with those changes, and the family is
   * verified afterwards ('verify'). False when the kernel refused it. A family written since with
   * a newer state is resynced to that state.
   */
  private async resync(
    call: Call,
    family: Family,
    desired: DesiredState,
  ): Promise<'verify' | 'untouched' | 'void' | false> {
    const target = this.target(call, family, desired);
    if (!target) return 'void';
    const before = this.programmed.get(family);
    if (!before) return false;
    const state = target.desired[family];
    const mark = target.desired.masqueradeMark;
    const changes = before.elements.changesTo(state);
    const untouched = await this.untouched(family);
    const { removed: remove, added: add } = changes;
    const operations: DriverOperation[] = untouched
      ? isEmpty(changes)
        ? []
        : [{ kind: 'elements', family, remove, add }]
      : [{ kind: 'writeShape', family, shape: shapeOf(state, mark), remove, add }];
    try {
      await this.apply(operations);
    } catch {
      this.programmed.delete(family);
      return false;
    }
    this.noteWritten(family, changes);
    this.commit(family, before, target, changes);
    if (!untouched) return 'verify';
    this.verificationsSkipped++;
    return 'untouched';
  }

  /**
   * Writes `families` whole: in one write where the driver's writes are atomic, else (or when
   * that fails) one by one, so that one family's problem neither blocks the other nor goes
   * unreported; a family whose objects were changed so that they cannot be declared again is
   * replaced. Returns the failures. A family written since with a newer state is written whole
   * with that state.
   */
  private async writeWhole(
    call: Call,
    families: Family[],
    desired: DesiredState,
  ): Promise<{ failures: string[]; wrote: boolean }> {
    const { driver } = this;
    const targets = new Map<Family, Written>();
    for (const family of families) {
      const target = this.target(call, family, desired);
      if (!target) return { failures: [], wrote: false };
      targets.set(family, target);
    }
    const stateOf = (family: Family) => targets.get(family)!.desired[family];
    const markOf = (family: Family) => targets.get(family)!.desired.masqueradeMark;
    this.epoch++;
    for (const family of families) this.programmed.delete(family);
    let wrote = false;
    const write = (family: Family): DriverOperation => ({
      kind: 'writeFamily',
      family,
      state: stateOf(family),
      masqueradeMark: markOf(family),
    });
    const record = (family: Family, applied: Applied) => {
      if (!applied.unchanged) wrote = true;
      const state = stateOf(family);
      const shape = shapeOf(state, markOf(family));
      this.programmed.set(family, {
        elements: new ElementStorage(state),
        shape,
        shapeKey: driver.shapeKey(shape),
        leftOut: applied.leftOut?.[family] ?? 0,
        room: driver.roomFor?.(state.entries.length) ?? Number.POSITIVE_INFINITY,
      });
      this.written.set(family, targets.get(family)!);
    };
    if (driver.capabilities.atomicWrites || families.length === 1) {
      try {
        const applied = await this.apply(families.map(write), { families });
        for (const family of families) record(family, applied);
        return { failures: [], wrote };
      } catch (err) {
        // One by one below, unless there is nothing else to try.
        if (families.length === 1 && !driver.capabilities.replacesFamilies) {
          return { failures: [`${driver.familyLabel(families[0]!)}: ${(err as Error).message}`], wrote: true };
        }
      }
    }
    const failures: string[] = [];
    for (const family of families) {
      try {
        let applied: Applied;
        try {
          applied = await this.apply([write(family)], { families: [family] });
        } catch (err) {
          if (!driver.capabilities.replacesFamilies) throw err;
          const replace: DriverOperation = {
            kind: 'replaceFamily',
            family,
            state: stateOf(family),
            masqueradeMark: markOf(family),
          };
          applied = await this.apply([replace], { families: [family] });
        }
        record(family, applied);
      } catch (err) {
        failures.push(`${driver.familyLabel(family)}: ${(err as Error).message}`);
      }
    }
    return { failures, wrote: wrote || failures.length > 0 };
  }

  /**
   * Reads the family back and repairs the shape and elements that differ from what was
   * programmed. Elements written by partial syncs while the read ran are left to the next
   * verification. Returns how many elements and parts of the shape were repaired.
   */
  private async verify(family: Family): Promise<number> {
    const epoch = this.epoch;
    const written = new Set<string>();
    this.writtenDuringRead.set(family, written);
    // What partial syncs write from now on is in `written` and left out below, so the elements
    // can be taken now.
    const programmed = this.programmed.get(family);
    if (!programmed) return 0;
    const snapshot = [...programmed.elements.values()];
    let read: ReadBack | undefined;
    try {
      read = await this.read(family, snapshot, programmed.shape);
    } catch (err) {
      this.writtenDuringRead.delete(family);
      throw err;
    }
    return this.exclusive(async () => {
      // Every partial sync that may have committed after the read has noted its keys by now.
      this.writtenDuringRead.delete(family);
      const now = this.programmed.get(family);
      if (epoch !== this.epoch || !now || read === undefined) return 0;
      const { remove, add } = repairs(read, written);
      const operations: DriverOperation[] = [];
      if (read.shapeDrift.length > 0) {
        // The entries programmed now, not the snapshot the read was compared with: a partial sync
        // may have written between the read and this turn, and a driver that repairs by writing
        // the family whole (iptables) would otherwise undo it.
        const entries = [...now.elements.values()];
        operations.push({ kind: 'repairShape', family, shape: now.shape, parts: read.shapeDrift, entries });
      }
      if (remove.length > 0 || add.length > 0) operations.push({ kind: 'elements', family, remove, add });
      const listedAt = read.generation;
      if (operations.length === 0) {
        if (listedAt !== undefined && (await this.driver.generation?.()) === listedAt)
          this.trustedAt.set(family, listedAt);
        return 0;
      }
      try {
        await this.apply(operations, listedAt !== undefined ? { families: [family], since: listedAt } : undefined);
      } catch (err) {
        this.programmed.delete(family);
        throw err;
      }
      return read.shapeDrift.length + remove.length + add.length;
    });
  }

  /**
   * The family read back: alongside our writes where the driver can, but a read that cannot
   * finish is skipped (undefined), up to MAX_SKIPPED_VERIFICATIONS times in a row, after which it
   * runs between our writes (changes wait for it, once).
   */
  private async read(family: Family, expected: readonly Entry[], shape: FamilyShape): Promise<ReadBack | undefined> {
    const skipped = this.skippedVerifications.get(family) ?? 0;
    if (this.driver.capabilities.readsAlongsideWrites && skipped < MAX_SKIPPED_VERIFICATIONS) {
      const read = await this.driver.readBack(family, expected, shape, 'alongside-writes');
      if (read === 'unfinished') {
        this.skippedVerifications.set(family, skipped + 1);
        return undefined;
      }
      if (read !== 'not-alongside') {
        this.skippedVerifications.delete(family);
        return read;
      }
    }
    this.skippedVerifications.delete(family);
    const read = await this.exclusive(() => this.driver.readBack(family, expected, shape, 'between-writes'));
    if (read === 'unfinished' || read === 'not-alongside') throw new Error(`${this.driver.label} could not read back`);
    return read;
  }
}

/** What to write so that the kernel holds the programmed elements again, the keys in `written` aside. */
function repairs(read: ReadBack, written: ReadonlySet<string>): { remove: KernelElement[]; add: Entry[] } {
  const foreign = new Map<string, KernelElement>();
  for (const k of read.foreign) foreign.set(entryKey(k), k);
  const remove: KernelElement[] = [];
  const add: Entry[] = [];
  for (const e of read.missing) {
    const key = entryKey(e);
    if (written.has(key)) continue;
    const kernel = foreign.get(key);
    foreign.delete(key);
    if (kernel && kernel.clusterIp === e.clusterIp && kernel.service === e.service) continue;
    if (kernel) remove.push(kernel);
    add.push(e);
  }
  for (const [key, kernel] of foreign) if (!written.has(key)) remove.push(kernel);
  return { remove, add };
}
