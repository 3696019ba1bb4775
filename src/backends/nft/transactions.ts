// The transactions made of our tables' objects (render.ts): the full sync (writeTable, or
// writeTableButElements and a netlink batch), the periodic resync, the repair of a chain, the
// replacement, the partial sync's element changes, the cleanup; and the executors' element writes
// as JSON (elementsTransaction, differenceTransaction). Pure: no I/O.

import type { Entry, Family } from '../../model/types.js';
import { sourceRangeDifference, type MapDifference, type SourceRangeSets } from './element-diff.js';
import {
  Transaction,
  type ChainObject,
  type ElementObject,
  type MapElement,
  type MapObject,
  type NftFamily,
  type SetObject,
  type VerdictElement,
} from './objects.js';
import {
  KEY_SET_NAME,
  OWN_SOURCE_SET,
  SOURCE_CHAIN_PREFIX,
  SOURCE_CHECK_MAP,
  keySetElements,
  mapElements,
  sourceRangeObjects,
  tableObjects,
  type DesiredTable,
  type KeyLookup,
  type SourceRangeObjects,
} from './render.js';

/** Element removals and additions of one map, written as one transaction (removals first). */
export interface MapElementChanges {
  removed: readonly MapElement[];
  added: readonly MapElement[];
  /** Every other element of the map removed too, in the same transaction: it then holds `added`. */
  flush?: boolean;
}

/** Which map the executor's element writes (applyElements, replaceElements) write: the controller's own map by default. */
export interface MapTarget {
  table: string;
  map: string;
  /**
   * A set that holds the map's keys (the `set` key lookup): each change is made to it too, in
   * the same transaction, and a flush empties it too.
   */
  keySet?: string;
}

/**
 * What a family's sets and map hold, where it is known (read before the write): a whole write
 * then writes them their difference (element-diff.ts) instead of emptying and filling them again.
 */
export interface HeldContents {
  /** The source-range check map's and own-address set's elements. */
  sourceRanges?: SourceRangeSets;
  /** The names of the Services' source-range chains the table has. */
  sourceChains?: readonly string[];
  /** The changes that bring the map and its key set to the state's entries. */
  map?: MapDifference;
}

/**
 * Brings one family's table to `t` without removing the table or the chains packets cross:
 * declares every object (`add` keeps what exists), flushes and rewrites our chains' rules,
 * writes the source-range sets (their difference with what they hold when it is known, else
 * flushed and filled again), brings the map and its key set to the entries (their difference
 * when it is known, else replaced: so that the map has the size of `t`, whatever it had), and
 * removes our objects this state has no use for. One atomic transaction: packets see the old
 * table or the new one.
 */
export function writeTable(tx: Transaction, t: DesiredTable, held: HeldContents = {}): Transaction {
  return writeObjects(tx, t, held.map ?? 'replaced', held);
}

/**
 * writeTable without the map's elements: the map is declared (`add` keeps an existing one and
 * its elements), everything else is written as writeTable writes it. The elements follow in a
 * second transaction that brings the map to them (a netlink batch: the difference with what it
 * holds, or a flush and every element); until then packets meet the new rules and the map as
 * it was.
 */
export function writeTableButElements(tx: Transaction, t: DesiredTable, held: HeldContents = {}): Transaction {
  return writeObjects(tx, t, 'kept', held);
}

function writeObjects(
  tx: Transaction,
  t: DesiredTable,
  map: 'replaced' | 'kept' | MapDifference,
  held: HeldContents = {},
): Transaction {
  const all = tableObjects(t.table.family === 'ip' ? 'ipv4' : 'ipv6');
  // The map and the key set hold the entries: replaced together, or kept together (and their
  // elements written apart, or their difference here). The source-range check map and its set
  // are written as a difference when what they hold is known, else flushed and filled again. A
  // set flushed and filled again, or a map replaced, loses lookups of the elements that stay
  // while the transaction commits (element-diff.ts); a set replaced with the rules that name it
  // does not.
  const keyed: Array<MapObject | SetObject> = [...t.maps, ...t.sets].filter(
    (o) => o.name !== SOURCE_CHECK_MAP && o.name !== OWN_SOURCE_SET && (o.kind === 'map' || o.name === KEY_SET_NAME),
  );
  const sources = held.sourceRanges;
  const checkObjects = [...t.maps, ...t.sets].filter((o) => o.name === SOURCE_CHECK_MAP || o.name === OWN_SOURCE_SET);
  const otherSets = t.sets.filter(
    (s) => s.name !== KEY_SET_NAME && (sources === undefined || s.name !== OWN_SOURCE_SET),
  );
  tx.add(t.table, ...t.counters, ...t.maps, ...t.sets);
  // Our chains that exist now are emptied first: a rule of the old state may name the pod set,
  // and every rule names the map or the key set, which can only be deleted once no rule does.
  // A Service's source-range chain that nothing wants any more goes too (once no element jumps
  // to it: after the check map's elements, below).
  const wantedChains = new Set(t.chains.map((c) => c.name));
  const staleChains: ChainObject[] = (held.sourceChains ?? [])
    .filter((name) => !wantedChains.has(name))
    .map((name) => ({ kind: 'chain', family: t.table.family, table: t.table.name, name }));
  const unwantedChains = [...t.unwanted.filter((o): o is ChainObject => o.kind === 'chain'), ...staleChains];
  tx.add(...t.chains, ...unwantedChains);
  tx.flush(...all.chains, ...t.chains.filter((c) => c.name.startsWith(SOURCE_CHAIN_PREFIX)), ...staleChains);
  tx.flush(...otherSets);
  if (sources === undefined) tx.flush(...checkObjects.filter((o): o is MapObject => o.kind === 'map'));
  // Replaced rather than flushed: whether a kernel takes a new size for a map that exists varies
  // (6.18 does), and a deletion is one transaction entry where a flush is one per element.
  if (map === 'replaced') tx.delete(...keyed).add(...keyed);
  // Rules before elements: the kernel checks every element of a map when a rule that reads data
  // from it is added (nf_tables_bind_set walks the map), so the map should be empty by then
  // (50,000 elements: 3% of the transaction).
  const written: Array<ElementObject | undefined> = [
    ...(map === 'replaced' ? [] : [t.mapElements, t.keySetElements]),
    ...(sources ? [t.sourceRanges.checks, t.sourceRanges.own] : []),
  ];
  tx.add(...t.rules, ...t.elements.filter((e) => !written.includes(e)));
  if (sources) sourceRangeSetChanges(tx, t.sourceRanges, sources);
  if (typeof map === 'object') {
    const family = t.table.family === 'ip' ? 'ipv4' : 'ipv6';
    mapChanges(tx, family, map.removed, map.added, t.lookup, map.keysRemoved, map.keysAdded);
  }
  // Declared, then deleted: `delete` alone fails on what does not exist.
  const unwantedSets = t.unwanted.filter((o): o is SetObject => o.kind === 'set');
  tx.add(...unwantedSets);
  tx.delete(...unwantedChains, ...unwantedSets);
  return tx;
}

/**
 * The first step of a periodic resync of a table that has the shape of `t`: declares the chains
 * again (which fails on a changed hook or priority, and puts back the policy). The rules (the
 * pod CIDRs among them) and the map elements are verified against a listing afterwards: a rule
 * rewritten at every resync would also make every `nft monitor` lose track of the sets.
 * A missing table, set or chain fails the transaction, and the caller rewrites the table.
 */
export function resyncTable(tx: Transaction, t: DesiredTable): Transaction {
  return tx.add(...t.chains);
}

/** Rewrites the rules of one chain. */
export function rewriteRules(tx: Transaction, t: DesiredTable, chain: ChainObject): Transaction {
  return tx.flush(chain).add(...t.rules.filter((r) => r.chain === chain.name));
}

/** Replaces the table: the last resort, when an object of ours was changed so `add` cannot fit it. */
export function replaceTable(tx: Transaction, t: DesiredTable): Transaction {
  tx.add(t.table).delete(t.table).add(t.table);
  for (const o of [...t.counters, ...t.maps, ...t.sets, ...t.chains]) tx.add(o);
  // Rules before elements, as in writeTable.
  return tx.add(...t.rules, ...t.elements);
}

/**
 * Entry changes only: deletions first, then additions, in one transaction; with the `set` lookup,
 * of the key set too (`keysRemoved`: the removals whose key the set holds, by default all).
 */
export function mapChanges(
  tx: Transaction,
  family: Family,
  removed: readonly MapElement[],
  added: readonly MapElement[],
  lookup: KeyLookup = 'map',
  keysRemoved: readonly MapElement[] = removed,
  keysAdded: readonly MapElement[] = added,
): Transaction {
  if (lookup === 'set' && keysRemoved.length > 0) tx.delete(keySetElements(family, keysRemoved));
  if (removed.length > 0) tx.delete(mapElements(family, removed));
  if (added.length > 0) tx.add(mapElements(family, added));
  if (lookup === 'set' && keysAdded.length > 0) tx.add(keySetElements(family, keysAdded));
  return tx;
}

/**
 * The source-range changes of entries removed and added, around mapChanges: the check map's and
 * the own-address set's elements, the chains of the Services added (their rules written again:
 * the ranges of one Service, whatever its entries), and the chains of `gone` (Services left with
 * no ranged entry) removed once no element jumps to them. An element whose key is both removed
 * and added with the same chain stays: a ranges edit rewrites the Service's chain alone.
 */
export function sourceRangeChanges(
  tx: Transaction,
  family: Family,
  removed: readonly Entry[],
  added: readonly Entry[],
  gone: readonly string[] = [],
): Transaction {
  const before = sourceRangeObjects(family, removed);
  const after = sourceRangeObjects(family, added);
  const diff = sourceRangeDifference(
    { checks: before.checks.elements, own: before.own.elements },
    { checks: after.checks.elements, own: after.own.elements },
  );
  writeSourceChains(tx, after);
  const of = <T extends ElementObject>(o: T, elements: readonly (MapElement | VerdictElement)[]) =>
    ({ ...o, elements }) as T;
  if (diff.checks.removed.length > 0) tx.delete(of(after.checks, diff.checks.removed));
  if (diff.own.removed.length > 0) tx.delete(of(after.own, diff.own.removed));
  const nf = after.checks.family;
  const stale = gone
    .filter((name) => !after.chains.some((c) => c.name === name))
    .map((name): ChainObject => ({ kind: 'chain', family: nf, table: after.checks.table, name }));
  if (stale.length > 0) tx.flush(...stale).delete(...stale);
  if (diff.checks.added.length > 0) tx.add(of(after.checks, diff.checks.added));
  if (diff.own.added.length > 0) tx.add(of(after.own, diff.own.added));
  return tx;
}

/** Declares the Services' source-range chains and writes their rules again. */
function writeSourceChains(tx: Transaction, objects: SourceRangeObjects): void {
  if (objects.chains.length === 0) return;
  tx.add(...objects.chains).flush(...objects.chains);
  tx.add(...objects.rules);
}

/**
 * The source-range objects brought to `wanted` (the check map and the set exist): the chains
 * declared and written, the elements their difference with `held` when it is known, else
 * flushed and filled again; `stale` chains removed.
 */
export function writeSourceRanges(
  tx: Transaction,
  wanted: SourceRangeObjects,
  held: SourceRangeSets | undefined,
  stale: readonly ChainObject[] = [],
): Transaction {
  writeSourceChains(tx, wanted);
  if (held) {
    sourceRangeSetChanges(tx, wanted, held);
  } else {
    const checks = { kind: 'map', family: wanted.checks.family, table: wanted.checks.table, name: SOURCE_CHECK_MAP };
    const own = { kind: 'set', family: wanted.own.family, table: wanted.own.table, name: OWN_SOURCE_SET };
    tx.flush({ ...checks, type: [], data: '' } as MapObject, { ...own, type: [] } as SetObject);
    for (const e of [wanted.checks, wanted.own]) if (e.elements.length > 0) tx.add(e);
  }
  if (stale.length > 0) tx.flush(...stale).delete(...stale);
  return tx;
}

/** Removals, then additions, that bring the check map and the own-address set from `held` to `wanted`. */
function sourceRangeSetChanges(tx: Transaction, wanted: SourceRangeObjects, held: SourceRangeSets): Transaction {
  const diff = sourceRangeDifference(held, { checks: wanted.checks.elements, own: wanted.own.elements });
  const of = <T extends ElementObject>(o: T, elements: readonly (MapElement | VerdictElement)[]) =>
    ({ ...o, elements }) as T;
  if (diff.checks.removed.length > 0) tx.delete(of(wanted.checks, diff.checks.removed));
  if (diff.own.removed.length > 0) tx.delete(of(wanted.own, diff.own.removed));
  if (diff.checks.added.length > 0) tx.add(of(wanted.checks, diff.checks.added));
  if (diff.own.added.length > 0) tx.add(of(wanted.own, diff.own.added));
  return tx;
}

export function deleteTables(tx: Transaction, families: readonly Family[]): Transaction {
  for (const f of families) {
    const { table } = tableObjects(f);
    const bare = { ...table, comment: undefined };
    tx.add(bare).delete(bare);
  }
  return tx;
}

/** The map's and the key set's element objects for `target`, of the elements given. */
function elementObjects(family: NftFamily, target: MapTarget) {
  return {
    elements: (list: readonly MapElement[]) =>
      ({ kind: 'element', family, table: target.table, set: target.map, map: true, elements: list }) as const,
    keys: (set: string, list: readonly MapElement[]) =>
      ({ kind: 'element', family, table: target.table, set, keys: true, elements: list }) as const,
  };
}

/** The same changes as a JSON transaction: what libnftables is given when no batch can be. */
export function elementsTransaction(family: NftFamily, changes: MapElementChanges, target: MapTarget): Transaction {
  const { elements, keys } = elementObjects(family, target);
  const { keySet } = target;
  const tx = new Transaction();
  if (changes.flush) {
    tx.flush({ kind: 'map', family, table: target.table, name: target.map, type: [], data: '' });
    if (keySet) tx.flush({ kind: 'set', family, table: target.table, name: keySet, type: [] });
  } else if (changes.removed.length > 0) {
    tx.delete(elements(changes.removed));
    if (keySet) tx.delete(keys(keySet, changes.removed));
  }
  if (changes.added.length > 0) {
    tx.add(elements(changes.added));
    if (keySet) tx.add(keys(keySet, changes.added));
  }
  return tx;
}

/**
 * A map's difference (element-diff.ts, mapDifference) as a JSON transaction, in mapChanges'
 * order: the key set's removals, the map's, the map's additions, the key set's. Empty when
 * nothing differs.
 */
export function differenceTransaction(family: NftFamily, diff: MapDifference, target: MapTarget): Transaction {
  const { elements, keys } = elementObjects(family, target);
  const { keySet } = target;
  const tx = new Transaction();
  if (keySet && diff.keysRemoved.length > 0) tx.delete(keys(keySet, diff.keysRemoved));
  if (diff.removed.length > 0) tx.delete(elements(diff.removed));
  if (diff.added.length > 0) tx.add(elements(diff.added));
  if (keySet && diff.keysAdded.length > 0) tx.add(keys(keySet, diff.keysAdded));
  return tx;
}
