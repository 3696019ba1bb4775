// The nftables driver: tables `ip ipvs-node-controller` and `ip6 ipvs-node-controller`, written
// as typed transactions (render.ts) that the executor commits atomically.
//
// - A family written whole (every start, a shape change, after a refused partial write) declares
//   every object, rewrites our chains' rules and brings the map to the entries: the table and the
//   base chains packets cross are never removed (a table replaced under traffic loses new
//   connections' first packets). With the addon's netlink batches, the objects go in one small
//   JSON transaction and each map is brought to its entries by one batch (packets see the old
//   elements or the new ones); else both families go in one JSON transaction, which is also the
//   fallback when a batch is refused.
// - A whole write writes the difference: what the map, its key set and the source-range sets hold
//   is read first (the addon's netlink dumps, the nft command's listings of each set) and only
//   what differs is removed or added.
//   On the kernels nodes run (5.10, 6.1; nf_tables before "restart set lookup on base_seq change",
//   2025), a packet looked up while a transaction commits can miss an element that transaction
//   deletes and adds back (a set flushed and refilled), or any element of a map it replaces, and
//   a new connection's first packet then goes untranslated for the connection's life: at every
//   restart, for Services that did not change (element-diff.ts). What cannot be read is written
//   as before (flushed and refilled, the map replaced), and a difference refused is too.
// - A partial sync's element changes of one family go to the executor's element write
//   (applyElements), which decides how: a netlink batch in process, a JSON transaction through
//   the nft command. Every executor has every member (executor.ts): the driver's one choice, made
//   when it is built, is whether whole writes go in two steps (writesElementBatches).
// - The shape written again (a resync) declares the chains again, with the element changes,
//   without touching the map's other elements.
// - A read back (read-back.ts) lists the table through the nft command when the addon programs:
//   another process, from a worker, so that changes are never queued behind the listing.
// - The probe (probe.ts) finds how our rules look keys up on this kernel, and whether it takes
//   the source-range set.
// - The executor reads the ruleset generation (NFT_MSG_GETGEN) around each commit where it can
//   (the addon); the reconciler trusts a family while every commit since it was exact was ours.

import { FAMILIES, type Entry, type Family } from '../../model/types.js';
import {
  podMatchShapeKey,
  type Applied,
  type Driver,
  type DriverCapabilities,
  type DriverOperation,
  type EntryCapacity,
  type FamilyShape,
  type KernelElement,
  type ProbeResult,
  type ReadBack,
  type TranslatedConnections,
  type TranslatedSource,
} from '../../driver/driver.js';
import { MAX_LISTED_ELEMENTS, NftCliExecutor, type NftCommit, type NftExecutor } from './executor.js';
import { Transaction } from './objects.js';
import { NftKernelProbe } from './probe.js';
import { NftReader, type NftLister } from './read-back.js';
import { listedElement, listedIn } from './element-diff.js';
import {
  KEY_SET_NAME,
  MAP_NAME,
  NFT_FAMILY,
  TABLE_NAME,
  TRANSLATED_COUNTERS,
  desiredTable,
  mapElement,
  mapSize,
  type KeyLookup,
} from './render.js';
import { writeTableButElements, type HeldContents } from './transactions.js';
import { readHeld, sourceChains } from './held.js';
import { addOperation } from './operations.js';

export interface NftDriverOptions {
  /**
   * How rules look a key up (render.ts, KeyLookup); 'auto' (default): the map itself where the
   * kernel takes it, else a key set, as a check-mode transaction finds at the first use.
   */
  lookup?: 'auto' | KeyLookup;
  /**
   * Lists the table for a verification, in another process so that partial syncs go on
   * meanwhile (the addon runs one command at a time). Default: the nft command (the executor
   * itself when it is the nft command); for another executor, it lists between our writes.
   */
  lister?: NftLister;
}

/**
 * Map lookups cost the same at any size: the bound is the memory a sync takes (libnftables parses
 * the document at about 4 KiB per element: docs/operations.md, Limits), and at most what a
 * resync's listing is read for.
 */
export const NFT_CAPACITY: EntryCapacity = {
  defaultEntries: 65_536,
  maxEntries: MAX_LISTED_ELEMENTS,
  why: 'the memory of a full sync within the 512 Mi limit',
};

export class NftDriver implements Driver {
  readonly name = 'nft' as const;
  readonly label = 'nft';
  readonly capacity = NFT_CAPACITY;
  /** Set once more by probe(), before any use (selectBackend probes before it hands a driver out). */
  capabilities: DriverCapabilities;
  private readonly kernel: NftKernelProbe;
  /** The key lookup, once the probe found it. */
  private lookupFound: { lookup: KeyLookup; why: string } | undefined;
  private readonly reader: NftReader;
  /** Lists without holding back our writes (the nft command), where there is one. */
  private readonly lister: NftLister | undefined;
  /**
   * Whether families written whole go in two steps (writeByBatches): where the executor writes
   * element batches, whose elements never become JSON. Known when the driver is built.
   */
  private readonly wholeWritesByBatches: boolean;

  constructor(
    readonly executor: NftExecutor,
    options: NftDriverOptions = {},
  ) {
    const lister =
      options.lister ??
      (executor.kind === 'addon' ? new NftCliExecutor() : executor instanceof NftCliExecutor ? executor : undefined);
    this.kernel = new NftKernelProbe(executor, options.lookup ?? 'auto');
    this.reader = new NftReader(executor, lister);
    this.lister = lister;
    this.wholeWritesByBatches = executor.writesElementBatches;
    this.capabilities = { transactional: true, translates: 'packets', filtersSources: true };
  }

  familyLabel(family: Family): string {
    return NFT_FAMILY[family];
  }

  shapeKey(shape: FamilyShape): string {
    return podMatchShapeKey(shape);
  }

  /** The map is declared with a size: more entries need it replaced, which a whole write does. */
  roomFor(entries: number): number {
    return mapSize(entries);
  }

  /** How our rules look keys up on this kernel (probe.ts), found once; kept here once found. */
  async keyLookup(): Promise<{ lookup: KeyLookup; why: string }> {
    return (this.lookupFound ??= await this.kernel.keyLookup());
  }

  /** Also finds whether the kernel takes the source-range set: `capabilities.filtersSources`, set here once. */
  async probe(): Promise<ProbeResult> {
    const { filtersSources, ...result } = await this.kernel.probe();
    if (filtersSources !== undefined) this.capabilities = { ...this.capabilities, filtersSources };
    return result;
  }

  /** Nothing to put back before a sync: the table and its hooks are declared by every whole write. */
  async prepare(): Promise<void> {}

  /** Our own table: no other writer's rule runs before ours in it, so nothing is ever bypassed. */
  watchBypasses(): void {}

  /** Nothing to release: the executor's libnftables context lives as long as the process. */
  async close(): Promise<void> {}

  /**
   * All of `operations` in one transaction. Element changes of one family alone go to the
   * executor's element write (applyElements: a netlink batch in process, a JSON transaction
   * through the nft command); families written whole go in two steps where the executor writes
   * element batches (writeByBatches, chosen when the driver is built), else in one transaction.
   */
  async apply(operations: readonly DriverOperation[]): Promise<Applied> {
    const { lookup } = await this.keyLookup();
    const keySet = lookup === 'set' ? KEY_SET_NAME : undefined;
    const [only] = operations;
    // Entries with source ranges are written with their sets' elements, in one JSON transaction.
    const ranged = (entries: readonly KernelElement[]) => entries.some((e) => (e as Entry).sourceRanges);
    if (operations.length === 1 && only?.kind === 'elements' && !ranged(only.remove) && !ranged(only.add)) {
      const removed = only.remove.map(listedElement);
      // An element listed in one of the map and the key set but not the other is removed from
      // where it is, which the JSON path writes (applyElements removes each key from both).
      if (!keySet || only.remove.every((e) => listedIn(e) === 'both')) {
        const changes = { removed, added: only.add.map(mapElement) };
        return this.executor.applyElements(NFT_FAMILY[only.family], changes, {
          table: TABLE_NAME,
          map: MAP_NAME,
          keySet,
        });
      }
    }
    const whole = operations.filter((op) => op.kind === 'writeFamily');
    if (
      this.wholeWritesByBatches &&
      whole.length > 0 &&
      whole.length === operations.length &&
      whole.every((op) => !op.state.sourceRanged)
    ) {
      const applied = await this.writeByBatches(whole, lookup);
      if (applied) return applied;
    }
    // What the sets and the map hold, so that the transaction writes their difference.
    const held = await readHeld(this.executor, operations, lookup);
    const transaction = (known: ReadonlyMap<Family, HeldContents>) => {
      const tx = new Transaction();
      for (const op of operations) {
        const family = 'family' in op ? op.family : undefined;
        const contents = family && known.get(family);
        // Without what the family holds, the chains listed are still known.
        const chains = family && held.families.get(family)?.sourceChains;
        const given = contents || (chains ? { sourceChains: chains } : undefined);
        addOperation(tx, op, lookup, given || undefined);
      }
      return tx;
    };
    const tx = transaction(held.families);
    if (tx.size === 0) return {};
    let applied: Applied;
    try {
      applied = (await this.executor.run(tx)) ?? {};
      // A commit between the reads and ours may have changed what they found: not known exact.
      if (held.families.size > 0 && applied.generations?.before !== held.generation) applied = {};
    } catch (err) {
      if (held.families.size === 0) throw err;
      // The difference refused (changed since it was read, or the map must grow): written whole.
      applied = (await this.executor.run(transaction(new Map()))) ?? {};
    }
    return applied;
  }

  /**
   * Families written whole in two steps: every object but the map's elements in one JSON
   * transaction (a few KiB whatever the entries), then each map brought to its entries by one
   * netlink batch (one transaction, so packets see the old elements or the new ones): the
   * difference with what the map holds, read by a netlink dump, so that an element that stays
   * is not touched (element-diff.ts); a flush and every element where it cannot be read. The
   * elements never become JSON, nor are they parsed by libnftables: at 10,000 entries that was
   * most of a whole write. Undefined when a step was refused (a map declared smaller than its
   * entries on a kernel that keeps an existing map's size, an object changed by someone else):
   * the caller then writes the families as one transaction.
   */
  private async writeByBatches(
    ops: ReadonlyArray<Extract<DriverOperation, { kind: 'writeFamily' }>>,
    lookup: KeyLookup,
  ) {
    const tx = new Transaction();
    for (const op of ops) {
      const table = desiredTable(op.family, op.state, op.masqueradeMark, lookup);
      const chains = await sourceChains(this.executor, op.family);
      writeTableButElements(tx, table, chains ? { sourceChains: chains } : {});
    }
    const keySet = lookup === 'set' ? KEY_SET_NAME : undefined;
    const commits: Array<NftCommit | void> = [];
    try {
      commits.push(await this.executor.run(tx));
      for (const op of ops) {
        const elements = op.state.entries.map(mapElement);
        const target = { table: TABLE_NAME, map: MAP_NAME, keySet };
        const family = NFT_FAMILY[op.family];
        commits.push(await this.executor.replaceElements(family, elements, target));
      }
    } catch {
      return undefined;
    }
    return chainedCommits(commits);
  }

  generation(): Promise<number | undefined> {
    return this.executor.generation();
  }

  readBack(
    family: Family,
    expected: readonly Entry[],
    shape: FamilyShape,
    how: 'alongside-writes' | 'between-writes',
  ): Promise<ReadBack | 'unfinished' | 'not-alongside'> {
    return this.reader.readBack(family, expected, shape, how, () => this.keyLookup());
  }

  async releaseMemory(): Promise<void> {
    await this.executor.releaseMemory();
  }

  /**
   * The translating rules' counters, listed by the nft command (not through the addon: its
   * listing holds our writes back), within COUNTER_READ_MS per family: a listing starts again
   * whenever the ruleset changes, so it may not finish while another process commits all the time.
   */
  async translatedConnections(): Promise<TranslatedConnections[]> {
    const listCounters = this.lister?.listCounters?.bind(this.lister);
    if (!listCounters) return [];
    const read: TranslatedConnections[] = [];
    for (const family of FAMILIES) {
      let listing: string | undefined;
      try {
        listing = await listCounters(NFT_FAMILY[family], TABLE_NAME, COUNTER_READ_MS);
      } catch {
        continue;
      }
      if (listing === undefined) continue;
      const packets = countersIn(listing);
      for (const source of Object.keys(TRANSLATED_COUNTERS) as TranslatedSource[]) {
        const connections = packets.get(TRANSLATED_COUNTERS[source]);
        if (connections !== undefined) read.push({ family, source, connections });
      }
    }
    return read;
  }

  async hasState(): Promise<boolean> {
    for (const family of FAMILIES) {
      if ((await this.executor.listTable(NFT_FAMILY[family], TABLE_NAME)) !== undefined) return true;
    }
    return false;
  }
}

/** How long one family's counters may take to list. */
const COUNTER_READ_MS = 1_000;

/** The packets of each named counter of a `nft -j list counters` listing. */
function countersIn(listing: string): Map<string, number> {
  const packets = new Map<string, number>();
  const items = (JSON.parse(listing) as { nftables?: unknown[] }).nftables ?? [];
  for (const item of items) {
    const c = (item as { counter?: { name?: unknown; packets?: unknown } }).counter;
    if (c && typeof c.name === 'string' && typeof c.packets === 'number') packets.set(c.name, c.packets);
  }
  return packets;
}

/**
 * Commits made one after the other, as one: ours alone when each moved the generation by one
 * from where the previous left it, or not at all (a batch with nothing to change: flushing an
 * empty map); then the last step is reported, a step of one. Else the whole span (not a step of
 * one: not ours alone).
 */
function chainedCommits(commits: ReadonlyArray<NftCommit | void>): Applied {
  let first: number | undefined;
  let last: number | undefined;
  let oursAlone = true;
  for (const commit of commits) {
    const g = commit?.generations;
    if (!g) return {};
    if (last !== undefined && g.before !== last) oursAlone = false;
    if (g.after !== g.before + 1 && g.after !== g.before) oursAlone = false;
    first ??= g.before;
    last = g.after;
  }
  if (first === undefined || last === undefined) return {};
  return {
    generations: oursAlone && last > first ? { before: last - 1, after: last } : { before: first, after: last },
  };
}
