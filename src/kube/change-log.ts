// A cache's changes, offered as its ChangeFeed (src/model/change-feed.ts): each change
// is an object gone and/or an object come, at a position (the cursor) that only grows. Reading
// it changes nothing; what is before a cursor is dropped when the consumer releases it, and the
// whole log when it grows past its bound (a consumer that does not come back, or falls that far
// behind, rebuilds from the cache's list).

import type { ChangeFeed, Changes } from '../model/change-feed.js';

/** Changes kept for a consumer that does not come (the log is short when the controller syncs). */
export const MAX_CHANGE_LOG = 10_000;

export class ChangeLog<T> implements ChangeFeed<T> {
  /** Changes since position `start`, in order. */
  private entries: Array<{ removed?: T; added?: T }> = [];
  private start = 0;

  /** `list`: every object of the cache now (the store's). */
  constructor(
    readonly list: () => T[],
    private readonly max = MAX_CHANGE_LOG,
  ) {}

  /** The position after the last change. */
  get cursor(): number {
    return this.start + this.entries.length;
  }

  record(removed: T | undefined, added: T | undefined): void {
    if (this.entries.length >= this.max) {
      // Nobody read this far: the consumer behind it lists the cache instead.
      this.start += this.entries.length;
      this.entries = [];
    }
    this.entries.push({ removed, added });
  }

  /** What changed since `cursor`, folded (an object added then removed is neither); undefined when unknown. */
  changesSince(cursor: number): Changes<T> | undefined {
    if (cursor < this.start || cursor > this.cursor) return undefined;
    const removed = new Set<T>();
    const added = new Set<T>();
    for (let i = cursor - this.start; i < this.entries.length; i++) {
      const change = this.entries[i]!;
      if (change.removed !== undefined && !added.delete(change.removed)) removed.add(change.removed);
      if (change.added !== undefined) added.add(change.added);
    }
    return { removed: [...removed], added: [...added] };
  }

  /** Drops what is before `cursor` (a cursor outside the log drops nothing). */
  release(cursor: number): void {
    if (cursor <= this.start || cursor > this.cursor) return;
    this.entries = this.entries.slice(cursor - this.start);
    this.start = cursor;
  }

  /** A new history (the cache is built anew): no cursor given before is valid any more. */
  restart(): void {
    this.start += this.entries.length + 1;
    this.entries = [];
  }
}
