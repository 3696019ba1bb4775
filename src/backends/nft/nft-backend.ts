// The nftables backend: tables `ip ipvs-node-controller` and `ip6 ipvs-node-controller`.
//
// - The first sync writes both tables in one transaction that declares every object, rewrites
//   our chains' rules and refills the map: the table and the base chains packets cross are never
//   removed (a table replaced under traffic loses new connections' first packets).
// - Between full syncs only the map elements that changed are written (one transaction).
// - A periodic full sync (resync) rewrites the small parts (chains, rules, the pod set) in one
//   transaction without touching the map's elements, then verifies the elements: it lists the map
//   (through the nft command when the addon programs: another process, so changes are never
//   queued behind the listing), and repairs only what drifted. Partial syncs may run meanwhile.
// - The verification is skipped when nothing but this process has committed since the kernel was
//   last known to hold exactly what was programmed: the executor reads the ruleset generation
//   (nf_tables' NFT_MSG_GETGEN) around each commit, and a commit that moved it by exactly one was
//   ours alone. Any other writer (nft, iptables-nft, another agent) moves it, and the next resync
//   lists and repairs. The nft command cannot tell, so through it every resync verifies.
// - When a partial transaction or a resync fails (someone removed or changed the table, say),
//   the family falls back to a full sync; when that fails too, the table is replaced.

import { FAMILIES, type DesiredState, type Family, type FamilyState } from '../../model/types.js';
import { parseIp } from '../../model/ip.js';
import {
  BackendError,
  type Backend,
  type EntryCapacity,
  type ProbeResult,
  type SyncOptions,
  type SyncResult,
} from '../backend.js';
import { ElementStorage, entryKey, isEmpty, type ElementChanges } from '../element-storage.js';
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
  type DesiredTable,
} from './render.js';

interface Programmed {
  elements: ElementStorage;
  /** The table's objects but the map elements, as programmed: what a resync verifies the rules against. */
  table: DesiredTable;
  /** Everything but the map elements, compared to decide whether a partial sync is possible. */
  shape: string;
  /** The size the map was declared with: more entries need the map replaced (a full write). */
  mapSize: number;
}

/** Elements written by partial syncs after which freed memory is handed back at once. */
const RELEASE_AFTER_ELEMENTS = 5000;

/** Verifications skipped in a row (the listing could not finish) before one holds back our writes. */
const MAX_SKIPPED_VERIFICATIONS = 10;
const SKIPPED = Symbol('skipped');

function shapeOf(state: FamilyState, mark: number): string {
  return JSON.stringify([state.localPodMatch, mark]);
}

/** Why a family that was asked for a partial sync got a full one (the `fallback_reason` label). */
export type FallbackReason = 'not-programmed' | 'table-shape-changed' | 'partial-failed';

export interface NftBackendOptions {
  /**
   * Lists the table for a resync's verification, in another process so that partial syncs go on
   * meanwhile (the addon runs one command at a time). Default: the nft command (the executor
   * itself when it is the nft command); for another executor, it lists between our writes.
   */
  lister?: NftLister;
}

/** Lists a table as `nft -j list table` prints it; NftCliExecutor is one. */
export interface NftLister {
  listTable(family: 'ip' | 'ip6', name: string, timeoutMs?: number): Promise<string | undefined>;
}

/** An element read back from the kernel map. */
interface ListedElement {
  key: string;
  value: string;
  comment?: string;
  element: MapElement;
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

export class NftBackend implements Backend {
  readonly name = 'nft' as const;
  readonly capacity = NFT_CAPACITY;
  readonly partialSyncsDuringFull = true;
  /** What this process last programmed, per family; absent until a full sync succeeded. */
  private readonly programmed = new Map<Family, Programmed>();
  private readonly json = new JsonWriter();
  /** Transactions run one at a time, in the order they were asked for. */
  private queue: Promise<unknown> = Promise.resolve();
  /** Keys written per family while a verification listing was under way: not judged by it. */
  private readonly writtenDuringListing = new Map<Family, Set<string>>();
  /** Bumped whenever a family's table is written whole: a verification begun before is void. */
  private generation = 0;
  /** Lists without holding back our writes (the nft command); undefined: list between writes. */
  private lister: NftLister | undefined;
  /** False once a worker thread could not be used: listings are then compared on the event loop. */
  private workers = true;
  /** Verifications skipped in a row per family because the listing could not finish. */
  private readonly skippedVerifications = new Map<Family, number>();
  /**
   * Per family, a ruleset generation at which the kernel held exactly what `programmed` says,
   * carried forward through commits that were ours alone; absent: unknown, verify.
   */
  private readonly trustedAt = new Map<Family, number>();
  /** Elements partial syncs wrote since freed memory was last handed back. */
  private writtenSinceRelease = 0;
  /** Resyncs answered by the generation alone, without listing (the tests read it). */
  verificationsSkipped = 0;

  constructor(
    readonly executor: NftExecutor,
    options: NftBackendOptions = {},
  ) {
    this.lister =
      options.lister ??
      (executor.kind === 'addon' ? new NftCliExecutor() : executor instanceof NftCliExecutor ? executor : undefined);
  }

  async probe(): Promise<ProbeResult> {
    // A check-mode full sync of an empty state: proves the nft userspace, the nat hooks, fib and
    // concatenated maps in this kernel, and the permission to program them.
    const empty: FamilyState = { entries: [], localPodMatch: { kind: 'cidrs', cidrs: [] } };
    try {
      for (const family of FAMILIES) {
        await this.executor.check(
          this.json.document(writeTable(new Transaction(), desiredTable(family, empty, 0x4000))),
        );
      }
      return { ok: true, detail: `nftables via ${this.executor.kind}` };
    } catch (err) {
      return { ok: false, detail: `nftables cannot be programmed: ${(err as Error).message}` };
    }
  }

  async sync(desired: DesiredState, options: SyncOptions): Promise<SyncResult> {
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
      const before = this.programmed.get(family);
      if (!before) fallBack(family, 'not-programmed');
      else if (before.shape !== shapeOf(desired[family], mark) || desired[family].entries.length > before.mapSize)
        fallBack(family, 'table-shape-changed');
      else if (options.full) resync.push(family);
      else {
        const mode = await this.exclusive(() => this.syncChangedElements(family, desired[family]));
        if (mode) modes.push(mode);
        else fallBack(family, 'partial-failed');
      }
    }
    const verify: Family[] = [];
    for (const family of resync) {
      const outcome = await this.exclusive(() => this.resync(family, desired[family], mark));
      if (outcome === 'verify') verify.push(family);
      else if (outcome === 'untouched') modes.push('full');
      else rewrite.push(family);
    }
    if (rewrite.length > 0) {
      for (const failure of await this.exclusive(() => this.rewrite(rewrite, desired))) failures.push(failure);
      modes.push('full');
    }
    let repaired = 0;
    for (const family of verify) {
      try {
        repaired += await this.verifyElements(family);
        modes.push('full');
      } catch (err) {
        failures.push(`${NFT_FAMILY[family]}: verifying the map: ${(err as Error).message}`);
      }
    }
    // A table written whole or verified (the start, every --sync-period, a fallback), or many
    // elements written (a large Service), follows large frees: a list, a rewrite, a listing,
    // libnftables' parse of the document (about 4 KiB per element). glibc keeps freed memory of
    // its arenas until told; kept, a 100,000-element change would hold about 250 MiB until the next
    // resync.
    if (modes.includes('full') || this.writtenSinceRelease >= RELEASE_AFTER_ELEMENTS) {
      this.writtenSinceRelease = 0;
      await this.releaseMemory().catch(() => undefined);
    }
    if (failures.length > 0) throw new BackendError(`nft sync failed: ${failures.join('; ')}`, 'nft');
    const result: SyncResult = {
      mode: modes.includes('full') ? 'full' : modes.includes('partial') ? 'partial' : 'noop',
      entries: { ipv4: desired.ipv4.entries.length, ipv6: desired.ipv6.entries.length },
    };
    if (fallbackReason) result.fallbackReason = fallbackReason;
    if (repaired > 0) result.repairedElements = repaired;
    return result;
  }

  /** Runs `work` after every transaction asked for before it. */
  private exclusive<T>(work: () => Promise<T>): Promise<T> {
    const run = this.queue.then(work, work);
    this.queue = run.catch(() => undefined);
    return run;
  }

  /**
   * Commits `tx`. `exact`: families whose table the commit leaves exactly as programmed whatever
   * they held before (a whole write), or, with `since`, provided the ruleset was at that
   * generation just before (a repair computed from a listing taken there).
   */
  private async apply(
    tx: Transaction,
    exact: { families: Family[]; since?: number } = { families: [] },
  ): Promise<void> {
    if (tx.size === 0) return;
    await this.commit(() => this.executor.run(this.json.document(tx)), exact);
  }

  /**
   * Commits map element changes alone: as a netlink batch when the executor writes them so
   * (the addon with libnftnl), else as the same JSON transaction.
   */
  private async applyElements(family: Family, removed: MapElement[], added: MapElement[]): Promise<void> {
    if (removed.length === 0 && added.length === 0) return;
    const executor = this.executor;
    if (!executor.applyElements) return this.apply(mapChanges(new Transaction(), family, removed, added));
    await this.commit(() => executor.applyElements!(NFT_FAMILY[family], { removed, added }));
  }

  /** Runs one commit and carries the trusted generations through it (see apply). */
  private async commit(
    run: () => Promise<NftCommit | void>,
    exact: { families: Family[]; since?: number } = { families: [] },
  ): Promise<void> {
    let commit: NftCommit | void;
    try {
      commit = await run();
    } catch (err) {
      this.trustedAt.clear();
      throw err;
    }
    const g = commit?.generations;
    const oursAlone = g !== undefined && g.after === g.before + 1;
    for (const family of FAMILIES) {
      const carried = this.trustedAt.get(family) === g?.before;
      const madeExact = exact.families.includes(family) && (exact.since === undefined || exact.since === g?.before);
      if (oursAlone && (carried || madeExact)) this.trustedAt.set(family, g.after);
      else this.trustedAt.delete(family);
    }
  }

  /** True when the kernel still holds exactly what was programmed for `family` (nobody else wrote). */
  private async untouched(family: Family): Promise<boolean> {
    const trusted = this.trustedAt.get(family);
    if (trusted === undefined || !this.executor.generation) return false;
    return (await this.executor.generation()) === trusted;
  }

  private noteWritten(family: Family, changes: Pick<ElementChanges, 'removed' | 'added'>): void {
    const written = this.writtenDuringListing.get(family);
    if (!written) return;
    for (const e of changes.removed) written.add(entryKey(e));
    for (const e of changes.added) written.add(entryKey(e));
  }

  /**
   * A partial sync of one family: only the map elements that changed. Undefined when the kernel
   * refused them (it no longer holds what we programmed): the family needs a full sync.
   */
  private async syncChangedElements(family: Family, state: FamilyState): Promise<'partial' | 'noop' | undefined> {
    const before = this.programmed.get(family);
    if (!before) return undefined;
    const changes = before.elements.changesTo(state);
    if (!isEmpty(changes)) {
      try {
        await this.applyElements(family, changes.removed.map(mapElement), changes.added.map(mapElement));
      } catch {
        this.programmed.delete(family);
        return undefined;
      }
      this.noteWritten(family, changes);
      this.writtenSinceRelease += changes.removed.length + changes.added.length;
    }
    before.elements.commit(state, changes);
    return isEmpty(changes) ? 'noop' : 'partial';
  }

  /**
   * The periodic resync of one family whose table has the right shape. When nobody else has
   * committed since the kernel last held exactly what was programmed, only the element changes
   * since the last sync are written ('untouched'). Otherwise chains, rules and the pod set are
   * rewritten with those changes in one transaction, and the map's other elements are verified
   * afterwards ('verify'). False when the kernel refused it.
   */
  private async resync(family: Family, state: FamilyState, mark: number): Promise<'verify' | 'untouched' | false> {
    const before = this.programmed.get(family);
    if (!before) return false;
    const changes = before.elements.changesTo(state);
    const untouched = await this.untouched(family);
    const removed = changes.removed.map(mapElement);
    const added = changes.added.map(mapElement);
    try {
      if (untouched) await this.applyElements(family, removed, added);
      else
        await this.apply(
          mapChanges(
            resyncTable(new Transaction(), desiredTable(family, { ...state, entries: [] }, mark)),
            family,
            removed,
            added,
          ),
        );
    } catch {
      this.programmed.delete(family);
      return false;
    }
    this.noteWritten(family, changes);
    before.elements.commit(state, changes);
    if (!untouched) return 'verify';
    this.verificationsSkipped++;
    return 'untouched';
  }

  /**
   * Writes the tables of `families` whole, keeping the tables and base chains: all in one
   * transaction, else one per family (one family's problem neither blocks the other nor goes
   * unreported), and a family whose objects were changed so that they cannot be declared again
   * gets its table replaced. Returns the failures.
   */
  private async rewrite(families: Family[], desired: DesiredState): Promise<string[]> {
    this.generation++;
    for (const family of families) this.programmed.delete(family);
    const mark = desired.masqueradeMark;
    const table = (family: Family) => desiredTable(family, desired[family], mark);
    const record = (family: Family) =>
      this.programmed.set(family, {
        elements: new ElementStorage(desired[family]),
        table: desiredTable(family, { ...desired[family], entries: [] }, mark),
        shape: shapeOf(desired[family], mark),
        mapSize: mapSize(desired[family].entries.length),
      });
    const together = new Transaction();
    for (const family of families) writeTable(together, table(family));
    try {
      await this.apply(together, { families });
      families.forEach(record);
      return [];
    } catch {
      // one by one below
    }
    const failures: string[] = [];
    for (const family of families) {
      try {
        try {
          await this.apply(writeTable(new Transaction(), table(family)), { families: [family] });
        } catch {
          await this.apply(replaceTable(new Transaction(), table(family)), { families: [family] });
        }
        record(family);
      } catch (err) {
        failures.push(`${NFT_FAMILY[family]}: ${(err as Error).message}`);
      }
    }
    return failures;
  }

  /**
   * Lists the family's table and repairs the rules and map elements that differ from what was
   * programmed. Elements written by partial syncs while the listing ran are left to the next
   * verification. Returns how many elements and chains were repaired.
   */
  private async verifyElements(family: Family): Promise<number> {
    const generation = this.generation;
    const written = new Set<string>();
    this.writtenDuringListing.set(family, written);
    // What partial syncs write from now on is in `written` and left out below, so the elements
    // can be taken now; the comparison runs off the event loop, outside our write queue.
    const snapshot = [...(this.programmed.get(family)?.elements.values() ?? [])];
    const expected = await expectedLines(snapshot);
    // The generation the listing will see, if nothing commits meanwhile: then the repair below
    // leaves the kernel exactly as programmed, and later resyncs need not list.
    const listedAt = await this.executor.generation?.();
    let diff: ListingDiff | undefined | typeof SKIPPED;
    try {
      diff = await this.listAndCompare(family, expected, snapshot.length);
    } catch (err) {
      this.writtenDuringListing.delete(family);
      throw err;
    }
    return this.exclusive(async () => {
      // Every partial sync that may have committed after the listing has noted its keys by now.
      this.writtenDuringListing.delete(family);
      const programmed = this.programmed.get(family);
      if (generation !== this.generation || !programmed || diff === SKIPPED) return 0;
      if (diff === undefined) throw new NftError('the table is missing');
      const listed = parseListedElements(family, diff.residue);
      const tx = new Transaction();
      let repairs = 0;
      for (const chain of programmed.table.chains) {
        const want = programmed.table.rules
          .filter((r) => r.chain === chain.name)
          .map((r) => JSON.stringify(ruleExpressions(this.json, r)));
        const have = diff.rules[chain.name] ?? [];
        if (want.length !== have.length || want.some((w, i) => w !== have[i])) {
          rewriteRules(tx, programmed.table, chain);
          repairs++;
        }
      }
      const removed: MapElement[] = [];
      const added: MapElement[] = [];
      for (const i of diff.unmatched) {
        const e = snapshot[i]!;
        const key = entryKey(e);
        if (written.has(key)) continue;
        const kernel = listed.get(key);
        listed.delete(key);
        if (kernel && kernel.value === e.clusterIp && kernel.comment === e.service) continue;
        if (kernel) removed.push(kernel.element);
        added.push(mapElement(e));
      }
      for (const [key, kernel] of listed) if (!written.has(key)) removed.push(kernel.element);
      mapChanges(tx, family, removed, added);
      repairs += removed.length + added.length;
      const exact = listedAt !== undefined ? { families: [family], since: listedAt } : undefined;
      if (tx.size === 0) {
        if (listedAt !== undefined && (await this.executor.generation?.()) === listedAt)
          this.trustedAt.set(family, listedAt);
        return 0;
      }
      try {
        await this.apply(tx, exact);
      } catch (err) {
        this.programmed.delete(family);
        throw err;
      }
      return repairs;
    });
  }

  /**
   * The listing compared with `expected` (expectedLine per element). Through the nft command
   * (another process, run from a worker) when the addon programs, so that partial syncs go on
   * meanwhile; but nft starts a listing again whenever the ruleset changes under it, so while
   * changes flow it may not finish: then the verification is skipped, up to
   * MAX_SKIPPED_VERIFICATIONS times in a row, after which the listing runs between our own writes
   * (changes wait for it, once). Undefined: the table does not exist.
   */
  private async listAndCompare(
    family: Family,
    expected: string,
    entries: number,
  ): Promise<ListingDiff | undefined | typeof SKIPPED> {
    const nf = NFT_FAMILY[family];
    const skipped = this.skippedVerifications.get(family) ?? 0;
    if (this.lister && skipped < MAX_SKIPPED_VERIFICATIONS) {
      const timeoutMs = Math.ceil(1_000 + entries / 10);
      try {
        let diff: ListingDiff | undefined;
        try {
          diff =
            this.lister instanceof NftCliExecutor && this.workers
              ? await listAndDiff(this.lister.binary, nf, TABLE_NAME, expected, MAP_NAME, timeoutMs)
              : await this.diff(await this.lister.listTable(nf, TABLE_NAME, timeoutMs), expected);
        } catch (err) {
          if (!(err instanceof ListingWorkerError)) throw err;
          // No worker threads here: compare on the event loop from now on.
          this.workers = false;
          diff = await this.diff(await this.lister.listTable(nf, TABLE_NAME, timeoutMs), expected);
        }
        this.skippedVerifications.delete(family);
        return diff;
      } catch (err) {
        if (err instanceof NftTimeoutError) {
          this.skippedVerifications.set(family, skipped + 1);
          return SKIPPED;
        }
        if (!/not found/.test((err as Error).message)) throw err;
        // No nft command beside the addon: list between our writes.
        this.lister = undefined;
      }
    }
    this.skippedVerifications.delete(family);
    return this.diff(await this.exclusive(() => this.executor.listTable(nf, TABLE_NAME)), expected);
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

  async cleanup(): Promise<void> {
    this.programmed.clear();
    this.trustedAt.clear();
    this.generation++;
    try {
      await this.exclusive(() => this.apply(deleteTables(new Transaction(), FAMILIES)));
    } catch (err) {
      throw new BackendError(`nft cleanup failed: ${(err as Error).message}`, 'nft');
    }
  }

  /** Whether any of our tables exists in the kernel (used to find leftovers of another backend choice). */
  async hasState(): Promise<boolean> {
    for (const family of FAMILIES) {
      if ((await this.executor.listTable(NFT_FAMILY[family], TABLE_NAME)) !== undefined) return true;
    }
    return false;
  }
}

type Json = unknown;

/** The expressions of a rule as nft JSON: what a listing shows of it. */
function ruleExpressions(json: JsonWriter, rule: RuleObject): unknown {
  const [command] = json.commands(new Transaction().add(rule));
  return (command!.add as { rule: { expr: unknown } }).rule.expr;
}

/** The map elements (by entry key) and the rules (expressions by chain) of `nft -j list table`. */
export function parseTableListing(
  family: Family,
  listing: string,
): { elements: Map<string, ListedElement>; rules: Map<string, unknown[]> } {
  let elements = new Map<string, ListedElement>();
  const rules = new Map<string, unknown[]>();
  const doc = JSON.parse(listing) as { nftables?: Array<Record<string, Json>> };
  for (const item of doc.nftables ?? []) {
    const rule = item.rule as { chain?: string; expr?: unknown } | undefined;
    if (rule?.chain !== undefined) {
      const list = rules.get(rule.chain) ?? [];
      list.push(rule.expr);
      rules.set(rule.chain, list);
    }
    const map = item.map as { name?: string; elem?: Json[] } | undefined;
    if (map?.name === MAP_NAME) elements = parseListedElements(family, map.elem ?? []);
  }
  return { elements, rules };
}

/** Map elements as a listing shows them (`[key, value]` pairs), by entry key. */
function parseListedElements(family: Family, pairs: readonly Json[]): Map<string, ListedElement> {
  const elements = new Map<string, ListedElement>();
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
    const key = entryKey({ family, externalIp: address, protocol: protocol as never, port: Number(port) });
    elements.set(key, {
      key,
      value: family === 'ipv6' ? (parseIp(value)?.address ?? value) : value,
      comment: wrapped?.comment,
      // Deleted by key: written back as it was read.
      element: { key: [ip, proto, port], value },
    });
  }
  return elements;
}
