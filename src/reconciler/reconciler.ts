// The one owner of what the kernel holds of ours, whatever the backend. It decides what a sync
// writes, has its driver (src/driver/driver.ts) write it, and tells its subscribers (conntrack
// clean-up) what changed; the composition root (src/cli/) gives it both. What it knows the kernel
// holds is its ledger (ledger.ts), a full sync's read back and repair its verification
// (verification.ts), what it tells subscribers its publication (publication.ts).
//
// - A family nothing is known of, or whose shape changed, is written whole; both families in one
//   write where the driver's writes are atomic, else one by one, the last resort a replacement.
// - Between full syncs only the elements that changed are written. A failed partial write falls
//   back to a whole write of the family ('partial-failed').
// - A periodic full sync writes the shape again with the element changes (never touching other
//   elements), then verifies: reads the family back, and repairs only what drifted.
// - Where the driver reads the ruleset generation around each commit, a resync of a family nobody
//   else touched since it was last exact writes only the element changes and reads nothing back.
// - Writes run one at a time, in the order they were asked for: a partial sync may run while a
//   full sync verifies.
// - Every write carries the model's generation of the state it was asked for, and never takes a
//   family back: a write whose family already holds a newer state writes that state instead (a
//   full sync still repairs, toward the newer state). A removal of our objects (cleanup, stepping
//   aside) voids every write asked for before it that has not run yet.
// - What the kernel holds is recorded as each write commits, and subscribers are told in the
//   order of the writes, each change starting where the one before ended: a sync that ends after
//   a newer one never tells them of its older state.

import { FAMILIES, entryCount, withoutEntries as emptied, type DesiredState, type Family } from '../model/types.js';
import {
  BackendError,
  type Applied,
  type Driver,
  type DriverCapabilities,
  type DriverOperation,
  type EntryCapacity,
} from '../driver/driver.js';
import type { KernelSubscriber } from '../driver/kernel-change.js';
import { isEmpty } from '../model/entry-diff.js';
import { Ledger, shapeOf, type Exact, type Written } from './ledger.js';
import { Publication } from './publication.js';
import type { FallbackReason, SyncOptions, SyncResult } from './sync-result.js';
import { Verifier } from './verification.js';

/** Elements written by partial syncs after which freed memory is handed back at once. */
const RELEASE_AFTER_ELEMENTS = 5000;

/** A sync or removal as asked for. */
interface Call {
  /** The generation of its state (DesiredState.generation). */
  generation: number;
  /** Removals asked for before it: one asked for since voids its writes. */
  removals: number;
}

/** The same state with nothing programmed: what the kernel holds once our objects are removed. */
function withoutEntries(state: DesiredState): DesiredState {
  // Without `changes`: they describe the model's step, not this state's difference from the last.
  return { ...state, ipv4: emptied(state.ipv4), ipv6: emptied(state.ipv6) };
}

export class Reconciler {
  private readonly ledger: Ledger;
  private readonly verifier: Verifier;
  private readonly publication: Publication;
  /** Writes run one at a time, in the order they were asked for. */
  private queue: Promise<unknown> = Promise.resolve();
  private writtenSinceRelease = 0;
  /** Removals of our objects asked for so far. */
  private removals = 0;
  /** The newest generation asked for: a state without one counts as that new. */
  private newestGeneration = 0;
  /** Resyncs answered by the generation alone, without reading back (the tests read it). */
  verificationsSkipped = 0;

  /** `subscribers` are told of every change of what the kernel holds, in order. */
  constructor(
    readonly driver: Driver,
    subscribers: readonly KernelSubscriber[] = [],
  ) {
    this.ledger = new Ledger(driver);
    this.publication = new Publication(subscribers, driver, (family) => this.ledger.entries(family));
    this.verifier = new Verifier({
      driver,
      ledger: this.ledger,
      exclusive: (work) => this.exclusive(work),
      apply: (operations, exact) => this.apply(operations, exact),
    });
  }

  get name() {
    return this.driver.name;
  }

  get capacity(): EntryCapacity {
    return this.driver.capacity;
  }

  get capabilities(): DriverCapabilities {
    return this.driver.capabilities;
  }

  /** Makes the kernel hold `desired`. */
  async sync(desired: DesiredState, options: SyncOptions): Promise<SyncResult> {
    const { driver, ledger } = this;
    const call = this.call(desired);
    await driver.prepare(desired, options.full);
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
      const before = ledger.programmed.get(family);
      if (!before) fallBack(family, 'not-programmed');
      else if (
        before.shapeKey !== driver.shapeKey(shapeOf(desired[family], mark)) ||
        entryCount(desired[family]) > before.room
      ) {
        fallBack(family, 'table-shape-changed');
      } else if (options.full) {
        resync.push(family);
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
      for (const failure of written.failures) failures.push(failure);
      modes.push(written.wrote ? 'full' : 'noop');
    }
    let repaired = 0;
    for (const family of verify) {
      try {
        repaired += await this.verifier.verify(family);
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
    if (!superseded) await this.publication.publish(ledger.holding(), ledger.takeUntold());
    const result: SyncResult = {
      mode: superseded ? 'noop' : modes.includes('full') ? 'full' : modes.includes('partial') ? 'partial' : 'noop',
      entries: { ipv4: ledger.count('ipv4'), ipv6: ledger.count('ipv6') },
      rejected: ledger.rejections(),
    };
    if (superseded) result.superseded = true;
    if (fallbackReason) result.fallbackReason = fallbackReason;
    if (repaired > 0) result.repairedElements = repaired;
    const unverified = this.verifier.takeUnread();
    if (unverified.length > 0) result.unverified = unverified;
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
    this.ledger.forget();
    let told: Promise<void> | undefined;
    try {
      await this.exclusive(async () => {
        // A write that was under way when the removal was asked for may have recorded itself.
        this.ledger.forget();
        await this.driver.apply([{ kind: 'removeAll' }]);
        // In the order of the writes: before any write that comes after the removal.
        const held = basis ?? this.publication.held;
        if (held) told = this.publication.publish(withoutEntries(held), 'whole');
      });
    } catch (err) {
      if (err instanceof BackendError) throw err;
      throw new BackendError(`${this.driver.label} cleanup failed: ${(err as Error).message}`, this.driver.name);
    }
    await told;
  }

  async releaseMemory(): Promise<void> {
    await this.driver.releaseMemory();
  }

  /** Releases the driver's resources; the kernel keeps what it holds. */
  async close(): Promise<void> {
    await this.driver.close();
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
    const written = this.ledger.written.get(family);
    return written && written.generation > call.generation ? written : { generation: call.generation, desired };
  }

  /** Runs `work` after every write asked for before it. */
  private exclusive<T>(work: () => Promise<T>): Promise<T> {
    const run = this.queue.then(work, work);
    this.queue = run.catch(() => undefined);
    return run;
  }

  /**
   * Has the driver apply `operations`, and notes in the ledger what they did. `exact`: families
   * the write leaves exactly as programmed whatever they held before (a whole write), or, with
   * `since`, provided the ruleset was at that generation just before (a repair computed from a
   * read taken there).
   */
  private async apply(operations: DriverOperation[], exact: Exact = { families: [] }): Promise<Applied> {
    if (operations.length === 0) return { unchanged: true };
    let applied: Applied;
    try {
      applied = await this.driver.apply(operations);
    } catch (err) {
      this.ledger.distrust();
      throw err;
    }
    this.ledger.noteApplied(applied, exact);
    return applied;
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
    const before = this.ledger.programmed.get(family);
    if (!before) return undefined;
    const changes = before.elements.changesTo(target.desired[family]);
    let wrote = !isEmpty(changes);
    if (wrote) {
      try {
        const { rangedByService } = target.desired[family];
        const { removed: remove, added: add } = changes;
        const applied = await this.apply([
          { kind: 'elements', family, remove, add, rangedByService, annex: before.annex },
        ]);
        const leftOut = applied.leftOut?.[family];
        if (leftOut !== undefined) before.leftOut = leftOut;
        // The driver's elements may hold less than an entry (no Service name): nothing to write.
        if (applied.unchanged) wrote = false;
      } catch {
        this.ledger.programmed.delete(family);
        return undefined;
      }
      this.verifier.noteWritten(family, changes);
      this.writtenSinceRelease += changes.removed.length + changes.added.length;
    }
    this.ledger.commit(family, before, target, changes);
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
    const before = this.ledger.programmed.get(family);
    if (!before) return false;
    const state = target.desired[family];
    const mark = target.desired.masqueradeMark;
    const changes = before.elements.changesTo(state);
    const untouched = await this.ledger.untouched(family);
    const { removed: remove, added: add } = changes;
    const { annex } = before;
    const operations: DriverOperation[] = untouched
      ? isEmpty(changes)
        ? []
        : [{ kind: 'elements', family, remove, add, rangedByService: state.rangedByService, annex }]
      : [{ kind: 'writeShape', family, shape: shapeOf(state, mark), remove, add, annex }];
    try {
      await this.apply(operations);
    } catch {
      this.ledger.programmed.delete(family);
      return false;
    }
    this.verifier.noteWritten(family, changes);
    this.ledger.commit(family, before, target, changes);
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
    const { driver, ledger } = this;
    const targets = new Map<Family, Written>();
    for (const family of families) {
      const target = this.target(call, family, desired);
      if (!target) return { failures: [], wrote: false };
      targets.set(family, target);
    }
    const targetOf = (family: Family) => targets.get(family)!;
    // The driver's annex of each family's last write, while it is known (a shape change), for the write that replaces it.
    const annexes = new Map(families.map((family) => [family, ledger.programmed.get(family)?.annex]));
    ledger.unprogram(families);
    let wrote = false;
    const write = (kind: 'writeFamily' | 'replaceFamily', family: Family): DriverOperation => {
      const { desired: target } = targetOf(family);
      const op = { family, state: target[family], masqueradeMark: target.masqueradeMark };
      return kind === 'writeFamily' ? { kind, ...op, annex: annexes.get(family) } : { kind, ...op };
    };
    const record = (family: Family, applied: Applied) => {
      if (!applied.unchanged) wrote = true;
      ledger.recordWhole(family, targetOf(family), applied);
    };
    if (driver.capabilities.transactional || families.length === 1) {
      try {
        const applied = await this.apply(
          families.map((family) => write('writeFamily', family)),
          { families },
        );
        for (const family of families) record(family, applied);
        return { failures: [], wrote };
      } catch (err) {
        // One by one below, unless there is nothing else to try.
        if (families.length === 1 && !driver.capabilities.transactional) {
          return { failures: [`${driver.familyLabel(families[0]!)}: ${(err as Error).message}`], wrote: true };
        }
      }
    }
    const failures: string[] = [];
    for (const family of families) {
      try {
        let applied: Applied;
        try {
          applied = await this.apply([write('writeFamily', family)], { families: [family] });
        } catch (err) {
          if (!driver.capabilities.transactional) throw err;
          applied = await this.apply([write('replaceFamily', family)], { families: [family] });
        }
        record(family, applied);
      } catch (err) {
        failures.push(`${driver.familyLabel(family)}: ${(err as Error).message}`);
      }
    }
    return { failures, wrote: wrote || failures.length > 0 };
  }
}
