// What our sets and map hold before a JSON transaction writes a family whole (or repairs its
// source-range sets), where the executor can read it: the transaction then writes their
// difference (element-diff.ts) instead of emptying and filling them again, or replacing the map.

import type { DriverOperation } from '../../driver/driver.js';
import type { Family } from '../../model/types.js';
import { listedSetElements, mapDifference } from './element-diff.js';
import type { NftExecutor } from './executor.js';
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

/**
 * Reads what the families that `operations` write whole hold: the source-range sets (one listing
 * each) where the state has source ranges, and the map and its key set where the executor reads
 * elements (the addon's netlink dumps; the nft command would list them whole, so a family written
 * through it has its map replaced as before). What cannot be read (no way to, or a failure) is
 * left unknown.
 */
export async function readHeld(
  executor: NftExecutor,
  operations: readonly DriverOperation[],
  lookup: KeyLookup,
): Promise<Held> {
  const wanted = new Map<Family, { ranges: boolean; map?: Extract<DriverOperation, { kind: 'writeFamily' }> }>();
  for (const op of operations) {
    if (op.kind === 'writeFamily') wanted.set(op.family, { ranges: op.state.sourceRanged === true, map: op });
    if (op.kind === 'repairShape' && op.parts.includes(SOURCE_RANGE_SET) && op.shape.state.sourceRanged) {
      wanted.set(op.family, { ...wanted.get(op.family), ranges: true });
    }
  }
  const families = new Map<Family, HeldContents>();
  const canList = executor.listSet !== undefined;
  const canRead = executor.readElements !== undefined;
  const reads = [...wanted].filter(([, w]) => (w.ranges && canList) || (w.map && canRead));
  if (reads.length === 0) return { families };
  const generation = await executor.generation?.();
  for (const [family, w] of reads) {
    const nf = NFT_FAMILY[family];
    const contents: HeldContents = {};
    if (w.ranges && executor.listSet) {
      try {
        const keys = await executor.listSet(nf, TABLE_NAME, SOURCE_RANGED_KEY_SET);
        const sources = await executor.listSet(nf, TABLE_NAME, SOURCE_RANGE_SET);
        // A set that does not exist yet holds nothing: the transaction declares it.
        contents.sourceRanges = {
          keys: keys === undefined ? [] : listedSetElements(keys, false),
          sources: sources === undefined ? [] : listedSetElements(sources, true),
        };
      } catch {
        // Unknown: flushed and refilled.
      }
    }
    if (w.map && executor.readElements) {
      try {
        const target = { table: TABLE_NAME, map: MAP_NAME, ...(lookup === 'set' ? { keySet: KEY_SET_NAME } : {}) };
        // Missing (the table, the map or its key set): replaced, as a first write does.
        const held = await executor.readElements(nf, target);
        const map = held && mapDifference(held, w.map.state.entries.map(mapElement));
        if (map) contents.map = map;
      } catch {
        // Unknown: replaced.
      }
    }
    families.set(family, contents);
  }
  return { families, ...(generation !== undefined ? { generation } : {}) };
}
