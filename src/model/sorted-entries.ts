// The entries of one family kept sorted between syncs, with what changed since the last hand-out:
// the backends write only those changes when they can.
//
// Kept in chunks of up to 2 x CHUNK entries, each handed out as it is and copied before the
// next change to it: a hand-out costs a reference per chunk, and a change the chunk it touches
// (a copy of the whole array per change was a fresh 400 KB object at 50,000 entries). The array
// of a hand-out is made when it is first read.

import type { Entry, EntryChanges, EntrySnapshot } from './types.js';

/** Entries per chunk after a bulk change; a chunk splits past twice as many. */
const CHUNK = 256;

interface Chunk {
  keys: string[];
  entries: Entry[];
  /** `entries` is part of a hand-out: copied before it changes. */
  shared: boolean;
}

/** One hand-out: the chunks as they were, joined when first read. */
export class EntryHandOut implements EntrySnapshot {
  private parts: Entry[][] | undefined;
  private joined: Entry[] | undefined;

  constructor(
    parts: Entry[][],
    readonly length: number,
  ) {
    this.parts = parts;
  }

  /** Whether the array was made (tests: a change must not make it). */
  get made(): boolean {
    return this.joined !== undefined;
  }

  /** The entries as one array, the same one every time; the model never changes it. */
  entries(): Entry[] {
    if (!this.joined) {
      const joined: Entry[] = [];
      for (const part of this.parts!) for (const e of part) joined.push(e);
      this.joined = joined;
      this.parts = undefined;
    }
    return this.joined;
  }
}

/**
 * Entries of one family sorted by sort key. A hand-out holds until the next change, with the
 * entries removed and added since the hand-out before.
 */
export class SortedEntries {
  private chunks: Chunk[] = [];
  private size = 0;
  private published: EntryHandOut | undefined;
  /** What was handed out last; undefined when the changes since are not known. */
  private lastPublished: EntryHandOut | undefined;
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

  publish(): { snapshot: EntryHandOut; changes?: EntryChanges } {
    if (this.published) {
      return { snapshot: this.published, changes: { since: this.published, removed: [], added: [] } };
    }
    const parts: Entry[][] = [];
    for (const chunk of this.chunks) {
      chunk.shared = true;
      parts.push(chunk.entries);
    }
    const snapshot = new EntryHandOut(parts, this.size);
    const since = this.lastPublished;
    const changes = since && { since, removed: [...this.removed], added: [...this.added] };
    this.published = snapshot;
    this.lastPublished = snapshot;
    this.removed.clear();
    this.added.clear();
    return changes ? { snapshot, changes } : { snapshot };
  }

  /** Inserts, or replaces the entry of the same key. */
  set(sortKey: string, entry: Entry): void {
    if (this.chunks.length === 0) this.chunks.push({ keys: [], entries: [], shared: false });
    const [c, i] = this.search(sortKey);
    const chunk = this.own(c);
    if (chunk.keys[i] === sortKey) {
      this.note(chunk.entries[i]!, entry);
      chunk.entries[i] = entry;
    } else {
      chunk.keys.splice(i, 0, sortKey);
      chunk.entries.splice(i, 0, entry);
      this.size++;
      this.note(undefined, entry);
      if (chunk.keys.length > 2 * CHUNK) {
        const tail: Chunk = { keys: chunk.keys.splice(CHUNK), entries: chunk.entries.splice(CHUNK), shared: false };
        this.chunks.splice(c + 1, 0, tail);
      }
    }
    this.published = undefined;
  }

  delete(sortKey: string): void {
    if (this.chunks.length === 0) return;
    const [c, i] = this.search(sortKey);
    if (this.chunks[c]!.keys[i] !== sortKey) return;
    const chunk = this.own(c);
    this.note(chunk.entries[i]!, undefined);
    chunk.keys.splice(i, 1);
    chunk.entries.splice(i, 1);
    this.size--;
    if (chunk.keys.length === 0) this.chunks.splice(c, 1);
    this.published = undefined;
  }

  /**
   * Sets and deletes many keys in one pass over the entries: linear in the entries, plus sorting
   * the changes (one insert at a time would move the array once per change).
   */
  merge(sets: Array<{ sortKey: string; entry: Entry }>, deletes: string[]): void {
    sets.sort((a, b) => compareKeys(a.sortKey, b.sortKey));
    deletes.sort(compareKeys);
    const chunks: Chunk[] = [];
    let last: Chunk | undefined;
    let size = 0;
    const push = (key: string, entry: Entry) => {
      if (!last || last.keys.length === CHUNK) chunks.push((last = { keys: [], entries: [], shared: false }));
      last.keys.push(key);
      last.entries.push(entry);
      size++;
    };
    let s = 0;
    let d = 0;
    for (const chunk of this.chunks) {
      for (let i = 0; i < chunk.keys.length; i++) {
        const key = chunk.keys[i]!;
        for (; s < sets.length && sets[s]!.sortKey < key; s++) {
          push(sets[s]!.sortKey, sets[s]!.entry);
          this.note(undefined, sets[s]!.entry);
        }
        while (d < deletes.length && deletes[d]! < key) d++;
        if (s < sets.length && sets[s]!.sortKey === key) {
          this.note(chunk.entries[i]!, sets[s]!.entry);
          push(key, sets[s]!.entry);
          s++;
        } else if (d < deletes.length && deletes[d] === key) {
          this.note(chunk.entries[i]!, undefined);
        } else {
          push(key, chunk.entries[i]!);
        }
      }
    }
    for (; s < sets.length; s++) {
      push(sets[s]!.sortKey, sets[s]!.entry);
      this.note(undefined, sets[s]!.entry);
    }
    this.chunks = chunks;
    this.size = size;
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

  /** Chunk `c`, its entries copied first if a hand-out holds them. */
  private own(c: number): Chunk {
    const chunk = this.chunks[c]!;
    if (chunk.shared) {
      chunk.entries = chunk.entries.slice();
      chunk.shared = false;
    }
    return chunk;
  }

  /**
   * Where sortKey is or would go: the first chunk whose last key is not below it (else the last
   * chunk), and the first index there whose key is not below it.
   */
  private search(sortKey: string): [number, number] {
    let low = 0;
    let high = this.chunks.length - 1;
    while (low < high) {
      const mid = (low + high) >>> 1;
      const keys = this.chunks[mid]!.keys;
      if (keys[keys.length - 1]! < sortKey) low = mid + 1;
      else high = mid;
    }
    const keys = this.chunks[low]!.keys;
    let lo = 0;
    let hi = keys.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (keys[mid]! < sortKey) lo = mid + 1;
      else hi = mid;
    }
    return [low, lo];
  }
}

/** Sort keys compare by code unit, whatever the locale. */
export function compareKeys(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
