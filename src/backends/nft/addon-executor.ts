// The in-process libnftables path: the native addon built from native/nftables_addon.cc
// (build/Release/nftables_addon.node). Same contract as the CLI path; the controller falls back
// to the CLI when the addon is not built or does not load, and says why once.

import { addonPath, hasFunctions, loadNativeAddon } from '../../native-addon.js';
import { elementDifference, elementLines } from './element-diff.js';
import {
  MAX_LISTED_ELEMENTS,
  MAX_LISTING_BYTES,
  NftCliExecutor,
  NftError,
  listingTooLarge,
  nftErrorMessage,
  type NftCommit,
  type NftExecutor,
  type SetRead,
  type SetsRead,
  chainNames,
} from './executor.js';
import { JsonWriter, type MapElement, type NftFamily, type Transaction } from './objects.js';
import { MAP_NAME, TABLE_NAME } from './render.js';
import { elementsTransaction, type MapElementChanges, type MapTarget } from './transactions.js';

/** What native/nftables_addon.cc exports. */
export interface NftablesAddon {
  /** Runs one JSON document as one transaction, off the event loop. */
  run(json: string): Promise<{ output: string; generationBefore: number; generationAfter: number }>;
  /** The same in check mode: validated by the kernel, nothing is committed. */
  check(json: string): Promise<{ output: string }>;
  /**
   * JSON listing of one table, or null when it does not exist. A listing longer than `maxBytes`
   * rejects with code ERR_LISTING_TOO_LARGE.
   */
  list(family: string, table: string, maxBytes?: number, what?: 'table' | 'chains'): Promise<string | null>;
  /**
   * One map's element removals and additions as one netlink batch (built with libnftnl; absent
   * when the addon was built without libnftnl-dev and libmnl-dev). Each list is one element a
   * line, fields separated by one space: `address protocol port` for a removal,
   * `address protocol port value[ comment]` for an addition. Rejects with the kernel's reason.
   */
  writeElements?(
    family: string,
    table: string,
    map: string,
    removed: string,
    added: string,
    flush?: boolean,
    keySet?: string,
    options?: ElementBatchOptions,
  ): Promise<ElementBatchResult>;
  /**
   * What some sets of one table hold, read with netlink dumps at one ruleset generation (-1:
   * unknown), one element a line (SetRead): null for a set or a table that does not exist. More
   * than `maxElements` in a set rejects with code ERR_TOO_MANY_ELEMENTS. Absent where
   * writeElements is.
   */
  readSets?(
    family: string,
    table: string,
    sets: readonly SetRead[],
    maxElements: number,
  ): Promise<{ sets: Array<string | null>; generation: number; ms: number }>;
  /** The ruleset generation, or -1 when it cannot be read. */
  generation(): Promise<number>;
  /** Returns memory freed by large work to the kernel (malloc_trim). */
  releaseMemory(): Promise<void>;
  /** The libnftables version the addon was built against. */
  readonly version: string;
}

/** writeElements' options. */
export interface ElementBatchOptions {
  /** The key set's own lists (`address protocol port` lines), in place of the map's. */
  keySetRemoved?: string;
  keySetAdded?: string;
  /** The generation the lists were computed at: the batch is refused (ERR_GENERATION_CHANGED) if anything committed since. */
  generation?: number;
}

/** What a committed element batch reports. */
export interface ElementBatchResult {
  generationBefore: number;
  generationAfter: number;
  /** Parsing the lists and building the batch, in the addon. */
  buildMs: number;
  /** sendmsg of the batch and reading its acks: the kernel runs the transaction inside sendmsg. */
  kernelMs: number;
  /** Netlink messages in the batch (elements go about 500 to a message), and its bytes. */
  messages: number;
  bytes: number;
  /** Elements removed and added, of the map and of the key set. */
  removed: number;
  added: number;
  keysRemoved: number;
  keysAdded: number;
}

/** How the last whole write of a map went (replaceElements): the tests and the benchmark read it. */
export interface MapWrite {
  /** `difference`: what the map held was read and only the changes written; `refill`: flushed and refilled. */
  how: 'difference' | 'refill';
  /** Why it was refilled. */
  why?: string;
  /** Wanted elements the map already held and were not written (`difference`). */
  kept?: number;
  /** Reading what the map and the key set held. */
  readMs?: number;
}

/** Reads and writes of a difference before it is refilled: another writer committed meanwhile. */
const DIFFERENCE_ATTEMPTS = 3;

/** build/Release/nftables_addon.node of this package. */
export function defaultAddonPath(): string {
  return addonPath('nftables_addon.node');
}

function isNftablesAddon(value: unknown): value is NftablesAddon {
  return (
    hasFunctions(value, ['run', 'check', 'list', 'generation', 'releaseMemory']) &&
    typeof (value as NftablesAddon).version === 'string'
  );
}

function asNftError(err: unknown): NftError {
  return new NftError(nftErrorMessage(err instanceof Error ? err.message : String(err)));
}

export class NftAddonExecutor implements NftExecutor {
  readonly kind = 'addon' as const;
  private readonly json = new JsonWriter();
  /** What the last element batch reported (the benchmark reads it). */
  lastElementBatch: ElementBatchResult | undefined;
  /** How the last whole write of a map went. */
  lastMapWrite: MapWrite | undefined;
  constructor(
    /** The addon itself (the benchmark times its calls). */
    readonly addon: NftablesAddon,
    /** A longer listing is an error (listingTooLarge): no string is made of it. */
    readonly maxListingBytes = MAX_LISTING_BYTES,
  ) {}

  get libnftablesVersion(): string {
    return this.addon.version;
  }

  async run(tx: Transaction): Promise<NftCommit> {
    let result;
    try {
      result = await this.addon.run(this.json.document(tx));
    } catch (err) {
      throw asNftError(err);
    }
    const { generationBefore: before, generationAfter: after } = result;
    return before >= 0 && after >= 0 ? { generations: { before, after } } : {};
  }

  /** Whether element changes go as netlink batches (the addon was built with libnftnl). */
  get writesElementBatches(): boolean {
    return typeof this.addon.writeElements === 'function';
  }

  async applyElements(
    family: NftFamily,
    changes: MapElementChanges,
    target: MapTarget = { table: TABLE_NAME, map: MAP_NAME },
  ): Promise<NftCommit> {
    const removed = this.addon.writeElements ? elementLines(changes.removed, false) : undefined;
    const added = removed !== undefined ? elementLines(changes.added, true) : undefined;
    if (removed === undefined || added === undefined || !this.addon.writeElements) {
      return this.run(elementsTransaction(family, changes, target));
    }
    let result: ElementBatchResult;
    try {
      result = await this.addon.writeElements(
        family,
        target.table,
        target.map,
        removed,
        added,
        changes.flush === true,
        target.keySet ?? '',
      );
    } catch (err) {
      throw asNftError(err);
    }
    this.lastElementBatch = result;
    const { generationBefore: before, generationAfter: after } = result;
    return before >= 0 && after >= 0 ? { generations: { before, after } } : {};
  }

  /**
   * NftExecutor.replaceElements: what the map and its key set hold is read (a netlink dump), and
   * one batch removes what is not wanted (or differs) and adds what is missing, computed at the
   * generation it was read at (the kernel refuses it if anything committed since: read again).
   * Refilled (flushed, every element added, as before the difference existed) where the addon
   * has no dump, the read fails (more elements than the controller writes, say), or another
   * writer kept committing: correct whatever the map held, only not safe for lookups on the
   * kernels of element-diff.ts while it commits.
   */
  async replaceElements(
    family: NftFamily,
    elements: readonly MapElement[],
    target: MapTarget = { table: TABLE_NAME, map: MAP_NAME },
  ): Promise<NftCommit> {
    const refill = (why: string) => {
      this.lastMapWrite = { how: 'refill', why };
      return this.applyElements(family, { removed: [], added: elements, flush: true }, target);
    };
    const { addon } = this;
    if (!addon.readSets || !addon.writeElements) {
      return refill('the addon reads no elements (built without libnftnl)');
    }
    const wanted = elementLines(elements, true);
    if (wanted === undefined) return refill('an element the line format cannot carry');
    const keySet = target.keySet ?? '';
    let why = '';
    for (let attempt = 0; attempt < DIFFERENCE_ATTEMPTS; attempt++) {
      let read;
      try {
        const sets: SetRead[] = [{ name: target.map, kind: 'map' }];
        if (keySet) sets.push({ name: keySet, kind: 'keys' });
        read = await this.readSets(family, target.table, sets);
      } catch (err) {
        return refill(`reading ${target.map} failed: ${(err as Error).message}`);
      }
      const [map, keys] = read.sets;
      // Missing: the write that follows names the kernel's reason.
      if (map === undefined || (keySet && keys === undefined)) return refill(`${target.map} or its key set is missing`);
      const held = { map, ...(keySet ? { keySet: keys } : {}) };
      const diff = elementDifference(held, wanted);
      const options: ElementBatchOptions = keySet
        ? { keySetRemoved: diff.keysRemoved, keySetAdded: diff.keysAdded }
        : {};
      if (read.generation !== undefined) options.generation = read.generation;
      let result: ElementBatchResult;
      try {
        result = await addon.writeElements(
          family,
          target.table,
          target.map,
          diff.removed,
          diff.added,
          false,
          keySet,
          options,
        );
      } catch (err) {
        if ((err as { code?: unknown }).code === 'ERR_GENERATION_CHANGED') {
          why = (err as Error).message;
          continue;
        }
        throw asNftError(err);
      }
      this.lastElementBatch = result;
      this.lastMapWrite = { how: 'difference', kept: diff.counts.kept, readMs: read.ms };
      const { generationBefore: before, generationAfter: after } = result;
      return before >= 0 && after >= 0 ? { generations: { before, after } } : {};
    }
    return refill(`another writer kept committing: ${why}`);
  }

  /** NftExecutor.readSets: netlink dumps, where the addon was built with libnftnl. */
  async readSets(family: NftFamily, table: string, sets: readonly SetRead[]): Promise<SetsRead> {
    if (!this.addon.readSets) throw new NftError('the addon reads no elements (built without libnftnl)');
    let read;
    try {
      read = await this.addon.readSets(family, table, sets, MAX_LISTED_ELEMENTS);
    } catch (err) {
      throw asNftError(err);
    }
    const lines = read.sets.map((l) => l ?? undefined);
    return read.generation >= 0
      ? { sets: lines, generation: read.generation, ms: read.ms }
      : { sets: lines, ms: read.ms };
  }

  async generation(): Promise<number | undefined> {
    const generation = await this.addon.generation();
    return generation >= 0 ? generation : undefined;
  }

  async releaseMemory(): Promise<void> {
    await this.addon.releaseMemory();
  }

  async check(tx: Transaction): Promise<void> {
    try {
      await this.addon.check(this.json.document(tx));
    } catch (err) {
      throw asNftError(err);
    }
  }

  async listChains(family: NftFamily, table: string): Promise<string[]> {
    try {
      const listing = await this.addon.list(family, table, this.maxListingBytes, 'chains');
      return listing === null ? [] : chainNames(listing, table);
    } catch (err) {
      throw asNftError(err);
    }
  }

  async listTable(family: 'ip' | 'ip6', name: string): Promise<string | undefined> {
    try {
      return (await this.addon.list(family, name, this.maxListingBytes)) ?? undefined;
    } catch (err) {
      if ((err as { code?: unknown }).code === 'ERR_LISTING_TOO_LARGE') {
        throw listingTooLarge(family, name, this.maxListingBytes);
      }
      throw asNftError(err);
    }
  }
}

const BUILD_HINT = 'install libnftables-dev and run `npm run build:native`';

export type NftAddonLoad = { executor: NftAddonExecutor } | { executor: undefined; reason: string };

/** Loads the addon; never throws: a missing or broken addon comes back as a reason to log. */
export function loadNftAddon(path = defaultAddonPath()): NftAddonLoad {
  const load = loadNativeAddon(path, isNftablesAddon, {
    missing: (p) => `the in-process nftables addon is not built (${p} is missing): ${BUILD_HINT}`,
    broken: (_, error) => `the in-process nftables addon did not load (${error}): ${BUILD_HINT}`,
    notTheAddon: (p) => `${p} is not the nftables addon: run \`npm run build:native\``,
  });
  return load.ok ? { executor: new NftAddonExecutor(load.addon) } : { executor: undefined, reason: load.reason };
}

export type NftExecutorPreference = 'auto' | 'addon' | 'cli';

export interface NftExecutorChoice {
  executor: NftExecutor;
  /** Why this executor was chosen: one line for the caller to log once. */
  reason: string;
}

/**
 * `auto`: the addon when it loads, else the CLI. `addon`: the addon or an NftError saying why it
 * cannot be used (an explicit choice is not silently replaced). `cli`: the CLI.
 */
export function selectNftExecutor(
  preference: NftExecutorPreference,
  addonPath = defaultAddonPath(),
): NftExecutorChoice {
  if (preference === 'cli') {
    return { executor: new NftCliExecutor(), reason: 'nftables is programmed through the nft CLI, as configured' };
  }
  const load = loadNftAddon(addonPath);
  if (load.executor) {
    return {
      executor: load.executor,
      reason: `nftables is programmed in process through libnftables ${load.executor.libnftablesVersion}`,
    };
  }
  if (preference === 'addon') throw new NftError(load.reason);
  return { executor: new NftCliExecutor(), reason: `nftables is programmed through the nft CLI: ${load.reason}` };
}
