// The feed of changes from a cache to the model: which objects came and went since a cursor.
// The informers offer it (src/kube/store.ts keeps the log behind it); the model reads it
// (change-reading.ts), as kube-proxy's change trackers feed its proxier. Reading has no effect:
// the same question gets the same answer. What a consumer has read is let go only when it says
// so (release), and the log is bounded besides: a consumer that falls behind it is told to
// rebuild from list().

/** What changed between a cursor and now. */
export interface Changes<T> {
  /** Objects there at the cursor and gone now (a changed object counts as gone, its new one as added). */
  removed: T[];
  /** Objects there now that were not at the cursor. */
  added: T[];
}

/**
 * A collection that says which of its objects changed since an earlier look. Objects are never
 * modified: a changed object is a new one, and the old one counts as removed.
 */
export interface ChangeFeed<T> {
  /** Every object now. */
  list(): T[];
  /** A position in the collection's history: now. Ask changesSince() with it later. */
  readonly cursor: number;
  /**
   * What changed since `cursor`, up to now; undefined when the feed no longer knows (the cursor
   * is older than the log kept, or from before the collection was built anew): list() it then.
   * Changes nothing: asked twice with nothing changed between, it answers the same.
   */
  changesSince(cursor: number): Changes<T> | undefined;
  /**
   * The consumer has read everything before `cursor`: the feed may forget it. Until then the
   * feed keeps it (up to its bound), whatever is read.
   */
  release(cursor: number): void;
}
