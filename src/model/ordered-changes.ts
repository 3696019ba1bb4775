// Changes between two sequences that keep their common items in the same order, found by
// identity: the cost is that of the differences, not of the sequences. Used where a large list
// comes back at every sync with few items replaced (the Service cache, the sorted entries).

export interface OrderedChanges<T> {
  /** Items of `previous` that are not in `next`. */
  gone: T[];
  /** Items of `next` that were not known. */
  fresh: T[];
}

/**
 * Walks both sequences side by side. `isKnown` says whether an item of `next` was in `previous`
 * (a set lookup the caller keeps). Returns undefined when a known item is out of order or
 * repeated: the caller must then compare by content.
 */
export function orderedChanges<T>(
  previous: readonly T[],
  next: readonly T[],
  isKnown: (item: T) => boolean,
): OrderedChanges<T> | undefined {
  const gone: T[] = [];
  const fresh: T[] = [];
  let i = 0;
  for (let j = 0; j < next.length;) {
    const item = next[j]!;
    if (previous[i] === item && i < previous.length) {
      i++;
      j++;
    } else if (!isKnown(item)) {
      fresh.push(item);
      j++;
    } else if (i < previous.length) {
      // The item comes later in `previous`: the one here is gone. Had it only moved, it would
      // show up later in `next` as a known item that can no longer be matched.
      gone.push(previous[i++]!);
    } else {
      return undefined;
    }
  }
  while (i < previous.length) gone.push(previous[i++]!);
  return { gone, fresh };
}
