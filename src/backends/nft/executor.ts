// How typed nft transactions reach the kernel. The CLI path lives here (written as nft JSON,
// the one writer of objects.ts); the in-process libnftables path (native addon) implements the
// same interface.

import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { execa } from 'execa';
import { formatSize } from '../../bytes.js';
import { listedSetLines, mapDifference, type MapDifference } from './element-diff.js';
import { JsonWriter, type MapElement, type NftFamily, type Transaction } from './objects.js';
import { MAP_NAME, TABLE_NAME } from './render.js';
import { differenceTransaction, elementsTransaction, type MapElementChanges, type MapTarget } from './transactions.js';

/**
 * What a committed transaction tells of the ruleset generation (nf_tables' NFT_MSG_GETGEN), read
 * just before and just after it: `after === before + 1` means the commit between was ours alone.
 */
export interface NftCommit {
  generations?: { before: number; after: number };
}

/**
 * A set to read, and how its elements are written one a line (element-diff.ts): a map
 * (`address protocol port value[ comment]`), a set of its keys (`address protocol port`), a set
 * of keys with a source address (`address protocol port source`), a verdict map (`address
 * protocol port jump chain`).
 */
export interface SetRead {
  name: string;
  kind: 'map' | 'keys' | 'sourced' | 'verdicts';
}

/** What readSets read: the lines of each set asked for (undefined: it does not exist). */
export interface SetsRead {
  sets: Array<string | undefined>;
  /** The ruleset generation they were read at, when it could be read. */
  generation?: number;
  /** How long the reads took. */
  ms: number;
}

/**
 * How the nft driver reaches the kernel. Every executor answers every member: where one cannot
 * do a thing the natural way it does it the way it can (the nft command writes element changes
 * as JSON transactions and reads sets by listing them), so that the driver has one way to write
 * and never asks which members an executor has.
 */
export interface NftExecutor {
  /** `addon` (in-process libnftables) or `cli` (`nft -j -f FILE`). */
  readonly kind: 'addon' | 'cli';
  /**
   * True when applyElements and replaceElements write netlink batches: a map refilled whole that
   * way costs the kernel's work and little more, where the same elements as JSON cost
   * libnftables' parse. The driver then writes a family's objects and its map's elements apart.
   */
  readonly writesElementBatches: boolean;
  /** Runs one transaction atomically; rejects with nft's own message. */
  run(tx: Transaction): Promise<NftCommit | void>;
  /** Runs a transaction in check mode: validated by the kernel, nothing is committed. */
  check(tx: Transaction): Promise<void>;
  /**
   * The ruleset generation now, or undefined where this executor cannot read it. Nothing
   * committed since a generation was read <=> the generation is the same.
   */
  generation(): Promise<number | undefined>;
  /** Hands memory freed by large work (a long listing, say) back to the kernel; a no-op where there is none to hand back. */
  releaseMemory(): Promise<void>;
  /**
   * Writes the element changes of one map (and its key set) as one transaction: a netlink batch
   * in process where the executor writes batches, else a JSON transaction. Rejects with the
   * kernel's reason, and then nothing was committed.
   */
  applyElements(family: NftFamily, changes: MapElementChanges, target?: MapTarget): Promise<NftCommit>;
  /**
   * Brings one map (and its key set) to hold exactly `elements`, in one transaction. Where it can
   * read what they hold, it writes only the difference: an element that stays is not in the
   * transaction (element-diff.ts: the kernels nodes run miss an element deleted and added back in
   * one transaction while it commits); else it flushes them and adds every element. Rejects with
   * the kernel's reason, and then nothing was committed.
   */
  replaceElements(family: NftFamily, elements: readonly MapElement[], target: MapTarget): Promise<NftCommit>;
  /**
   * What some of our sets hold, one element a line (SetRead), read at one ruleset generation
   * where the executor reads generations; undefined for a set that does not exist. Rejects when
   * they cannot be read (more elements than the controller writes, say).
   */
  readSets(family: NftFamily, table: string, sets: readonly SetRead[]): Promise<SetsRead>;
  /** The names of the chains of one table (`nft -j list chains <family>`, no rules). */
  listChains(family: NftFamily, table: string): Promise<string[]>;
  /** `nft -j list table <family> <name>` output, or undefined when the table does not exist. */
  listTable(family: 'ip' | 'ip6', name: string): Promise<string | undefined>;
}

/**
 * Map elements per family the controller programs at most: the total-entries cap per family is
 * to stay at or under it (a larger cap needs a larger MAX_LISTING_BYTES, and the memory for it).
 */
export const MAX_LISTED_ELEMENTS = 300_000;
/**
 * The most bytes `nft -j list table` prints for one map element, measured with nft 1.0.6 (a
 * kernel test checks it): 278 for the widest, two 39-character IPv6 addresses, sctp, port 65535
 * and a 127-character namespace/name comment; 225 for the widest IPv4 one.
 */
export const LISTED_ELEMENT_BYTES = 280;
/**
 * The most bytes of one table listing read, by every path (the nft command, from a worker or
 * not, and the addon): 300,000 elements x 280 bytes = 84 MB, a fifth more for margin (100.8 MB),
 * and 64 KiB for the chains, rules and pod CIDRs: 96.2 MiB. A longer listing is not read: the
 * table holds more than the controller ever writes.
 * Memory at the bound: the comparison holds the text and its parse, about 3.1 times the text
 * (measured: 261 MiB for the 83 MB listing of 300,000 widest elements), beside the controller's
 * 75 MiB at 10,000 Services: within the pod's 512 MiB. (It was 1 GiB, which no pod could hold.)
 */
export const MAX_LISTING_BYTES = Math.ceil(MAX_LISTED_ELEMENTS * LISTED_ELEMENT_BYTES * 1.2) + (64 << 10);

/** The error for a listing over `maxBytes`. */
export function listingTooLarge(family: 'ip' | 'ip6', table: string, maxBytes: number): NftError {
  return new NftError(
    `nft -j list table ${family} ${table}: the listing is larger than ${formatSize(maxBytes)}, more than this ` +
      `controller programs (${MAX_LISTED_ELEMENTS.toLocaleString('en-US')} elements); it was not read`,
  );
}

/**
 * How long the nft command may take to list one set for readSets: what a verification's listing
 * of the table may take at MAX_LISTED_ELEMENTS (read-back.ts: a second and a millisecond per ten
 * elements).
 */
const SET_LISTING_MS = 1_000 + MAX_LISTED_ELEMENTS / 10;

/** A listing that did not finish in time (see NftCliExecutor.listTable). */
export class NftTimeoutError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'NftTimeoutError';
  }
}

export class NftError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'NftError';
  }
}

/** nft's stderr keeps the useful part on its `Error:` lines. */
export function nftErrorMessage(stderr: string): string {
  const lines = stderr
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l.length > 0);
  const errors = lines.filter((l) => l.startsWith('Error:') || l.includes('Error:'));
  return (errors.length > 0 ? errors : lines).slice(0, 3).join('; ') || 'nft failed without a message';
}

export function isNoSuchObject(err: unknown): boolean {
  return err instanceof Error && /No such file or directory|does not exist/i.test(err.message);
}

/** The command printed more than it may: execa stopped it. */
class ListingTooLarge extends Error {}

/**
 * The nft command: every transaction a JSON document (`nft -j -f FILE`), every read a listing.
 * It writes element changes as JSON transactions, reads sets by listing them, and reads no
 * ruleset generation.
 */
export class NftCliExecutor implements NftExecutor {
  readonly kind = 'cli' as const;
  /** Element changes go as JSON, parsed by libnftables: a map is written with its table, in one transaction. */
  readonly writesElementBatches = false;
  private readonly json = new JsonWriter();
  constructor(
    readonly binary = 'nft',
    /** A longer listing is an error (listingTooLarge), not read further. */
    readonly maxListingBytes = MAX_LISTING_BYTES,
    /** How long readSets' listing of one set may take (NftTimeoutError past it). */
    readonly setListingMs = SET_LISTING_MS,
  ) {}

  async run(tx: Transaction): Promise<void> {
    await this.execDocument([], this.json.document(tx));
  }

  async check(tx: Transaction): Promise<void> {
    await this.execDocument(['-c'], this.json.document(tx));
  }

  /**
   * Undefined: nft prints no ruleset generation, and one read by another process around our
   * command would not tell that the commit between them was ours alone.
   */
  async generation(): Promise<number | undefined> {
    return undefined;
  }

  /** Nothing to hand back: each listing is parsed by an nft process, whose memory goes when it exits. */
  async releaseMemory(): Promise<void> {}

  /** The changes as one JSON transaction (elementsTransaction). */
  async applyElements(
    family: NftFamily,
    changes: MapElementChanges,
    target: MapTarget = { table: TABLE_NAME, map: MAP_NAME },
  ): Promise<NftCommit> {
    await this.run(elementsTransaction(family, changes, target));
    return {};
  }

  /**
   * NftExecutor.replaceElements: the map and its key set listed (readSets), and their difference
   * written as one JSON transaction; flushed and refilled in one where they cannot be read (a
   * set missing, a listing over the bound, an element of a form the controller does not write).
   */
  async replaceElements(family: NftFamily, elements: readonly MapElement[], target: MapTarget): Promise<NftCommit> {
    let diff: MapDifference | undefined;
    try {
      const sets: SetRead[] = [{ name: target.map, kind: 'map' }];
      if (target.keySet) sets.push({ name: target.keySet, kind: 'keys' });
      const [map, keys] = (await this.readSets(family, target.table, sets)).sets;
      if (map !== undefined && (!target.keySet || keys !== undefined)) {
        diff = mapDifference({ map, ...(target.keySet ? { keySet: keys } : {}) }, elements);
      }
    } catch {
      // Not read: refilled.
    }
    const tx = diff
      ? differenceTransaction(family, diff, target)
      : elementsTransaction(family, { removed: [], added: elements, flush: true }, target);
    if (tx.size > 0) await this.run(tx);
    return {};
  }

  /**
   * NftExecutor.readSets: each set listed (`nft -j list set|map`), within the listing bound,
   * MAX_LISTED_ELEMENTS and setListingMs each (nft starts a listing again whenever the ruleset
   * changes under it: another writer committing all the time would hold a whole write back for
   * ever), as the addon's dumps write their lines. No generation: the sets are
   * listed one after the other, and a commit between two listings is not seen.
   */
  async readSets(family: NftFamily, table: string, sets: readonly SetRead[]): Promise<SetsRead> {
    const start = performance.now();
    const read: Array<string | undefined> = [];
    for (const set of sets) {
      const what = set.kind === 'map' || set.kind === 'verdicts' ? 'map' : 'set';
      const listing = await this.listSet(family, table, set.name, what);
      if (listing === undefined) {
        read.push(undefined);
        continue;
      }
      const lines = listedSetLines(listing, set.kind);
      if (lines.length > MAX_LISTED_ELEMENTS) {
        throw new NftError(`${what} ${family} ${table} ${set.name} holds more than ${MAX_LISTED_ELEMENTS} elements`);
      }
      read.push(lines.join('\n'));
    }
    return { sets: read, ms: performance.now() - start };
  }

  /** `nft -j list set|map <family> <table> <name>`, or undefined when the table or the set does not exist. */
  private async listSet(
    family: NftFamily,
    table: string,
    set: string,
    what: 'set' | 'map',
  ): Promise<string | undefined> {
    try {
      return await this.exec(['-j', 'list', what, family, table, set], this.setListingMs, this.maxListingBytes);
    } catch (err) {
      if (err instanceof ListingTooLarge) {
        throw new NftError(
          `nft -j list ${what} ${family} ${table} ${set}: the listing is larger than ${formatSize(this.maxListingBytes)}; it was not read`,
        );
      }
      if (isNoSuchObject(err)) return undefined;
      throw err;
    }
  }

  async listChains(family: NftFamily, table: string): Promise<string[]> {
    return chainNames(await this.exec(['-j', 'list', 'chains', family]), table);
  }

  /**
   * With `timeoutMs`, a listing still running then is stopped (NftTimeoutError): nft starts its
   * listing again whenever the ruleset changes under it, so it may never finish while another
   * writer commits every few milliseconds.
   */
  async listTable(family: 'ip' | 'ip6', name: string, timeoutMs?: number): Promise<string | undefined> {
    try {
      return await this.exec(['-j', 'list', 'table', family, name], timeoutMs, this.maxListingBytes);
    } catch (err) {
      if (err instanceof ListingTooLarge) throw listingTooLarge(family, name, this.maxListingBytes);
      if (isNoSuchObject(err)) return undefined;
      throw err;
    }
  }

  /** `nft -j list counters table`: the table's named counters, or undefined when there is no such table. */
  async listCounters(family: NftFamily, table: string, timeoutMs: number): Promise<string | undefined> {
    try {
      return await this.exec(['-j', 'list', 'counters', 'table', family, table], timeoutMs);
    } catch (err) {
      if (isNoSuchObject(err)) return undefined;
      throw err;
    }
  }

  /**
   * nft reads `-f -` by opening /dev/stdin, which fails (ENXIO) on the socket Node gives a
   * child as its stdin: the document goes through a private file instead.
   */
  private async execDocument(flags: string[], json: string): Promise<void> {
    const dir = await mkdtemp(join(tmpdir(), 'nft-transaction-'));
    try {
      const file = join(dir, 'document.json');
      await writeFile(file, json, { mode: 0o600 });
      await this.exec([...flags, '-j', '-f', file]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }

  private async exec(args: string[], timeoutMs?: number, maxBytes = MAX_LISTING_BYTES): Promise<string> {
    const result = await execa(this.binary, args, {
      stdin: 'ignore',
      reject: false,
      stripFinalNewline: true,
      maxBuffer: maxBytes,
      ...(timeoutMs !== undefined ? { timeout: timeoutMs } : {}),
    });
    if (result.failed) {
      if (result.isMaxBuffer) throw new ListingTooLarge();
      if (result.timedOut) throw new NftTimeoutError(`nft ${args.join(' ')} did not finish within ${timeoutMs} ms`);
      if ((result as { code?: string }).code === 'ENOENT') {
        throw new NftError(`the '${this.binary}' command was not found: install the nftables package`);
      }
      throw new NftError(nftErrorMessage(`${result.stderr}\n${result.stdout}`));
    }
    return result.stdout;
  }
}

/** The names of `table`'s chains in a `list chains` JSON listing. */
export function chainNames(listing: string, table: string): string[] {
  const doc = JSON.parse(listing) as { nftables?: Array<{ chain?: { table?: unknown; name?: unknown } }> };
  const names: string[] = [];
  for (const item of doc.nftables ?? []) {
    const chain = item.chain;
    if (chain && chain.table === table && typeof chain.name === 'string') names.push(chain.name);
  }
  return names;
}
