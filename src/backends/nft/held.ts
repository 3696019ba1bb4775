// What our sets and map hold before a JSON transaction writes a family whole (or repairs its
// source-range sets), where the executor can read it: the transaction then writes their
// difference (element-diff.ts) instead of emptying and filling them again, or replacing the map.

import type { DriverOperation } from '../../driver/driver.js';
import type { Family } from '../../model/types.js';
import { listedSetElements, mapDifference, sourceRangeLines } from './element-diff.js';
import type { NftExecutor, SetRead } from './executor.js';
import {
  KEY_SET_NAME,
  MAP_NAME,
  NFT_FAMILY,
  SOURCE_RANGED_KEY_SET,
  SOURCE_RANGE_SET,
  TABLE_NAME,
  mapElement,
  type KeyLookup,
} from './render.js';
import type { HeldContents } from './transactions.js';

export interface Held {
  /** Per family, what is known of it; a family left out is written as if nothing were known. */
  families: Map<Family, HeldContents>;
  /** The ruleset generation before anything was read (undefined: unknown). */
  generation?: number;
}

type WholeWrite = Extract<DriverOperation, { kind: 'writeFamily' }>;

/**
 * Reads what the families that `operations` write whole hold: the map and its key set, and the
 * source-range sets where the state has source ranges, in one read at one generation where the
 * executor reads elements (the addon's netlink dumps). The nft command reads no elements: through
 * it the source-range sets are listed (one set each) and the map is replaced as before (a listing
 * of the whole map would cost more than the write). What cannot be read (no way to, a set
 * missing, a failure) is left unknown.
 */
export async function readHeld(
  executor: NftExecutor,
  operations: readonly DriverOperation[],
  lookup: KeyLookup,
): Promise<Held> {
  const wanted = new Map<Family, { ranges: boolean; whole?: WholeWrite }>();
  for (const op of operations) {
    if (op.kind === 'writeFamily') wanted.set(op.family, { ranges: op.state.sourceRanged === true, whole: op });
    if (op.kind === 'repairShape' && op.parts.includes(SOURCE_RANGE_SET) && op.shape.state.sourceRanged) {
      wanted.set(op.family, { ...wanted.get(op.family), ranges: true });
    }
  }
  const families = new Map<Family, HeldContents>();
  const canRead = executor.readSets !== undefined;
  const canList = executor.listSet !== undefined;
  const reads = [...wanted].filter(([, w]) => canRead || (w.ranges && canList));
  if (reads.length === 0) return { families };
  const generation = await executor.generation?.();
  for (const [family, w] of reads) {
    try {
      families.set(family, canRead ? await read(executor, family, w, lookup) : await listed(executor, family));
    } catch {
      // Unknown: written whole.
    }
  }
  return { families, ...(generation !== undefined ? { generation } : {}) };
}

async function read(
  executor: NftExecutor,
  family: Family,
  w: { ranges: boolean; whole?: WholeWrite },
  lookup: KeyLookup,
): Promise<HeldContents> {
  const sets: SetRead[] = [];
  if (w.whole) {
    sets.push({ name: MAP_NAME, kind: 'map' });
    if (lookup === 'set') sets.push({ name: KEY_SET_NAME, kind: 'keys' });
  }
  const rangesAt = sets.length;
  if (w.ranges) sets.push({ name: SOURCE_RANGED_KEY_SET, kind: 'keys' }, { name: SOURCE_RANGE_SET, kind: 'ranges' });
  const { sets: lines } = await executor.readSets!(NFT_FAMILY[family], TABLE_NAME, sets);
  const contents: HeldContents = {};
  // A missing map or key set (the table is new, say): replaced, as a first write does.
  const [map, keys] = lines;
  if (w.whole && map !== undefined && (lookup !== 'set' || keys !== undefined)) {
    const difference = mapDifference(
      { map, ...(lookup === 'set' ? { keySet: keys } : {}) },
      w.whole.state.entries.map(mapElement),
    );
    if (difference) contents.map = difference;
  }
  // A source-range set that does not exist yet holds nothing: the transaction declares it.
  if (w.ranges) contents.sourceRanges = sourceRangeLines(lines[rangesAt] ?? '', lines[rangesAt + 1] ?? '');
  return contents;
}

async function listed(executor: NftExecutor, family: Family): Promise<HeldContents> {
  const nf = NFT_FAMILY[family];
  const keys = await executor.listSet!(nf, TABLE_NAME, SOURCE_RANGED_KEY_SET);
  const sources = await executor.listSet!(nf, TABLE_NAME, SOURCE_RANGE_SET);
  return {
    sourceRanges: {
      keys: keys === undefined ? [] : listedSetElements(keys, false),
      sources: sources === undefined ? [] : listedSetElements(sources, true),
    },
  };
}
