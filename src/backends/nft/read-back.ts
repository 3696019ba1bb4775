// The nft driver's read back of one family: the table listed (`nft -j list table`), compared with
// the map elements and rules we programmed, and what differs named for the reconciler to repair
// (chains whose rules differ, the source-range sets, elements missing or foreign). Where the
// addon programs, the listing runs in another process (the nft command, from a worker) so that
// changes are never queued behind it; the elements it finds carry how to remove exactly them
// (ListedRef, element-diff.ts), which the driver's writes use.

import { ipBytes, listedAddress, parseIp } from '../../model/ip.js';
import type { Entry, Family } from '../../model/types.js';
import type { FamilyShape, KernelElement, ReadBack } from '../../driver/driver.js';
import { NftCliExecutor, NftError, NftTimeoutError, type NftExecutor } from './executor.js';
import {
  ListingWorkerError,
  diffListing,
  expectedLines,
  listAndDiff,
  sourceRangeLines,
  type ListingDiff,
} from './listing-diff.js';
import { JsonWriter, Transaction, type RuleObject } from './objects.js';
import {
  KEY_SET_NAME,
  MAP_NAME,
  NFT_FAMILY,
  SOURCE_CHAIN_PREFIX,
  SOURCE_CHECK_MAP,
  TABLE_NAME,
  desiredTable,
  sourceRangeObjects,
  type KeyLookup,
} from './render.js';
import type { ListedRef } from './element-diff.js';

/** Lists a table as `nft -j list table` prints it; NftCliExecutor is one. */
export interface NftLister {
  listTable(family: 'ip' | 'ip6', name: string, timeoutMs?: number): Promise<string | undefined>;
  /** The table's named counters as `nft -j list counters table` prints them; undefined: no table. */
  listCounters?(family: 'ip' | 'ip6', table: string, timeoutMs: number): Promise<string | undefined>;
}

export class NftReader {
  private readonly json = new JsonWriter();
  /** False once a worker thread could not be used: listings are then compared on the event loop. */
  private workers = true;

  constructor(
    private readonly executor: NftExecutor,
    /** Lists without holding back our writes (the nft command); undefined: list between writes. */
    private lister: NftLister | undefined,
  ) {}

  /** Driver.readBack; `keyLookup` gives the key lookup in use. */
  async readBack(
    family: Family,
    expected: readonly Entry[],
    shape: FamilyShape,
    how: 'alongside-writes' | 'between-writes',
    keyLookup: () => Promise<{ lookup: KeyLookup }>,
  ): Promise<ReadBack | 'unfinished' | 'not-alongside'> {
    if (how === 'alongside-writes' && !this.lister) return 'not-alongside';
    const { lookup } = await keyLookup();
    const keySetName = lookup === 'set' ? KEY_SET_NAME : '';
    const lines = await expectedLines(expected);
    // The generation the listing will see, if nothing commits meanwhile: then a repair computed
    // from it leaves the kernel exactly as programmed.
    const generation = await this.executor.generation();
    // Between our writes too, the nft command lists where there is one: its listing has a time
    // bound (a process we can stop), where libnftables in the addon starts a listing again for as
    // long as another process commits, and holds the addon's lock, so our writes, meanwhile.
    let listed = this.lister ? await this.listByCommand(family, lines, expected.length, keySetName) : undefined;
    if (listed === 'not-alongside' && how === 'between-writes') listed = undefined;
    if (listed === 'unfinished' || listed === 'not-alongside') return listed;
    const diff =
      listed ?? (await this.diff(await this.executor.listTable(NFT_FAMILY[family], TABLE_NAME), lines, keySetName));
    if (diff === undefined) throw new NftError('the table is missing');
    const table = desiredTable(family, shape.state, shape.masqueradeMark, lookup);
    const sources = sourceRangeObjects(family, expected);
    const shapeDrift: string[] = [];
    // Every chain's rules, the Services' source-range chains among them (an anonymous set of
    // ranges compared as the addresses it holds: nft lists adjacent ranges merged).
    for (const chain of [...table.chains, ...sources.chains]) {
      const rules = chain.name.startsWith(SOURCE_CHAIN_PREFIX) ? sources.rules : table.rules;
      const want = rules
        .filter((r) => r.chain === chain.name)
        .map((r) => canonicalRule(JSON.stringify(ruleExpressions(this.json, r))));
      const have = (diff.rules[chain.name] ?? []).map(canonicalRule);
      if (want.length !== have.length || want.some((w, i) => w !== have[i])) shapeDrift.push(chain.name);
    }
    // A Service's chain nothing wants (its Service gone while a write failed, say): removed.
    const wanted = new Set(sources.chains.map((c) => c.name));
    for (const name of diff.chains ?? []) {
      if (name.startsWith(SOURCE_CHAIN_PREFIX) && !wanted.has(name)) shapeDrift.push(name);
    }
    const want = sourceRangeLines(expected);
    const have = diff.sourceRanges ?? { checks: [], own: [] };
    const same = (a: string[], b: string[]) => a.length === b.length && [...b].sort().every((x, i) => x === a[i]);
    if (!same(want.checks, have.checks) || !same(want.own, have.own)) shapeDrift.push(SOURCE_CHECK_MAP);
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
   * not finish within its time bound ('unfinished'). Alongside our writes or between them.
   */
  private async listByCommand(
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
    externalIp: listedAddress(ip),
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
    // nft prints addresses as inet_ntop does: mixed notation (`::1.2.3.4`) where the model does not.
    const address = listedAddress(ip);
    const protocol = typeof proto === 'string' ? proto.toUpperCase() : proto;
    const element: KernelElement = {
      family,
      externalIp: address,
      protocol: protocol as never,
      port: Number(port),
      clusterIp: listedAddress(value),
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

/**
 * A rule's expressions as JSON text, with every anonymous set of addresses written as the merged
 * intervals it holds: nft lists `{ 10.0.0.0/25, 10.0.0.128/25 }` as `10.0.0.0/24`, and a set of
 * one as its element.
 */
function canonicalRule(text: string): string {
  if (!text.includes('"saddr"')) return text;
  const expressions = JSON.parse(text) as unknown[];
  return JSON.stringify(
    expressions.map((e) => {
      const match = (e as { match?: { op?: string; left?: { payload?: { field?: string } }; right?: unknown } }).match;
      if (!match || match.left?.payload?.field !== 'saddr') return e;
      const intervals = addressIntervals(match.right);
      return intervals === undefined ? e : { match: { ...match, right: { intervals } } };
    }),
  );
}

/** `start-end` (numbers) per merged interval of a set, prefix, range or address; undefined for anything else. */
function addressIntervals(right: unknown): string[] | undefined {
  const items = (right as { set?: unknown[] } | undefined)?.set ?? [right];
  const spans: Array<[bigint, bigint]> = [];
  for (const item of items) {
    const span = addressSpan(item);
    if (!span) return undefined;
    spans.push(span);
  }
  spans.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  const merged: Array<[bigint, bigint]> = [];
  for (const [start, end] of spans) {
    const last = merged[merged.length - 1];
    if (last && start <= last[1] + 1n) last[1] = end > last[1] ? end : last[1];
    else merged.push([start, end]);
  }
  return merged.map(([a, b]) => `${a}-${b}`);
}

function addressSpan(item: unknown): [bigint, bigint] | undefined {
  const value = (text: unknown): [bigint, number] | undefined => {
    const ip = parseIp(typeof text === 'string' ? listedAddress(text) : text);
    if (!ip) return undefined;
    const bytes = ipBytes(ip);
    return [bytes.reduce((n, b) => (n << 8n) | BigInt(b), 0n), bytes.length * 8];
  };
  if (typeof item === 'string') {
    const v = value(item);
    return v && [v[0], v[0]];
  }
  const prefix = (item as { prefix?: { addr?: unknown; len?: unknown } }).prefix;
  if (prefix && typeof prefix.len === 'number') {
    const v = value(prefix.addr);
    if (!v || prefix.len < 0 || prefix.len > v[1]) return undefined;
    const host = (1n << BigInt(v[1] - prefix.len)) - 1n;
    return [v[0] & ~host, v[0] | host];
  }
  const range = (item as { range?: unknown[] }).range;
  if (Array.isArray(range) && range.length === 2) {
    const a = value(range[0]);
    const b = value(range[1]);
    return a && b ? [a[0], b[0]] : undefined;
  }
  return undefined;
}
