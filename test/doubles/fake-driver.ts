// A driver without a kernel: it keeps what each family holds (the shape's key and the elements)
// and applies typed operations to it as the nft driver's kernel would: atomically, failing on a
// family that is not there, on an element removed that is not there or added again with another
// value. Tests change `kernel` directly to play another writer, `refuse` to make writes fail,
// `hold` to make a write wait, `rejects` to have entries left out as a driver that refuses a
// value does, and call `bypass` to play a window in which our translations were passed by.

import {
  holdsEntry,
  podMatchShapeKey,
  type Applied,
  type BackendName,
  type Driver,
  type DriverCapabilities,
  type DriverOperation,
  type FamilyShape,
  type KernelElement,
  type ProbeResult,
  type ReadBack,
  type TranslatedConnections,
  type Rejection,
} from '../../src/driver/driver.js';
import { entryKey, withoutEntries, type DesiredState, type Entry, type Family } from '../../src/model/types.js';

type ReadBackAnswer = ReadBack | 'unfinished' | 'not-alongside';

export interface FakeFamily {
  shape: string;
  elements: Map<string, KernelElement>;
}

/** What each backend's driver declares (src/backends/): the fake named after one declares the same. */
const FAKE_CAPABILITIES: Record<BackendName, DriverCapabilities> = {
  nft: { transactional: true, translates: 'packets', filtersSources: true },
  iptables: { transactional: false, translates: 'packets', filtersSources: true },
  ebpf: { transactional: false, translates: 'sockets', filtersSources: false },
};

export class FakeDriver implements Driver {
  readonly label: string;
  readonly capacity = { defaultEntries: 1000, why: 'a fake' };
  readonly capabilities: DriverCapabilities;
  /** What the kernel holds of ours, per family; absent: nothing. */
  kernel = new Map<Family, FakeFamily>();
  /** Every apply() asked for, refused or not, oldest first. */
  readonly applied: Array<readonly DriverOperation[]> = [];
  /** Makes matching writes fail, with this message. */
  refuse: ((operations: readonly DriverOperation[]) => string | undefined) | undefined;
  /** Called as each write starts: the write waits for what it returns (a slow write). */
  hold: ((operations: readonly DriverOperation[]) => Promise<void> | undefined) | undefined;
  /** Entries it refuses to program, with the reason: left out, the rest written. */
  rejects: ((entry: Entry) => string | undefined) | undefined;
  /** Per family, the entries left out by key. */
  private readonly leftOut = new Map<Family, Map<string, Rejection>>();
  /** What the kernel held after each write, oldest first (`held()` per family). */
  readonly history: Array<Record<Family, string[]>> = [];
  /**
   * Keeps a ruleset generation, moved by each write, as nft's: a resync of a family nobody else
   * touched writes only its changes and reads nothing back. Off: no generation is known.
   */
  keepsGeneration = false;
  private ruleset = 0;
  reads = 0;
  /** Called as each read back starts (to play a write that comes meanwhile). */
  duringRead: (() => void) | undefined;
  /**
   * Writes as the iptables driver does: a writeShape writes only its element changes (the chains
   * are not written again), and a repairShape writes the family whole with the operation's entries.
   */
  writesLikeIptables = false;
  /**
   * Off: elements hold no Service name, and a write that leaves the kernel as it was says so
   * (`unchanged`), as the eBPF driver's maps do.
   */
  keepsComments = true;
  /** Changes what a read back returns (to play a driver's listing, or one that cannot finish). */
  alterRead:
    ((read: ReadBack, how: 'alongside-writes' | 'between-writes', family: Family) => ReadBackAnswer) | undefined;
  /** Played before each sync (the eBPF driver checks limits and attaches its programs). */
  preparing: ((desired: DesiredState, full: boolean) => Promise<void>) | undefined;
  /** Played when memory is handed back (which may fail). */
  releasing: (() => Promise<void>) | undefined;
  /** Played when the driver is closed. */
  closing: (() => Promise<void>) | undefined;
  /** Reads back alongside our writes (as nft's and iptables' commands do); else answers 'not-alongside'. */
  readonly readsAlongsideWrites: boolean;
  private readonly bypassListeners: Array<(family: Family) => void> = [];

  /** A driver with the capabilities of the backend it is named after, but those given. */
  constructor(
    readonly name: BackendName = 'nft',
    options: Partial<DriverCapabilities> & { readsAlongsideWrites?: boolean } = {},
  ) {
    this.label = name;
    const { readsAlongsideWrites = false, ...capabilities } = options;
    this.readsAlongsideWrites = readsAlongsideWrites;
    this.capabilities = { ...FAKE_CAPABILITIES[name], ...capabilities };
  }

  prepare(desired: DesiredState, full: boolean): Promise<void> {
    return this.preparing?.(desired, full) ?? Promise.resolve();
  }

  releaseMemory(): Promise<void> {
    return this.releasing?.() ?? Promise.resolve();
  }

  close(): Promise<void> {
    return this.closing?.() ?? Promise.resolve();
  }

  roomFor(): number {
    return Number.POSITIVE_INFINITY;
  }

  async hasState(): Promise<boolean> {
    return this.kernel.size > 0;
  }

  async translatedConnections(): Promise<TranslatedConnections[]> {
    return [];
  }

  familyLabel(family: Family): string {
    return family;
  }

  shapeKey(shape: FamilyShape): string {
    return podMatchShapeKey(shape);
  }

  async probe(): Promise<ProbeResult> {
    return { ok: true, detail: 'a fake driver' };
  }

  watchBypasses(listener: (family: Family) => void): void {
    this.bypassListeners.push(listener);
  }

  /** Plays a window in which new connections passed the family's translations by (iptables: a jump displaced). */
  bypass(family: Family): void {
    for (const listener of this.bypassListeners) listener(family);
  }

  /** The entries of a family as `externalIp proto port -> clusterIp`, sorted. */
  held(family: Family): string[] {
    return [...(this.kernel.get(family)?.elements.values() ?? [])]
      .map((e) => `${e.externalIp} ${e.protocol} ${e.port} -> ${e.clusterIp}`)
      .sort();
  }

  /** What the kernel holds now, as `held()` per family. */
  holding(): Record<Family, string[]> {
    return { ipv4: this.held('ipv4'), ipv6: this.held('ipv6') };
  }

  async generation(): Promise<number | undefined> {
    return this.keepsGeneration ? this.ruleset : undefined;
  }

  async apply(operations: readonly DriverOperation[]): Promise<Applied> {
    this.applied.push(operations);
    await this.hold?.(operations);
    const refusal = this.refuse?.(operations);
    if (refusal !== undefined) throw new Error(refusal);
    const before = this.ruleset++;
    const kernel = new Map([...this.kernel].map(([f, t]) => [f, { ...t, elements: new Map(t.elements) }]));
    const leftOut = new Map([...this.leftOut].map(([f, r]) => [f, new Map(r)]));
    const applied: Applied = { rejected: {}, leftOut: {} };
    for (let op of operations) {
      if (op.kind === 'removeAll') leftOut.clear();
      else op = this.leaveOut(op, leftOut);
      for (const family of op.kind === 'removeAll' ? (['ipv4', 'ipv6'] as const) : [op.family]) {
        applied.rejected![family] = [...(leftOut.get(family)?.values() ?? [])];
        // What it left out after every write, element changes too (it keeps count).
        if (op.kind !== 'removeAll') applied.leftOut![family] = leftOut.get(family)?.size ?? 0;
      }
      if (op.kind === 'repairShape' && this.writesLikeIptables) {
        const state = { entries: [...op.entries], localPodMatch: op.shape.state.localPodMatch };
        this.applyOne(kernel, {
          kind: 'writeFamily',
          family: op.family,
          state,
          masqueradeMark: op.shape.masqueradeMark,
        });
      } else if (op.kind === 'writeShape' && this.writesLikeIptables) {
        this.applyOne(kernel, {
          kind: 'elements',
          family: op.family,
          remove: op.remove,
          add: op.add,
          rangedByService: undefined,
        });
      } else this.applyOne(kernel, op);
    }
    if (!this.keepsComments && snapshot(kernel) === snapshot(this.kernel)) applied.unchanged = true;
    this.kernel = kernel;
    this.leftOut.clear();
    for (const [f, r] of leftOut) this.leftOut.set(f, r);
    this.history.push(this.holding());
    if (this.keepsGeneration) applied.generations = { before, after: this.ruleset };
    return applied;
  }

  /** The operation without the entries `rejects` refuses, noted in `leftOut` (removals of them dropped). */
  private leaveOut(
    op: Exclude<DriverOperation, { kind: 'removeAll' }>,
    leftOut: Map<Family, Map<string, Rejection>>,
  ): Exclude<DriverOperation, { kind: 'removeAll' }> {
    const refused = leftOut.get(op.family) ?? new Map<string, Rejection>();
    leftOut.set(op.family, refused);
    const keep = (e: Entry): boolean => {
      const reason = this.rejects?.(e);
      if (reason === undefined) {
        refused.delete(entryKey(e));
        return true;
      }
      refused.set(entryKey(e), {
        family: e.family,
        item: `${e.service} ${e.externalIp} ${e.protocol}/${e.port}`,
        reason,
      });
      return false;
    };
    if (op.kind === 'writeFamily' || op.kind === 'replaceFamily') {
      refused.clear();
      return { ...op, state: { ...withoutEntries(op.state), entries: op.state.entries.filter(keep) } };
    }
    if (op.kind === 'repairShape') return op;
    // Removed entries that were left out have nothing in the kernel to remove.
    const remove = op.remove.filter((e) => !refused.delete(entryKey(e)));
    return { ...op, remove, add: op.add.filter(keep) };
  }

  async readBack(
    family: Family,
    expected: readonly Entry[],
    shape: FamilyShape,
    how: 'alongside-writes' | 'between-writes',
  ): Promise<ReadBackAnswer> {
    if (how === 'alongside-writes' && !this.readsAlongsideWrites) return 'not-alongside';
    this.reads++;
    this.duringRead?.();
    const held = this.kernel.get(family);
    if (!held) throw new Error('the table is missing');
    const foreign = new Map(held.elements);
    const missing: Entry[] = [];
    const leftOut = this.leftOut.get(family);
    for (const e of expected) {
      if (leftOut?.has(entryKey(e))) continue;
      const k = foreign.get(entryKey(e));
      if (k && holdsEntry(k, this.element(e))) foreign.delete(entryKey(e));
      else missing.push(e);
    }
    const read: ReadBack = {
      missing,
      foreign: [...foreign.values()],
      shapeDrift: held.shape === podMatchShapeKey(shape) ? [] : ['rules'],
    };
    return this.alterRead ? this.alterRead(read, how, family) : read;
  }

  /** An entry's element as this kernel keeps it. */
  private element(e: KernelElement): Entry {
    const { family, externalIp, protocol, port, clusterIp, service } = e;
    const kept = this.keepsComments && service !== undefined;
    return { family, externalIp, protocol, port, clusterIp, ...(kept ? { service } : {}) } as Entry;
  }

  private applyOne(kernel: Map<Family, FakeFamily>, op: DriverOperation): void {
    if (op.kind === 'removeAll') {
      kernel.clear();
      return;
    }
    if (op.kind === 'writeFamily' || op.kind === 'replaceFamily') {
      const shape = podMatchShapeKey({ state: op.state, masqueradeMark: op.masqueradeMark });
      const elements = new Map(op.state.entries.map((e) => [entryKey(e), this.element(e)]));
      kernel.set(op.family, { shape, elements });
      return;
    }
    const held = kernel.get(op.family);
    if (!held) throw new Error('No such file or directory');
    if (op.kind === 'writeShape' || op.kind === 'repairShape') held.shape = podMatchShapeKey(op.shape);
    if (op.kind === 'repairShape') return;
    for (const e of op.remove) {
      if (!held.elements.delete(entryKey(e))) throw new Error('No such file or directory');
    }
    for (const e of op.add) {
      const old = held.elements.get(entryKey(e));
      if (old && old.clusterIp !== e.clusterIp) throw new Error('Device or resource busy');
      held.elements.set(entryKey(e), this.element(e));
    }
  }
}

/** What a kernel holds, as one string: the same string, the same kernel. */
function snapshot(kernel: Map<Family, FakeFamily>): string {
  const families = [...kernel].sort(([a], [b]) => a.localeCompare(b));
  return JSON.stringify(
    families.map(([f, t]) => [f, t.shape, [...t.elements.values()].map((e) => JSON.stringify(e)).sort()]),
  );
}
