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
  /** What the kernel holds of ours after the last successful sync or removal (undefined: not known). */
  private held: DesiredState | undefined;
  private readonly subscribers: KernelSubscriber[] = [];
  /** Resyncs answered by the generation alone, without reading back (the tests read it). */
  verificationsSkipped = 0;

  constructor(readonly driver: Driver) {}

  get name() {
    return this.driver.name;
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
        const changes = before.elements.changesTo(desired[family]);
        if (!isEmpty(changes)) rewrite.push(family);
        else {
          before.elements.commit(desired[family], changes);
          modes.push('noop');
        }
      } else {
        const mode = await this.exclusive(() => this.writeChangedElements(family, desired[family]));
        if (mode) modes.push(mode);
        else fallBack(family, 'partial-failed');
      }
    }
    const verify: Family[] = [];
    for (const family of resync) {
      const outcome = await this.exclusive(() => this.resync(family, desired[family], mark));
      if (outcome === 'verify') verify.push(family);
      else if (outcome === 'untouched') modes.push('full');
      else rewrite.push(family);
    }
    if (rewrite.length > 0) {
      const written = await this.exclusive(() => this.writeWhole(rewrite, desired));
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
    if (failures.length > 0) throw new BackendError(`${driver.label} sync failed: ${failures.join('; ')}`, driver.name);
    options.onWritten?.();
    await this.publish(desired);
    const result: SyncResult = {
      mode: modes.includes('full') ? 'full' : modes.includes('partial') ? 'partial' : 'noop',
      entries: { ipv4: this.programmedCount(desired, 'ipv4'), ipv6: this.programmedCount(desired, 'ipv6') },
    };
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
    this.programmed.clear();
    this.trustedAt.clear();
    this.epoch++;
    try {
      await this.exclusive(() => this.driver.apply([{ kind: 'removeAll' }]));
    } catch (err) {
      if (err instanceof BackendError) throw err;
      throw new BackendError(`${this.driver.label} cleanup failed: ${(err as Error).message}`, this.driver.name);
    }
    const held = basis ?? this.held;
    if (held) await this.publish(withoutEntries(held));
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

  private programmedCount(desired: DesiredState, family: Family): number {
    return desired[family].entries.length - (this.programmed.get(family)?.leftOut ?? 0);
  }

  private async publish(next: DesiredState): Promise<void> {
    const previous = this.held;
    this.held = next;
    for (const s of this.subscribers) await s.kernelChanged({ previous, next });
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
  private async writeChangedElements(family: Family, state: FamilyState): Promise<'partial' | 'noop' | undefined> {
    const before = this.programmed.get(family);
    if (!before) return undefined;
    const changes = before.elements.changesTo(state);
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
    before.elements.commit(state, changes);
    return wrote ? 'partial' : 'noop';
  }

  /**
   * The periodic resync of one family whose shape is unchanged. When nobody else has committed
   * since the kernel last held exactly what was programmed, only the element changes are written
   * ('untouched'). Otherwise the shape is written again with those changes, and the family is
   * verified afterwards ('verify'). False when the kernel refused it.
   */
  private async resync(family: Family, state: FamilyState, mark: number): Promise<'verify' | 'untouched' | false> {
    const before = this.programmed.get(family);
    if (!before) return false;
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
    before.elements.commit(state, changes);
    if (!untouched) return 'verify';
    this.verificationsSkipped++;
    return 'untouched';
  }

  /**
   * Writes `families` whole: in one write where the driver's writes are atomic, else (or when
   * that fails) one by one, so that one family's problem neither blocks the other nor goes
   * unreported; a family whose objects were changed so that they cannot be declared again is
   * replaced. Returns the failures.
   */
  private async writeWhole(families: Family[], desired: DesiredState): Promise<{ failures: string[]; wrote: boolean }> {
    const { driver } = this;
    this.epoch++;
    for (const family of families) this.programmed.delete(family);
    const mark = desired.masqueradeMark;
    let wrote = false;
    const write = (family: Family): DriverOperation => ({
      kind: 'writeFamily',
      family,
      state: desired[family],
      masqueradeMark: mark,
    });
    const record = (family: Family, applied: Applied) => {
      if (!applied.unchanged) wrote = true;
      const shape = shapeOf(desired[family], mark);
      this.programmed.set(family, {
        elements: new ElementStorage(desired[family]),
        shape,
        shapeKey: driver.shapeKey(shape),
        leftOut: applied.leftOut?.[family] ?? 0,
        room: driver.roomFor?.(desired[family].entries.length) ?? Number.POSITIVE_INFINITY,
      });
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
            state: desired[family],
            masqueradeMark: mark,
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
