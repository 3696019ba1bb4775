// What the reconciler asks of a backend's driver, and what the controller, the registry and the
// sync runner see of a backend. A driver knows how to write its kind of kernel objects and how
// to read them back; the reconciler (reconciler.ts) decides what to write and when.

import type { DesiredState, Entry, EntryKeyFields, Family, FamilyState } from '../model/types.js';

export type BackendName = 'nft' | 'iptables' | 'ebpf';

export interface ProbeResult {
  ok: boolean;
  /** One line a user can act on when !ok; a short description of what was found when ok. */
  detail: string;
  /** nft: how the rules look keys up on this kernel (nft/render.ts, KeyLookup). */
  nftKeyLookup?: 'map' | 'set';
}

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
  /** What the driver left out of the kernel (a value it refuses), every family, as held after the sync. */
  rejected?: Rejection[];
  /**
   * A removal of our objects (cleanup, stepping aside) was asked for after this sync: what it
   * would have written was left out or removed, and nothing of it is held.
   */
  superseded?: true;
}

/** An entry or a part of the shape a driver left out because it refuses a value; the rest is programmed. */
export interface Rejection {
  family: Family;
  /** What was left out, for logs (`default/svc 192.0.2.1 tcp/80`, `pod bridge interface`). */
  item: string;
  reason: string;
}

/** How many entries per family a backend is given: a default, and what it can hold at all. */
export interface EntryCapacity {
  /** Without --max-entries. */
  defaultEntries: number;
  /** The most it can hold (a map's fixed size); --max-entries above it is lowered to it. */
  maxEntries?: number;
  /** Why, in a few words, for logs and docs. */
  why: string;
}

/** Entries per family a backend is given: --max-entries, or its default, never above what it holds. */
export function entryLimit(capacity: EntryCapacity, maxEntriesFlag: number | undefined): number {
  return Math.min(maxEntriesFlag ?? capacity.defaultEntries, capacity.maxEntries ?? Number.POSITIVE_INFINITY);
}

/** What a driver declares of itself; the reconciler and the controller read nothing else. */
export interface DriverCapabilities {
  /**
   * Its writes go through the reconciler's queue in order, and a verification reads without
   * holding them back: a partial sync may run while a full sync is under way.
   */
  ordersOwnWrites: boolean;
  /** Its translations are NAT decisions that conntrack keeps: stale flows must be deleted. */
  conntrackMatters: boolean;
  /** It reads the ruleset generation around each commit (apply's `generations`, generation()). */
  hasGeneration: boolean;
  /** One apply() of several families is one transaction: all of it happens or none. */
  atomicWrites: boolean;
  /** replaceFamily is a last resort distinct from writeFamily (the table is removed and written anew). */
  replacesFamilies: boolean;
  /** readBack(..., 'alongside-writes') may be tried: it reads in another process. */
  readsAlongsideWrites: boolean;
  /** It writes element changes alone; otherwise a change writes its family whole. */
  writesElements: boolean;
  /** A full sync writes the shape again and reads back; otherwise it writes each family whole. */
  readsBack: boolean;
  /** It translates an entry only for the sources of its sourceRanges; otherwise the model leaves those out. */
  filtersSources: boolean;
}

/** The part of a family's state that is not its entries: what a partial sync cannot change. */
export interface FamilyShape {
  /** The family's state with its entries left out. */
  state: FamilyState;
  masqueradeMark: number;
}

/** A map element read back from the kernel, or one of ours to remove. */
export interface KernelElement extends EntryKeyFields {
  clusterIp: string;
  /** The comment naming the Service, where the kernel keeps one. */
  service?: string;
  /** How the driver removes exactly this element (its bytes or its listed form), when it must. */
  ref?: unknown;
}

/** One typed write. A driver applies a list of them in order (atomically when atomicWrites). */
export type DriverOperation =
  /** Everything of the family: the shape and exactly `state.entries`, whatever the kernel held. */
  | { kind: 'writeFamily'; family: Family; state: FamilyState; masqueradeMark: number }
  /** The shape again (never touching other elements), with these element changes. */
  | { kind: 'writeShape'; family: Family; shape: FamilyShape; remove: readonly KernelElement[]; add: readonly Entry[] }
  /** Element changes only: removals, then additions (a driver without transactions adds first). */
  | { kind: 'elements'; family: Family; remove: readonly KernelElement[]; add: readonly Entry[] }
  /** Parts of the shape (as readBack named them) written again; `entries` are those programmed. */
  | { kind: 'repairShape'; family: Family; shape: FamilyShape; parts: readonly string[]; entries: readonly Entry[] }
  /** The last resort: our objects of the family removed and written anew. */
  | { kind: 'replaceFamily'; family: Family; state: FamilyState; masqueradeMark: number }
  /** Every object of ours, in every family. */
  | { kind: 'removeAll' };

/** What a commit tells of the ruleset generation: `after === before + 1` means it was ours alone. */
export interface Applied {
  generations?: { before: number; after: number };
  /** The kernel already held it all: nothing was written (iptables-legacy compares before writing). */
  unchanged?: boolean;
  /** Entries per family left out of a whole write (a value the tools refuse): not programmed. */
  leftOut?: Partial<Record<Family, number>>;
  /** Per family these operations wrote, everything the family now leaves out (not only this write's). */
  rejected?: Partial<Record<Family, readonly Rejection[]>>;
}

/** A family's objects read back and compared with what was programmed. */
export interface ReadBack {
  /** Programmed entries not found in the kernel exactly as written (the same objects as given). */
  missing: Entry[];
  /** Elements in the kernel that match no programmed entry exactly. */
  foreign: KernelElement[];
  /** Parts of the shape that differ from what it should be (nft: chains whose rules differ). */
  shapeDrift: string[];
  /** The generation read just before the read began, when the driver reads generations. */
  generation?: number;
}

export interface Driver {
  readonly name: BackendName;
  /** How errors name it: `nft`, `ebpf`, `iptables-nft`. */
  readonly label: string;
  readonly capacity: EntryCapacity;
  readonly capabilities: DriverCapabilities;
  /** How errors name a family: `ip6` for nft, `ipv6` elsewhere. */
  familyLabel(family: Family): string;
  /** What a family's shape is, as a string compared to decide whether a partial sync is possible. */
  shapeKey(shape: FamilyShape): string;
  /**
   * The entries a family written whole with `entries` holds before it must be written whole again
   * (nft: the map's declared size); unlimited when absent.
   */
  roomFor?(entries: number): number;
  /** Checks that the kernel and userspace can run this driver, without changing anything. */
  probe(): Promise<ProbeResult>;
  /** Before each sync: checks limits, and puts back what writes rest on (eBPF: programs and links). */
  prepare?(desired: DesiredState, full: boolean): Promise<void>;
  apply(operations: readonly DriverOperation[]): Promise<Applied>;
  /** The ruleset generation now (hasGeneration); undefined when it cannot be read. */
  generation?(): Promise<number | undefined>;
  /**
   * Reads a family back and compares it with `expected` and `shape`. 'alongside-writes': in
   * another process, while writes go on: 'unfinished' when it could not finish in time,
   * 'not-alongside' when it cannot read that way (then it is asked 'between-writes').
   */
  readBack(
    family: Family,
    expected: readonly Entry[],
    shape: FamilyShape,
    how: 'alongside-writes' | 'between-writes',
  ): Promise<ReadBack | 'unfinished' | 'not-alongside'>;
  /**
   * Listeners told, outside the driver's writes, when new connections may have passed our
   * translations by (iptables: another writer's jump ran before ours until it was put back).
   */
  watchBypasses?(listener: (bypass: TranslationsBypassed) => void): void;
  /** Whether any object of ours exists in the kernel (a leftover of another backend choice). */
  hasState?(): Promise<boolean>;
  /** Hands memory freed by large work back to the kernel (malloc_trim). */
  releaseMemory?(): Promise<void>;
  /** Releases resources (native handles, timers); leaves kernel state in place. */
  close?(): Promise<void>;
}

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

/** An error a user can meet, carrying one line that says what to do. */
export class BackendError extends Error {
  constructor(
    message: string,
    readonly backend: BackendName,
  ) {
    super(message);
    this.name = 'BackendError';
  }
}
