// The entries of one family kept sorted between syncs, with what changed since the last hand-out:
// the backends write only those changes when they can.

import type { Entry, EntryChanges } from './types.js';

/**
 * Entries of one family sorted by sort key. A copy is handed out until the next change, with the
 * entries removed and added since the copy handed out before.
 */
export class SortedEntries {
  private keys: string[] = [];
  private entries: Entry[] = [];
  private published: Entry[] | undefined;
  /** What was handed out last; undefined when the changes since are not known. */
  private lastPublished: Entry[] | undefined;
  private readonly removed = new Set<Entry>();
  private readonly added = new Set<Entry>();
  /** Per Service (Entry.service), how many of its entries have source ranges. */
  private readonly rangedOf = new Map<string, number>();
  /** What was handed out of `rangedOf` last; undefined: it changed since. */
  private rangedPublished: ReadonlyMap<string, number> | undefined = new Map();

  /**
   * Per Service, how many of its entries have source ranges (absent: none), as of now: the same
   * map until a ranged entry comes or goes, a copy then (its size is that of the Services with
   * ranges, not of the table).
   */
  rangedByService(): ReadonlyMap<string, number> {
    return (this.rangedPublished ??= new Map(this.rangedOf));
  }

  publish(): { entries: Entry[]; changes?: EntryChanges } {
    if (this.published) return { entries: this.published, changes: { since: this.published, removed: [], added: [] } };
    const entries = this.entries.slice();
    const since = this.lastPublished;
    const changes = since && { since, removed: [...this.removed], added: [...this.added] };
    this.published = entries;
    this.lastPublished = entries;
    this.removed.clear();
    this.added.clear();
    return changes ? { entries, changes } : { entries };
  }

  /** Inserts, or replaces the entry of the same key. */
  set(sortKey: string, entry: Entry): void {
    const i = this.search(sortKey);
    if (this.keys[i] === sortKey) {
      this.note(this.entries[i]!, entry);
      this.entries[i] = entry;
    } else {
      this.keys.splice(i, 0, sortKey);
      this.entries.splice(i, 0, entry);
      this.note(undefined, entry);
    }
    this.published = undefined;
  }

  delete(sortKey: string): void {
    const i = this.search(sortKey);
    if (this.keys[i] !== sortKey) return;
    this.note(this.entries[i]!, undefined);
    this.keys.splice(i, 1);
    this.entries.splice(i, 1);
    this.published = undefined;
  }

  /**
   * Sets and deletes many keys in one pass over the entries: linear in the entries, plus sorting
   * the changes (one insert at a time would move the array once per change).
   */
  merge(sets: Array<{ sortKey: string; entry: Entry }>, deletes: string[]): void {
    sets.sort((a, b) => compareKeys(a.sortKey, b.sortKey));
    deletes.sort(compareKeys);
    const keys: string[] = [];
    const entries: Entry[] = [];
    let s = 0;
    let d = 0;
    for (let i = 0; i < this.keys.length; i++) {
      const key = this.keys[i]!;
      for (; s < sets.length && sets[s]!.sortKey < key; s++) {
        keys.push(sets[s]!.sortKey);
        entries.push(sets[s]!.entry);
        this.note(undefined, sets[s]!.entry);
      }
      while (d < deletes.length && deletes[d]! < key) d++;
      if (s < sets.length && sets[s]!.sortKey === key) {
        this.note(this.entries[i]!, sets[s]!.entry);
        keys.push(key);
        entries.push(sets[s]!.entry);
        s++;
      } else if (d < deletes.length && deletes[d] === key) {
        this.note(this.entries[i]!, undefined);
      } else {
        keys.push(key);
        entries.push(this.entries[i]!);
      }
    }
    for (; s < sets.length; s++) {
      keys.push(sets[s]!.sortKey);
      entries.push(sets[s]!.entry);
      this.note(undefined, sets[s]!.entry);
    }
    this.keys = keys;
    this.entries = entries;
    this.published = undefined;
  }

  /** Records a change since the last hand-out; an entry added and gone again in between nets out. */
  private note(out: Entry | undefined, into: Entry | undefined): void {
    const outRanged = out?.sourceRanges !== undefined;
    const intoRanged = into?.sourceRanges !== undefined;
    // A ranged entry replaced by one of the same Service: its count stays, and so does the map.
    if (!(outRanged && intoRanged && out!.service === into!.service)) {
      if (outRanged) this.countRanged(out!.service, -1);
      if (intoRanged) this.countRanged(into!.service, 1);
    }
    if (out && !this.added.delete(out)) this.removed.add(out);
    if (into && !this.removed.delete(into)) this.added.add(into);
  }

  private countRanged(service: string, by: 1 | -1): void {
    const n = (this.rangedOf.get(service) ?? 0) + by;
    if (n > 0) this.rangedOf.set(service, n);
    else this.rangedOf.delete(service);
    this.rangedPublished = undefined;
  }

  /** The first index whose key is not below sortKey. */
  private search(sortKey: string): number {
    let low = 0;
    let high = this.keys.length;
    while (low < high) {
      const mid = (low + high) >>> 1;
      if (this.keys[mid]! < sortKey) low = mid + 1;
      else high = mid;
    }
    return low;
  }
}

/** Sort keys compare by code unit, whatever the locale. */
export function compareKeys(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
