// What our sets and maps hold before a JSON transaction writes a family whole (or repairs its
// source-range objects), and which Services' source-range chains it has, where it can be read:
// the transaction then writes their difference (element-diff.ts) instead of emptying and filling
// them again, or replacing the map.

import type { DriverOperation } from '../../driver/driver.js';
import type { Family } from '../../model/types.js';
import { mapDifference, sourceRangeLines } from './element-diff.js';
import type { NftExecutor, SetRead } from './executor.js';
import {
  KEY_SET_NAME,
  MAP_NAME,
  NFT_FAMILY,
  OWN_SOURCE_SET,
  SOURCE_CHAIN_PREFIX,
  SOURCE_CHECK_MAP,
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
 * source-range sets, with one readSets per family (the addon's netlink dumps at one generation;
 * the nft command's listings, one set each), and the Services' source-range chains. What cannot
 * be read (a set missing, a failure, more elements than the controller writes) is left unknown.
 */
export async function readHeld(
  executor: NftExecutor,
  operations: readonly DriverOperation[],
  lookup: KeyLookup,
): Promise<Held> {
  const wanted = new Map<Family, { ranges: boolean; whole?: WholeWrite }>();
  for (const op of operations) {
    if (op.kind === 'writeFamily') wanted.set(op.family, { ranges: true, whole: op });
    if (op.kind === 'repairShape' && op.parts.includes(SOURCE_CHECK_MAP)) {
      wanted.set(op.family, { ...wanted.get(op.family), ranges: true });
    }
  }
  const families = new Map<Family, HeldContents>();
  if (wanted.size === 0) return { families };
  const generation = await executor.generation();
  for (const [family, w] of wanted) {
    const contents: HeldContents = {};
    try {
      Object.assign(contents, await read(executor, family, w, lookup));
    } catch {
      // Unknown: written whole.
    }
    if (w.whole) {
      const chains = await sourceChains(executor, family);
      if (chains) contents.sourceChains = chains;
    }
    families.set(family, contents);
  }
  return { families, ...(generation !== undefined ? { generation } : {}) };
}

/**
 * The Services' source-range chains the family's table has (a previous run's among them), so
 * that a whole write removes those nothing wants; undefined when they cannot be listed.
 */
export async function sourceChains(executor: NftExecutor, family: Family): Promise<string[] | undefined> {
  try {
    const names = await executor.listChains(NFT_FAMILY[family], TABLE_NAME);
    return names.filter((name) => name.startsWith(SOURCE_CHAIN_PREFIX));
  } catch {
    return undefined;
  }
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
  if (w.ranges) sets.push({ name: SOURCE_CHECK_MAP, kind: 'verdicts' }, { name: OWN_SOURCE_SET, kind: 'sourced' });
  const { sets: lines } = await executor.readSets(NFT_FAMILY[family], TABLE_NAME, sets);
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
  // A source-range map or set that does not exist yet holds nothing: the transaction declares it.
  if (w.ranges) contents.sourceRanges = sourceRangeLines(lines[rangesAt] ?? '', lines[rangesAt + 1] ?? '');
  return contents;
}
