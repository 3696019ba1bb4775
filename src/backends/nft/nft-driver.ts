// The nftables driver: tables `ip ipvs-node-controller` and `ip6 ipvs-node-controller`, written
// as typed transactions (render.ts) that the executor commits atomically.
//
// - A family written whole declares every object, rewrites our chains' rules and refills the
//   map: the table and the base chains packets cross are never removed (a table replaced under
//   traffic loses new connections' first packets). With the addon's netlink batches, the objects
//   go in one small JSON transaction and each map is refilled by one batch (flush and every
//   element: packets see the old elements or the new ones); else both families go in one JSON
//   transaction, which is also the fallback when a batch is refused.
// - The shape written again (a resync) declares the chains again and adds back the pod set, with
//   the element changes, without touching the map's other elements.
// - A read back lists the table through the nft command when the addon programs: another
//   process, from a worker, so that changes are never queued behind the listing.
// - The executor reads the ruleset generation (NFT_MSG_GETGEN) around each commit where it can
//   (the addon); the reconciler trusts a family while every commit since it was exact was ours.

import { FAMILIES, type Entry, type Family, type FamilyState } from '../../model/types.js';
import { parseIp } from '../../model/ip.js';
import type {
  Applied,
  Driver,
  DriverCapabilities,
  DriverOperation,
  EntryCapacity,
  FamilyShape,
  KernelElement,
  ProbeResult,
  ReadBack,
} from '../../reconciler/driver.js';
import {
  MAX_LISTED_ELEMENTS,
  NftCliExecutor,
  NftError,
  NftTimeoutError,
  type NftCommit,
  type NftExecutor,
} from './executor.js';
import { JsonWriter, Transaction, type MapElement, type RuleObject } from './objects.js';
import { ListingWorkerError, diffListing, expectedLines, listAndDiff, type ListingDiff } from './listing-diff.js';
import {
  MAP_NAME,
  NFT_FAMILY,
  TABLE_NAME,
  deleteTables,
  desiredTable,
  mapChanges,
  mapElement,
  mapSize,
  replaceTable,
  resyncTable,
  rewriteRules,
  writeTable,
  writeTableButElements,
} from './render.js';

export interface NftDriverOptions {
  /**
   * Lists the table for a verification, in another process so that partial syncs go on
   * meanwhile (the addon runs one command at a time). Default: the nft command (the executor
   * itself when it is the nft command); for another executor, it lists between our writes.
   */
  lister?: NftLister;
}

/** Lists a table as `nft -j list table` prints it; NftCliExecutor is one. */
export interface NftLister {
  listTable(family: 'ip' | 'ip6', name: string, timeoutMs?: number): Promise<string | undefined>;
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
  readonly capabilities: DriverCapabilities;
  private readonly json = new JsonWriter();
  /** Lists without holding back our writes (the nft command); undefined: list between writes. */
  private lister: NftLister | undefined;
  /** False once a worker thread could not be used: listings are then compared on the event loop. */
  private workers = true;

  constructor(
    readonly executor: NftExecutor,
    options: NftDriverOptions = {},
  ) {
    this.lister =
      options.lister ??
      (executor.kind === 'addon' ? new NftCliExecutor() : executor instanceof NftCliExecutor ? executor : undefined);
    this.capabilities = {
      ordersOwnWrites: true,
      conntrackMatters: true,
      hasGeneration: executor.generation !== undefined,
      atomicWrites: true,
      replacesFamilies: true,
      readsAlongsideWrites: true,
      writesElements: true,
      readsBack: true,
    };
  }

  familyLabel(family: Family): string {
    return NFT_FAMILY[family];
  }

  shapeKey(shape: FamilyShape): string {
    return JSON.stringify([shape.state.localPodMatch, shape.masqueradeMark]);
  }

  /** The map is declared with a size: more entries need it replaced, which a whole write does. */
  roomFor(entries: number): number {
    return mapSize(entries);
  }

  async probe(): Promise<ProbeResult> {
    // A check-mode write of an empty state: proves the nft userspace, the nat hooks, fib and
    // concatenated maps in this kernel, and the permission to program them.
    const empty: FamilyState = { entries: [], localPodMatch: { kind: 'cidrs', cidrs: [] } };
    try {
      for (const family of FAMILIES) {
        await this.executor.check(writeTable(new Transaction(), desiredTable(family, empty, 0x4000)));
      }
      return { ok: true, detail: `nftables via ${this.executor.kind}` };
    } catch (err) {
      return { ok: false, detail: `nftables cannot be programmed: ${(err as Error).message}` };
    }
  }

  /**
   * All of `operations` in one transaction; element changes of one family alone go to the
   * executor's element path where it has one (a netlink batch, without JSON).
   */
  async apply(operations: readonly DriverOperation[]): Promise<Applied> {
    const [only] = operations;
    if (operations.length === 1 && only?.kind === 'elements' && this.executor.applyElements) {
      const changes = { removed: only.remove.map(listedElement), added: only.add.map(mapElement) };
      return this.executor.applyElements(NFT_FAMILY[only.family], changes);
    }
    const whole = operations.filter((op) => op.kind === 'writeFamily');
    if (this.executor.writesElementBatches && whole.length > 0 && whole.length === operations.length) {
      const applied = await this.writeByBatches(whole);
      if (applied) return applied;
    }
    const tx = new Transaction();
    for (const op of operations) addOperation(tx, op);
    if (tx.size === 0) return {};
    return (await this.executor.run(tx)) ?? {};
  }

  /**
   * Families written whole in two steps: every object but the map's elements in one JSON
   * transaction (a few KiB whatever the entries), then each map refilled by one netlink batch
   * (flush and all elements: one transaction, so packets see the old elements or the new ones).
   * The elements never become JSON, nor are they parsed by libnftables: at 10,000 entries that
   * was most of a whole write. Undefined when a step was refused (a map declared smaller than
   * its entries on a kernel that keeps an existing map's size, an object changed by someone
   * else): the caller then writes the families as one transaction.
   */
  private async writeByBatches(ops: ReadonlyArray<Extract<DriverOperation, { kind: 'writeFamily' }>>) {
    const tx = new Transaction();
    for (const op of ops) writeTableButElements(tx, desiredTable(op.family, op.state, op.masqueradeMark));
    const commits: Array<NftCommit | void> = [];
    try {
      commits.push(await this.executor.run(tx));
      for (const op of ops) {
        const added = op.state.entries.map(mapElement);
        commits.push(await this.executor.applyElements!(NFT_FAMILY[op.family], { removed: [], added, flush: true }));
      }
    } catch {
      return undefined;
    }
    return chainedCommits(commits);
  }

  generation(): Promise<number | undefined> {
    return this.executor.generation?.() ?? Promise.resolve(undefined);
  }

  async readBack(
    family: Family,
    expected: readonly Entry[],
    shape: FamilyShape,
    how: 'alongside-writes' | 'between-writes',
  ): Promise<ReadBack | 'unfinished' | 'not-alongside'> {
    if (how === 'alongside-writes' && !this.lister) return 'not-alongside';
    const lines = await expectedLines(expected);
    // The generation the listing will see, if nothing commits meanwhile: then a repair computed
    // from it leaves the kernel exactly as programmed.
    const generation = await this.executor.generation?.();
    const listed = how === 'alongside-writes' ? await this.listAlongside(family, lines, expected.length) : undefined;
    if (listed === 'unfinished' || listed === 'not-alongside') return listed;
    const diff = listed ?? (await this.diff(await this.executor.listTable(NFT_FAMILY[family], TABLE_NAME), lines));
    if (diff === undefined) throw new NftError('the table is missing');
    const table = desiredTable(family, shape.state, shape.masqueradeMark);
    const shapeDrift: string[] = [];
    for (const chain of table.chains) {
      const want = table.rules
        .filter((r) => r.chain === chain.name)
        .map((r) => JSON.stringify(ruleExpressions(this.json, r)));
      const have = diff.rules[chain.name] ?? [];
      if (want.length !== have.length || want.some((w, i) => w !== have[i])) shapeDrift.push(chain.name);
    }
    const read: ReadBack = {
      missing: diff.unmatched.map((i) => expected[i]!),
      foreign: parseListedElements(family, diff.residue),
      shapeDrift,
    };
    if (generation !== undefined) read.generation = generation;
    return read;
  }

  /**
   * The listing compared with `lines` in another process (the nft command, from a worker): nft
   * starts a listing again whenever the ruleset changes under it, so while changes flow it may
   * not finish ('unfinished').
   */
  private async listAlongside(
    family: Family,
    lines: string,
    entries: number,
  ): Promise<ListingDiff | 'unfinished' | 'not-alongside'> {
    const nf = NFT_FAMILY[family];
    const lister = this.lister!;
    const timeoutMs = Math.ceil(1_000 + entries / 10);
    try {
      let diff: ListingDiff | undefined;
      try {
        diff =
          lister instanceof NftCliExecutor && this.workers
            ? await listAndDiff(lister.binary, nf, TABLE_NAME, lines, MAP_NAME, timeoutMs)
            : await this.diff(await lister.listTable(nf, TABLE_NAME, timeoutMs), lines);
      } catch (err) {
        if (!(err instanceof ListingWorkerError)) throw err;
        // No worker threads here: compare on the event loop from now on.
        this.workers = false;
        diff = await this.diff(await lister.listTable(nf, TABLE_NAME, timeoutMs), lines);
      }
      if (diff === undefined) throw new NftError('the table is missing');
      return diff;
    } catch (err) {
      if (err instanceof NftTimeoutError) return 'unfinished';
      if (!/not found/.test((err as Error).message)) throw err;
      // No nft command beside the addon: list between our writes.
      this.lister = undefined;
      return 'not-alongside';
    }
  }

  private async diff(listing: string | undefined, expected: string): Promise<ListingDiff | undefined> {
    if (listing === undefined) return undefined;
    try {
      return await diffListing(listing, expected, MAP_NAME, this.workers ? undefined : Infinity);
    } catch (err) {
      if (!(err instanceof ListingWorkerError)) throw err;
      this.workers = false;
      return diffListing(listing, expected, MAP_NAME, Infinity);
    }
  }

  async releaseMemory(): Promise<void> {
    await this.executor.releaseMemory?.();
  }

  async hasState(): Promise<boolean> {
    for (const family of FAMILIES) {
      if ((await this.executor.listTable(NFT_FAMILY[family], TABLE_NAME)) !== undefined) return true;
    }
    return false;
  }
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

/** One typed operation as verbs on our tables' objects. */
function addOperation(tx: Transaction, op: DriverOperation): void {
  switch (op.kind) {
    case 'writeFamily':
      writeTable(tx, desiredTable(op.family, op.state, op.masqueradeMark));
      return;
    case 'replaceFamily':
      replaceTable(tx, desiredTable(op.family, op.state, op.masqueradeMark));
      return;
    case 'writeShape':
      resyncTable(tx, desiredTable(op.family, op.shape.state, op.shape.masqueradeMark));
      mapChanges(tx, op.family, op.remove.map(listedElement), op.add.map(mapElement));
      return;
    case 'elements':
      mapChanges(tx, op.family, op.remove.map(listedElement), op.add.map(mapElement));
      return;
    case 'repairShape': {
      const table = desiredTable(op.family, op.shape.state, op.shape.masqueradeMark);
      for (const chain of table.chains) if (op.parts.includes(chain.name)) rewriteRules(tx, table, chain);
      return;
    }
    case 'removeAll':
      deleteTables(tx, FAMILIES);
      return;
  }
}

/** An element to delete: as it was listed when it was read back, else as we write it. */
function listedElement(e: KernelElement): MapElement {
  return (e.ref as MapElement | undefined) ?? mapElement(e as Entry);
}

type Json = unknown;

/** The expressions of a rule as nft JSON: what a listing shows of it. */
function ruleExpressions(json: JsonWriter, rule: RuleObject): unknown {
  const [command] = json.commands(new Transaction().add(rule));
  return (command!.add as { rule: { expr: unknown } }).rule.expr;
}

/** Map elements as a listing shows them (`[key, value]` pairs), typed. */
function parseListedElements(family: Family, pairs: readonly Json[]): KernelElement[] {
  const elements: KernelElement[] = [];
  for (const pair of pairs) {
    if (!Array.isArray(pair) || pair.length !== 2) throw new NftError(`unexpected map element ${JSON.stringify(pair)}`);
    const [k, value] = pair as [Json, Json];
    const wrapped = (k as { elem?: { val: Json; comment?: string } }).elem;
    const val = wrapped ? wrapped.val : k;
    const parts = (val as { concat?: Json[] }).concat;
    if (!Array.isArray(parts) || parts.length !== 3 || typeof value !== 'string') {
      throw new NftError(`unexpected map element ${JSON.stringify(pair)}`);
    }
    const [ip, proto, port] = parts as [string, string | number, number | string];
    // nft prints addresses as the model writes them (RFC 5952 for IPv6); parse only what differs.
    const address = family === 'ipv6' ? (parseIp(ip)?.address ?? ip) : ip;
    const protocol = typeof proto === 'string' ? proto.toUpperCase() : proto;
    const element: KernelElement = {
      family,
      externalIp: address,
      protocol: protocol as never,
      port: Number(port),
      clusterIp: family === 'ipv6' ? (parseIp(value)?.address ?? value) : value,
      // Deleted by key: written back as it was read.
      ref: { key: [ip, proto, port], value } satisfies MapElement,
    };
    if (wrapped?.comment !== undefined) element.service = wrapped.comment;
    elements.push(element);
  }
  return elements;
}
