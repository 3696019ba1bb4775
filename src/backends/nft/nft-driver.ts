// The nftables driver: tables `ip ipvs-node-controller` and `ip6 ipvs-node-controller`, written
// as typed transactions (render.ts) that the executor commits atomically.
//
// - A family written whole declares every object, rewrites our chains' rules and refills the
//   map: the table and the base chains packets cross are never removed (a table replaced under
//   traffic loses new connections' first packets). With the addon's netlink batches, the objects
//   go in one small JSON transaction and each map is refilled by one batch (flush and every
//   element: packets see the old elements or the new ones); else both families go in one JSON
//   transaction, which is also the fallback when a batch is refused.
// - The shape written again (a resync) declares the chains again, with the element changes,
//   without touching the map's other elements.
// - A read back lists the table through the nft command when the addon programs: another
//   process, from a worker, so that changes are never queued behind the listing.
// - The executor reads the ruleset generation (NFT_MSG_GETGEN) around each commit where it can
//   (the addon); the reconciler trusts a family while every commit since it was exact was ours.

import { FAMILIES, type Entry, type Family, type FamilyState } from '../../model/types.js';
import { parseIp } from '../../model/ip.js';
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
} from '../../driver/driver.js';
import {
  MAX_LISTED_ELEMENTS,
  NftCliExecutor,
  NftError,
  NftTimeoutError,
  type NftCommit,
  type NftExecutor,
} from './executor.js';
import { JsonWriter, Transaction, type MapElement, type RuleObject } from './objects.js';
import {
  ListingWorkerError,
  diffListing,
  expectedLines,
  listAndDiff,
  sourceRangeLines,
  type ListingDiff,
} from './listing-diff.js';
import {
  KEY_SET_NAME,
  MAP_NAME,
  NFT_FAMILY,
  SOURCE_RANGE_SET,
  SOURCE_RANGED_KEY_SET,
  sourceRangeChanges,
  sourceRangeElements,
  type KeyLookup,
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
  private readonly lookupChoice: 'auto' | KeyLookup;
  /** The key lookup in use, found once (keyLookup). */
  private lookup: Promise<{ lookup: KeyLookup; why: string }> | undefined;
  /** Families this driver wrote with source-range sets: a whole write without them removes them. */
  private readonly sourceRanged = new Set<Family>();

  constructor(
    readonly executor: NftExecutor,
    options: NftDriverOptions = {},
  ) {
    this.lister =
      options.lister ??
      (executor.kind === 'addon' ? new NftCliExecutor() : executor instanceof NftCliExecutor ? executor : undefined);
    this.lookupChoice = options.lookup ?? 'auto';
    this.capabilities = {
      ordersOwnWrites: true,
      conntrackMatters: true,
      atomicWrites: true,
      replacesFamilies: true,
      readsAlongsideWrites: true,
      filtersSources: true,
    };
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

  /**
   * How our rules look keys up on this kernel: the map itself when a check-mode write of that
   * shape passes, else the key set when that one passes (the kernel refuses a map looked up as a
   * set: Linux 6.1 and older). Found once; a failure is not kept, so the next use tries again.
   */
  keyLookup(): Promise<{ lookup: KeyLookup; why: string }> {
    this.lookup ??= this.findKeyLookup().catch((err: unknown) => {
      this.lookup = undefined;
      throw err;
    });
    return this.lookup;
  }

  private async findKeyLookup(): Promise<{ lookup: KeyLookup; why: string }> {
    if (this.lookupChoice !== 'auto') return { lookup: this.lookupChoice, why: 'as configured' };
    // A family the kernel refuses whatever the lookup must not decide it for the other.
    let mapRefused: Error | undefined;
    for (const lookup of ['map', 'set'] as const) {
      for (const family of FAMILIES) {
        try {
          await this.checkEmptyTable(family, lookup);
        } catch (err) {
          if (lookup === 'map') mapRefused ??= err as Error;
          continue;
        }
        if (lookup === 'map') return { lookup, why: 'this kernel looks a map up as a set' };
        return {
          lookup,
          why: `this kernel refuses a map looked up as a set (${mapRefused?.message}): keys go in a set beside the map`,
        };
      }
    }
    throw mapRefused!;
  }

  /**
   * A check-mode write of an empty state: proves the nft userspace, the nat hooks, fib and
   * concatenated maps (and sets) in this kernel, and the permission to program them.
   */
  private async checkEmptyTable(family: Family, lookup: KeyLookup): Promise<void> {
    const empty: FamilyState = { entries: [], localPodMatch: { kind: 'cidrs', cidrs: [] } };
    await this.executor.check(writeTable(new Transaction(), desiredTable(family, empty, 0x4000, lookup)));
  }

  /**
   * A check-mode write of a table with a source-ranged entry: the `source-ranges` set is a
   * concatenation with an interval (nft_set_pipapo), whose lookup some kernels refuse
   * (EOPNOTSUPP, seen on Debian's 6.12.117 in QEMU). Where refused, this driver does not filter
   * sources and the model leaves ranged addresses to kube-proxy, as with the eBPF backend:
   * one such Service must not make a whole family unprogrammable.
   */
  private async checkSourceRanges(lookup: KeyLookup): Promise<string | undefined> {
    const ranged: FamilyState = {
      entries: [
        {
          family: 'ipv4',
          externalIp: '192.0.2.1',
          protocol: 'TCP',
          port: 80,
          clusterIp: '192.0.2.2',
          service: 'probe/probe',
          sourceRanges: ['192.0.2.0/31'],
        },
      ],
      localPodMatch: { kind: 'cidrs', cidrs: [] },
      sourceRanged: true,
    };
    try {
      await this.executor.check(writeTable(new Transaction(), desiredTable('ipv4', ranged, 0x4000, lookup)));
      return undefined;
    } catch (err) {
      return (err as Error).message;
    }
  }

  async probe(): Promise<ProbeResult> {
    try {
      const { lookup, why } = await this.keyLookup();
      for (const family of FAMILIES) await this.checkEmptyTable(family, lookup);
      const refused = await this.checkSourceRanges(lookup);
      this.capabilities.filtersSources = refused === undefined;
      const sources =
        refused === undefined
          ? 'source ranges filtered'
          : `source ranges not filtered: this kernel refuses the lookup of a concatenated interval set (${refused}), so Services with loadBalancerSourceRanges are left to kube-proxy`;
      return {
        ok: true,
        detail: `nftables via ${this.executor.kind}, keys looked up in the ${lookup} (${why}); ${sources}`,
        nftKeyLookup: lookup,
      };
    } catch (err) {
      return { ok: false, detail: `nftables cannot be programmed: ${(err as Error).message}` };
    }
  }

  /**
   * All of `operations` in one transaction; element changes of one family alone go to the
   * executor's element path where it has one (a netlink batch, without JSON).
   */
  async apply(operations: readonly DriverOperation[]): Promise<Applied> {
    const { lookup } = await this.keyLookup();
    const keySet = lookup === 'set' ? KEY_SET_NAME : undefined;
    const [only] = operations;
    // Entries with source ranges are written with their sets' elements, in one JSON transaction.
    const ranged = (entries: readonly KernelElement[]) => entries.some((e) => (e as Entry).sourceRanges);
    if (
      operations.length === 1 &&
      only?.kind === 'elements' &&
      this.executor.applyElements &&
      !ranged(only.remove) &&
      !ranged(only.add)
    ) {
      const removed = only.remove.map(listedElement);
      // An element listed in one of the map and the key set but not the other is removed from
      // where it is, which the JSON path writes (a batch removes each key from both).
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
    const rangedSetsMayExist = (family: Family) => this.sourceRanged.has(family);
    if (
      this.executor.writesElementBatches &&
      whole.length > 0 &&
      whole.length === operations.length &&
      whole.every((op) => !op.state.sourceRanged && !rangedSetsMayExist(op.family))
    ) {
      const applied = await this.writeByBatches(whole, lookup);
      if (applied) return applied;
    }
    const tx = new Transaction();
    for (const op of operations) addOperation(tx, op, lookup, rangedSetsMayExist);
    if (tx.size === 0) return {};
    const applied = (await this.executor.run(tx)) ?? {};
    for (const op of operations) {
      if (op.kind === 'writeFamily' || op.kind === 'replaceFamily') {
        if (op.state.sourceRanged) this.sourceRanged.add(op.family);
        else this.sourceRanged.delete(op.family);
      } else if (op.kind === 'removeAll') this.sourceRanged.clear();
    }
    return applied;
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
  private async writeByBatches(
    ops: ReadonlyArray<Extract<DriverOperation, { kind: 'writeFamily' }>>,
    lookup: KeyLookup,
  ) {
    const tx = new Transaction();
    for (const op of ops) writeTableButElements(tx, desiredTable(op.family, op.state, op.masqueradeMark, lookup));
    const keySet = lookup === 'set' ? KEY_SET_NAME : undefined;
    const commits: Array<NftCommit | void> = [];
    try {
      commits.push(await this.executor.run(tx));
      for (const op of ops) {
        const added = op.state.entries.map(mapElement);
        const target = { table: TABLE_NAME, map: MAP_NAME, keySet };
        commits.push(
          await this.executor.applyElements!(NFT_FAMILY[op.family], { removed: [], added, flush: true }, target),
        );
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
    const { lookup } = await this.keyLookup();
    const keySetName = lookup === 'set' ? KEY_SET_NAME : '';
    const lines = await expectedLines(expected);
    // The generation the listing will see, if nothing commits meanwhile: then a repair computed
    // from it leaves the kernel exactly as programmed.
    const generation = await this.executor.generation?.();
    const listed =
      how === 'alongside-writes' ? await this.listAlongside(family, lines, expected.length, keySetName) : undefined;
    if (listed === 'unfinished' || listed === 'not-alongside') return listed;
    const diff =
      listed ?? (await this.diff(await this.executor.listTable(NFT_FAMILY[family], TABLE_NAME), lines, keySetName));
    if (diff === undefined) throw new NftError('the table is missing');
    const table = desiredTable(family, shape.state, shape.masqueradeMark, lookup);
    const shapeDrift: string[] = [];
    for (const chain of table.chains) {
      const want = table.rules
        .filter((r) => r.chain === chain.name)
        .map((r) => JSON.stringify(ruleExpressions(this.json, r)));
      const have = diff.rules[chain.name] ?? [];
      if (want.length !== have.length || want.some((w, i) => w !== have[i])) shapeDrift.push(chain.name);
    }
    if (shape.state.sourceRanged) {
      const want = sourceRangeLines(expected);
      const have = diff.sourceRanges ?? { keys: [], sources: [] };
      const same = (a: string[], b: string[]) => a.length === b.length && [...b].sort().every((x, i) => x === a[i]);
      if (!same(want.keys, have.keys) || !same(want.sources, have.sources)) shapeDrift.push(SOURCE_RANGE_SET);
    }
    const read: ReadBack = {
      missing: diff.unmatched.map((i) => expected[i]!),
      foreign: [
        ...parseListedElements(family, diff.residue, diff.residueInKeySet),
        ...(diff.keyResidue ?? []).map((key) => keyOnlyElement(family, key)),
      ],
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
    keySetName: string,
  ): Promise<ListingDiff | 'unfinished' | 'not-alongside'> {
    const nf = NFT_FAMILY[family];
    const lister = this.lister!;
    const timeoutMs = Math.ceil(1_000 + entries / 10);
    try {
      let diff: ListingDiff | undefined;
      try {
        diff =
          lister instanceof NftCliExecutor && this.workers
            ? await listAndDiff(lister.binary, nf, TABLE_NAME, lines, MAP_NAME, timeoutMs, undefined, keySetName)
            : await this.diff(await lister.listTable(nf, TABLE_NAME, timeoutMs), lines, keySetName);
      } catch (err) {
        if (!(err instanceof ListingWorkerError)) throw err;
        // No worker threads here: compare on the event loop from now on.
        this.workers = false;
        diff = await this.diff(await lister.listTable(nf, TABLE_NAME, timeoutMs), lines, keySetName);
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

  private async diff(
    listing: string | undefined,
    expected: string,
    keySetName: string,
  ): Promise<ListingDiff | undefined> {
    if (listing === undefined) return undefined;
    try {
      return await diffListing(listing, expected, MAP_NAME, this.workers ? undefined : Infinity, keySetName);
    } catch (err) {
      if (!(err instanceof ListingWorkerError)) throw err;
      this.workers = false;
      return diffListing(listing, expected, MAP_NAME, Infinity, keySetName);
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
function addOperation(
  tx: Transaction,
  op: DriverOperation,
  lookup: KeyLookup,
  rangedSetsMayExist: (family: Family) => boolean,
): void {
  const changes = (family: Family, remove: readonly KernelElement[], add: readonly Entry[]) => {
    const inMap = remove.filter((e) => listedIn(e) !== 'keySet').map(listedElement);
    const inKeySet = remove.filter((e) => listedIn(e) !== 'map').map(listedElement);
    // A programmed entry removed is the Entry itself: its source-range elements go with it.
    const rangedRemoved = remove.filter((e): e is Entry => (e as Entry).sourceRanges !== undefined && !e.ref);
    sourceRangeChanges(tx, family, rangedRemoved, []);
    mapChanges(tx, family, inMap, add.map(mapElement), lookup, inKeySet);
    sourceRangeChanges(tx, family, [], add);
  };
  switch (op.kind) {
    case 'writeFamily':
      writeTable(tx, desiredTable(op.family, op.state, op.masqueradeMark, lookup, rangedSetsMayExist(op.family)));
      return;
    case 'replaceFamily':
      replaceTable(tx, desiredTable(op.family, op.state, op.masqueradeMark, lookup));
      return;
    case 'writeShape':
      resyncTable(tx, desiredTable(op.family, op.shape.state, op.shape.masqueradeMark, lookup));
      changes(op.family, op.remove, op.add);
      return;
    case 'elements':
      changes(op.family, op.remove, op.add);
      return;
    case 'repairShape': {
      const table = desiredTable(op.family, op.shape.state, op.shape.masqueradeMark, lookup);
      for (const chain of table.chains) if (op.parts.includes(chain.name)) rewriteRules(tx, table, chain);
      if (op.parts.includes(SOURCE_RANGE_SET) && op.shape.state.sourceRanged) {
        // Both sets written again from the programmed entries.
        const sets = table.sets.filter((s) => s.name === SOURCE_RANGE_SET || s.name === SOURCE_RANGED_KEY_SET);
        const elements = sourceRangeElements(op.family, op.entries);
        tx.add(...sets).flush(...sets);
        for (const e of [elements.keys, elements.sources]) if (e.elements.length > 0) tx.add(e);
      }
      return;
    }
    case 'removeAll':
      deleteTables(tx, FAMILIES);
      return;
  }
}

/**
 * Where a read back found an element (ListedRef): in the map and the key set ('both', also what
 * the elements we programmed are), or in one of them only.
 */
interface ListedRef {
  element: MapElement;
  in: 'both' | 'map' | 'keySet';
}

function listedIn(e: KernelElement): ListedRef['in'] {
  return (e.ref as ListedRef | undefined)?.in ?? 'both';
}

/** An element to delete: as it was listed when it was read back, else as we write it. */
function listedElement(e: KernelElement): MapElement {
  return (e.ref as ListedRef | undefined)?.element ?? mapElement(e as Entry);
}

type Json = unknown;

/**
 * A key of the key set that neither the map nor the programmed entries have: it translates
 * nothing (the DNAT finds no element), but marks the packets for masquerade, so it is removed.
 */
function keyOnlyElement(family: Family, key: readonly Json[]): KernelElement {
  const [ip, proto, port] = key as [string, string | number, number | string];
  const unspecified = family === 'ipv6' ? '::' : '0.0.0.0';
  return {
    family,
    externalIp: family === 'ipv6' ? (parseIp(ip)?.address ?? ip) : ip,
    protocol: (typeof proto === 'string' ? proto.toUpperCase() : proto) as never,
    port: Number(port),
    clusterIp: unspecified,
    ref: { element: { key: [ip, proto, port], value: unspecified }, in: 'keySet' } satisfies ListedRef,
  };
}

/** The expressions of a rule as nft JSON: what a listing shows of it. */
function ruleExpressions(json: JsonWriter, rule: RuleObject): unknown {
  const [command] = json.commands(new Transaction().add(rule));
  return (command!.add as { rule: { expr: unknown } }).rule.expr;
}

/**
 * Map elements as a listing shows them (`[key, value]` pairs), typed; `inKeySet[i]` says whether
 * the key set (when there is one) holds the key of `pairs[i]` too.
 */
function parseListedElements(family: Family, pairs: readonly Json[], inKeySet?: readonly boolean[]): KernelElement[] {
  const elements: KernelElement[] = [];
  for (const [i, pair] of pairs.entries()) {
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
      ref: {
        element: { key: [ip, proto, port], value },
        in: inKeySet?.[i] === false ? 'map' : 'both',
      } satisfies ListedRef,
    };
    if (wrapped?.comment !== undefined) element.service = wrapped.comment;
    elements.push(element);
  }
  return elements;
}
