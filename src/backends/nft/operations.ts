// One typed driver operation as verbs on our tables' objects (render.ts, transactions.ts): what
// NftDriver.apply puts in a JSON transaction. A partial write removes a Service's source-range
// chain with its last ranged entry, as the operation's desired state says (rangedByService):
// the driver keeps no record of its own. Pure.

import { FAMILIES, entryKey, type Entry, type Family } from '../../model/types.js';
import type { DriverOperation, KernelElement } from '../../driver/driver.js';
import type { ChainObject, Transaction } from './objects.js';
import { listedElement, listedIn } from './element-diff.js';
import {
  SOURCE_CHAIN_PREFIX,
  SOURCE_CHECK_MAP,
  TABLE_NAME,
  desiredTable,
  mapElement,
  sourceChainName,
  sourceRangeObjects,
  type KeyLookup,
} from './render.js';
import {
  deleteTables,
  mapChanges,
  replaceTable,
  resyncTable,
  rewriteRules,
  sourceRangeChanges,
  writeSourceRanges,
  writeTable,
  type HeldContents,
} from './transactions.js';

/** Programmed ranged entries among removals (foreign elements carry a ref and no ranges). */
export function programmedRanged(remove: readonly KernelElement[]): Entry[] {
  return remove.filter((e): e is Entry => (e as Entry).sourceRanges !== undefined && !e.ref);
}

/** One typed operation as verbs on our tables' objects. */
export function addOperation(
  tx: Transaction,
  op: DriverOperation,
  lookup: KeyLookup,
  /** What the family's sets and map hold, where it is known. */
  held: HeldContents | undefined,
): void {
  const changes = (
    family: Family,
    remove: readonly KernelElement[],
    add: readonly Entry[],
    /** Once written: per Service, its ranged entries (FamilyState.rangedByService). */
    rangedByService: ReadonlyMap<string, number> | undefined,
  ) => {
    // A key removed and added with the same element (its source ranges changed, say) stays.
    const adding = new Map(add.map((e) => [entryKey(e), e]));
    const stays = (e: KernelElement) => {
      const other = adding.get(entryKey(e));
      return other !== undefined && !e.ref && sameMapElement(mapElement(e as Entry), mapElement(other));
    };
    const kept = new Set(remove.filter(stays).map(entryKey));
    const removeMap = remove.filter((e) => !kept.has(entryKey(e)));
    const addMap = add.filter((e) => !kept.has(entryKey(e)));
    const inMap = removeMap.filter((e) => listedIn(e) !== 'keySet').map(listedElement);
    const inKeySet = removeMap.filter((e) => listedIn(e) !== 'map').map(listedElement);
    // A programmed entry removed is the Entry itself: its source-range elements go with it, and
    // its Service's chain when no ranged entry of the Service is left.
    const rangedRemoved = programmedRanged(remove);
    const gone = [...new Set(rangedRemoved.map((e) => e.service))]
      .filter((service) => !rangedByService?.has(service))
      .map(sourceChainName);
    mapChanges(tx, family, inMap, addMap.map(mapElement), lookup, inKeySet);
    sourceRangeChanges(tx, family, rangedRemoved, add, gone);
  };
  switch (op.kind) {
    case 'writeFamily':
      writeTable(tx, desiredTable(op.family, op.state, op.masqueradeMark, lookup), held);
      return;
    case 'replaceFamily':
      replaceTable(tx, desiredTable(op.family, op.state, op.masqueradeMark, lookup));
      return;
    case 'writeShape':
      resyncTable(tx, desiredTable(op.family, op.shape.state, op.shape.masqueradeMark, lookup));
      changes(op.family, op.remove, op.add, op.shape.state.rangedByService);
      return;
    case 'elements':
      changes(op.family, op.remove, op.add, op.rangedByService);
      return;
    case 'repairShape': {
      const table = desiredTable(op.family, op.shape.state, op.shape.masqueradeMark, lookup);
      const sources = sourceRangeObjects(op.family, op.entries);
      // The counters the rules name, declared again (a no-op where they are).
      if (table.chains.some((c) => op.parts.includes(c.name))) tx.add(...table.counters);
      for (const chain of table.chains) if (op.parts.includes(chain.name)) rewriteRules(tx, table, chain);
      const wanted = new Set(sources.chains.map((c) => c.name));
      // A Service's chain named: written again when wanted, else removed.
      const stale = op.parts
        .filter((name) => name.startsWith(SOURCE_CHAIN_PREFIX) && !wanted.has(name))
        .map((name): ChainObject => ({ kind: 'chain', family: table.table.family, table: TABLE_NAME, name }));
      for (const chain of sources.chains) {
        if (op.parts.includes(chain.name)) rewriteRules(tx.add(chain), { ...table, rules: sources.rules }, chain);
      }
      if (op.parts.includes(SOURCE_CHECK_MAP)) {
        // The check map and the own-address set brought to the programmed entries, every chain
        // written again.
        tx.add(...table.maps.filter((m) => m.name === SOURCE_CHECK_MAP), ...table.sets);
        writeSourceRanges(tx, sources, held?.sourceRanges, stale);
      } else if (stale.length > 0) {
        tx.flush(...stale).delete(...stale);
      }
      return;
    }
    case 'removeAll':
      deleteTables(tx, FAMILIES);
      return;
  }
}

function sameMapElement(a: ReturnType<typeof mapElement>, b: ReturnType<typeof mapElement>): boolean {
  return a.value === b.value && a.comment === b.comment && a.key.join(' ') === b.key.join(' ');
}
