// What a backend's driver is to the rest of the program: the contract drivers implement, the
// reconciler (src/reconciler/) calls and the composition root (src/cli/) chooses from. A driver
// knows how to write its kind of kernel objects and how to read them back; the reconciler decides
// what to write and when. Neither side imports the other: both import this.

import { sameTarget } from '../model/entry-diff.js';
import type { DesiredState, Entry, EntryKeyFields, Family, FamilyState } from '../model/types.js';

export type BackendName = 'nft' | 'iptables' | 'ebpf';

/** What --backend asks for: a backend, or the first whose probe passes (src/backends/registry.ts). */
export type BackendChoice = 'auto' | BackendName;

/**
 * A backend as metrics, logs and /status show it (the composition root describes the one it
 * chose): which executor or iptables variant programs the kernel.
 */
export interface BackendDescription {
  backend: BackendName;
  nftExecutor?: string;
  /** How the nft rules look keys up on this kernel, once probed (nft/render.ts, KeyLookup). */
  nftKeyLookup?: 'map' | 'set';
  iptablesVariant?: 'legacy' | 'nft';
}

export interface ProbeResult {
  ok: boolean;
  /** One line a user can act on when !ok; a short description of what was found when ok. */
  detail: string;
  /** nft: how the rules look keys up on this kernel (nft/render.ts, KeyLookup). */
  nftKeyLookup?: 'map' | 'set';
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

/**
 * What a driver declares of itself, where the drivers differ: the facts that vary, each given
 * once (by the driver when it is made; `filtersSources` of nft by its probe, which runs before
 * the driver is used). The reconciler, the controller and the composition root read nothing else.
 */
export interface DriverCapabilities {
  /**
   * Its writes are transactions (nft): one apply() of several families happens whole or not at
   * all, and a family whose objects cannot be declared again is replaced (replaceFamily).
   */
  readonly transactional: boolean;
  /**
   * What it translates. 'packets' (nft, iptables): NAT rules, whose decisions conntrack keeps
   * (stale flows must be deleted), and whose state needs no preparation before a sync (a partial
   * sync may run while a full one verifies). 'sockets' (eBPF): the destination rewritten at
   * connect() and sendmsg(), before conntrack sees a packet; prepare() attaches the programs
   * again, so no sync runs beside a full one.
   */
  readonly translates: 'packets' | 'sockets';
  /** It translates an entry only for the sources of its sourceRanges; otherwise the model leaves those out. */
  readonly filtersSources: boolean;
}

/** The part of a family's state that is not its entries: what a partial sync cannot change. */
export interface FamilyShape {
  /** The family's state with its entries left out. */
  state: FamilyState;
  masqueradeMark: number;
}

/**
 * The shape key of a driver whose objects besides the map depend on the local-pod match and the
 * masquerade mark (nft's chains, iptables' rules): Driver.shapeKey for such a driver.
 */
export function podMatchShapeKey(shape: FamilyShape): string {
  return JSON.stringify([shape.state.localPodMatch, shape.masqueradeMark]);
}

/** A map element read back from the kernel, or one of ours to remove. */
export interface KernelElement extends EntryKeyFields {
  clusterIp: string;
  /** The comment naming the Service, where the kernel keeps one. */
  service?: string;
  /** How the driver removes exactly this element (its bytes or its listed form), when it must. */
  ref?: unknown;
}

/** Whether an element of the same key as `entry` holds what `entry` programs: its ClusterIP and comment. */
export function holdsEntry(element: Pick<KernelElement, 'clusterIp' | 'service'>, entry: Entry): boolean {
  return sameTarget(element, entry);
}

/**
 * What a driver's write of a family tells of the kernel that the reconciler's record does not
 * (iptables: its rules by chain, what the nat table held at a whole write), for the driver's next
 * write of the family: returned by apply (Applied.annex), kept by the reconciler with its record
 * of the family and forgotten with it, and handed back with each operation on the family (the
 * annex as the apply began: an operation after another on the same family in one apply follows
 * what that one wrote). Opaque to the reconciler; a driver keeps nothing of the kernel between
 * its applies.
 */
export type DriverAnnex = unknown;

/** One typed write. A driver applies a list of them in order (atomically when atomicWrites). */
export type DriverOperation =
  /**
   * Everything of the family: the shape and exactly `state.entries`, whatever the kernel held.
   * `annex`: of the family's last write, while the reconciler still knows what it holds.
   */
  | { kind: 'writeFamily'; family: Family; state: FamilyState; masqueradeMark: number; annex?: DriverAnnex }
  /** The shape again (never touching other elements), with these element changes. */
  | {
      kind: 'writeShape';
      family: Family;
      shape: FamilyShape;
      remove: readonly KernelElement[];
      add: readonly Entry[];
      annex?: DriverAnnex;
    }
  /**
   * Element changes only: removals, then additions (a driver without transactions adds first).
   * `rangedByService`: the family's, once they are written (FamilyState.rangedByService).
   */
  | {
      kind: 'elements';
      family: Family;
      remove: readonly KernelElement[];
      add: readonly Entry[];
      rangedByService: ReadonlyMap<string, number> | undefined;
      annex?: DriverAnnex;
    }
  /** Parts of the shape (as readBack named them) written again; `entries` are those programmed. */
  | {
      kind: 'repairShape';
      family: Family;
      shape: FamilyShape;
      parts: readonly string[];
      entries: readonly Entry[];
      annex?: DriverAnnex;
    }
  /** The last resort: our objects of the family removed and written anew. */
  | { kind: 'replaceFamily'; family: Family; state: FamilyState; masqueradeMark: number }
  /** Every object of ours, in every family. */
  | { kind: 'removeAll' };

/** What a commit tells of the ruleset generation: `after === before + 1` means it was ours alone. */
export interface Applied {
  generations?: { before: number; after: number };
  /** The kernel already held it all: nothing was written (iptables-legacy compares before writing). */
  unchanged?: boolean;
  /**
   * Per family these operations wrote, the entries it holds none of (a value the tools refuse):
   * required after a whole write; after element changes, when the driver keeps count.
   */
  leftOut?: Partial<Record<Family, number>>;
  /** Per family these operations wrote, everything the family now leaves out (not only this write's). */
  rejected?: Partial<Record<Family, readonly Rejection[]>>;
  /** Per family these operations wrote, what the driver is handed back with its next write of it (DriverAnnex). */
  annex?: Partial<Record<Family, DriverAnnex>>;
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

/** Whose connections a translation counter counts: local pods', or the node's own (its processes, host-network pods). */
export type TranslatedSource = 'pods' | 'node';

export interface TranslatedConnections {
  family: Family;
  source: TranslatedSource;
  connections: number;
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
   * (nft: the map's declared size); Infinity where nothing is declared with a size.
   */
  roomFor(entries: number): number;
  /** Checks that the kernel and userspace can run this driver, without changing anything. */
  probe(): Promise<ProbeResult>;
  /** Before each sync: checks limits, and puts back what writes rest on (eBPF: programs and links; nothing elsewhere). */
  prepare(desired: DesiredState, full: boolean): Promise<void>;
  apply(operations: readonly DriverOperation[]): Promise<Applied>;
  /**
   * The ruleset generation now, where the driver reads one around each commit (apply's
   * `generations`); undefined when it cannot be read.
   */
  generation(): Promise<number | undefined>;
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
   * Listeners told, outside the driver's writes, when new connections to a family's translations
   * may have passed them by (iptables: another writer's jump ran before ours until it was put
   * back). The reconciler listens, and tells its subscribers with the entries it holds there. A
   * driver whose translations no other writer can get ahead of (nft's own table, eBPF's
   * programs) never calls it.
   */
  watchBypasses(listener: (family: Family) => void): void;
  /** Whether any object of ours exists in the kernel (a leftover of another backend choice). */
  hasState(): Promise<boolean>;
  /**
   * The connections our rules translated since the family's table was made, by source, as the
   * kernel counts them (iptables: a total kept across the rules its own writes replace, never
   * decreasing within a process); a family it could not read (no table, a listing that did not finish in
   * time) is left out. Read without holding back writes.
   */
  translatedConnections(): Promise<TranslatedConnections[]>;
  /** Hands memory freed by large work back to the kernel (malloc_trim, where an addon allocated it). */
  releaseMemory(): Promise<void>;
  /** Releases resources (native handles, timers); leaves kernel state in place. */
  close(): Promise<void>;
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
