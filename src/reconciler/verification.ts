// A full sync's verification of one family: reads it back and repairs only what drifted from
// what was programmed (the shape's parts the driver names, elements missing or foreign).
//
// - The read runs alongside our writes where the driver can (another process): partial syncs go
//   on meanwhile, and the elements they write are left to the next verification.
// - A read that cannot finish (the nft command restarts its listing whenever the ruleset
//   changes) skips the verification, at most MAX_SKIPPED_VERIFICATIONS times in a row, after
//   which it runs between our writes (changes wait for it, once). That read has a time bound
//   too: when another process commits throughout it, the verification is skipped and said so
//   (SyncResult.unverified), and the count starts again, so our writes wait at most that bound
//   once every MAX_SKIPPED_VERIFICATIONS + 1 verifications.
// - A read alongside our writes that finds the shape changed while a partial sync committed is
//   taken again between our writes before anything is repaired: what a partial sync writes to
//   the shape (a Service's source-range chain) is not keyed by entry, so the read may have seen
//   that write half-way (before or after it, against a snapshot from the other side).
// - A repair is computed from the read, and written in the reconciler's order of writes; one
//   that finds the family written whole since the read began (the ledger's epoch moved) is void.

import {
  holdsEntry,
  type Applied,
  type Driver,
  type DriverOperation,
  type FamilyShape,
  type KernelElement,
  type ReadBack,
} from '../driver/driver.js';
import { entryKey, type Entry, type Family } from '../model/types.js';
import type { EntryDiff } from '../model/entry-diff.js';
import type { Exact, Ledger } from './ledger.js';

/** Verifications skipped in a row (the read could not finish) before one holds back our writes. */
export const MAX_SKIPPED_VERIFICATIONS = 10;

/** What a verification uses of the reconciler: its driver, its ledger, its order of writes. */
export interface VerifierHost {
  readonly driver: Driver;
  readonly ledger: Ledger;
  /** Runs `work` after every write asked for before it. */
  exclusive<T>(work: () => Promise<T>): Promise<T>;
  /** Has the driver apply `operations`, and notes in the ledger what they did. */
  apply(operations: DriverOperation[], exact?: Exact): Promise<Applied>;
}

export class Verifier {
  /** Keys written per family while a verification read was under way: not judged by it. */
  private readonly writtenDuringRead = new Map<Family, Set<string>>();
  private readonly skipped = new Map<Family, number>();
  /** Families whose last verification could not read back even between our writes (takeUnread). */
  private readonly unread = new Set<Family>();

  constructor(private readonly host: VerifierHost) {}

  /**
   * The families whose verification, since the last call, could not read the kernel back even
   * between our writes (another process committed throughout every listing).
   */
  takeUnread(): Family[] {
    const families = [...this.unread];
    this.unread.clear();
    return families;
  }

  /** Element changes a partial sync or resync wrote: a read under way does not judge them. */
  noteWritten(family: Family, changes: Pick<EntryDiff, 'removed' | 'added'>): void {
    const written = this.writtenDuringRead.get(family);
    if (!written) return;
    for (const e of changes.removed) written.add(entryKey(e));
    for (const e of changes.added) written.add(entryKey(e));
  }

  /**
   * Reads the family back and repairs the shape and elements that differ from what was
   * programmed. Elements written by partial syncs while the read ran are left to the next
   * verification. Returns how many elements and parts of the shape were repaired.
   */
  async verify(family: Family): Promise<number> {
    const { ledger, driver } = this.host;
    const epoch = ledger.epoch;
    const written = new Set<string>();
    this.writtenDuringRead.set(family, written);
    // What partial syncs write from now on is in `written` and left out below, so the elements
    // can be taken now.
    const programmed = ledger.programmed.get(family);
    if (!programmed) return 0;
    const snapshot = [...programmed.elements.values()];
    let taken: { read: ReadBack; alongside: boolean } | undefined;
    try {
      taken = await this.read(family, snapshot, programmed.shape);
    } catch (err) {
      this.writtenDuringRead.delete(family);
      throw err;
    }
    return this.host.exclusive(async () => {
      // Every partial sync that may have committed after the read has noted its keys by now.
      this.writtenDuringRead.delete(family);
      const now = ledger.programmed.get(family);
      if (epoch !== ledger.epoch || !now || taken === undefined) return 0;
      let { read } = taken;
      let leftOut: ReadonlySet<string> = written;
      if (taken.alongside && read.shapeDrift.length > 0 && written.size > 0) {
        // A partial sync committed while the read ran, and parts of the shape differ: that write
        // may be what the read saw (a Service's source-range chain, say), and the shape is not
        // keyed by entry. Read again now, between our writes, before repairing anything.
        const again = await this.readBetweenWrites(family, [...now.elements.values()], now.shape);
        if (again === undefined) return 0;
        read = again;
        leftOut = new Set();
      }
      const { remove, add } = repairs(read, leftOut);
      const operations: DriverOperation[] = [];
      if (read.shapeDrift.length > 0) {
        // The entries programmed now, not the snapshot the read was compared with: a partial sync
        // may have written between the read and this turn, and a driver that repairs by writing
        // the family whole (iptables) would otherwise undo it.
        const entries = [...now.elements.values()];
        operations.push({
          kind: 'repairShape',
          family,
          shape: now.shape,
          parts: read.shapeDrift,
          entries,
          annex: now.annex,
        });
      }
      if (remove.length > 0 || add.length > 0) {
        const { rangedByService } = ledger.written.get(family)?.desired[family] ?? {};
        operations.push({ kind: 'elements', family, remove, add, rangedByService, annex: now.annex });
      }
      const listedAt = read.generation;
      if (operations.length === 0) {
        if (listedAt !== undefined && (await driver.generation()) === listedAt) ledger.trust(family, listedAt);
        return 0;
      }
      try {
        await this.host.apply(operations, listedAt !== undefined ? { families: [family], since: listedAt } : undefined);
      } catch (err) {
        ledger.programmed.delete(family);
        throw err;
      }
      return read.shapeDrift.length + remove.length + add.length;
    });
  }

  /**
   * The family read back: alongside our writes where the driver can, but a read that cannot
   * finish is skipped (undefined), up to MAX_SKIPPED_VERIFICATIONS times in a row, after which it
   * runs between our writes.
   */
  private async read(
    family: Family,
    expected: readonly Entry[],
    shape: FamilyShape,
  ): Promise<{ read: ReadBack; alongside: boolean } | undefined> {
    const { driver } = this.host;
    const skipped = this.skipped.get(family) ?? 0;
    if (skipped < MAX_SKIPPED_VERIFICATIONS) {
      const read = await driver.readBack(family, expected, shape, 'alongside-writes');
      if (read === 'unfinished') {
        this.skipped.set(family, skipped + 1);
        return undefined;
      }
      if (read !== 'not-alongside') {
        this.skipped.delete(family);
        return { read, alongside: true };
      }
    }
    this.skipped.delete(family);
    const read = await this.host.exclusive(() => this.readBetweenWrites(family, expected, shape));
    return read && { read, alongside: false };
  }

  /**
   * The family read back while none of our writes runs (the caller holds the order of writes).
   * Undefined when another process committed all the while the read's time bound allowed: the
   * verification is skipped, noted in `unread`, and the next full sync tries again.
   */
  private async readBetweenWrites(
    family: Family,
    expected: readonly Entry[],
    shape: FamilyShape,
  ): Promise<ReadBack | undefined> {
    const { driver } = this.host;
    const read = await driver.readBack(family, expected, shape, 'between-writes');
    if (read === 'unfinished') {
      this.unread.add(family);
      return undefined;
    }
    if (read === 'not-alongside') throw new Error(`${driver.label} could not read back`);
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
    if (kernel && holdsEntry(kernel, e)) continue;
    if (kernel) remove.push(kernel);
    add.push(e);
  }
  for (const [key, kernel] of foreign) if (!written.has(key)) remove.push(kernel);
  return { remove, add };
}
