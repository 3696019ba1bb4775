// The reconciler's record of the entries of one family it had a driver program (kube-proxy's
// nftElementStorage is the model): the one record of what the kernel holds of ours; drivers keep
// none. How to get from it to new entries is the model's one difference (model/entry-diff.ts).

import { entryDiff, type EntryDiff, type RecordedEntries } from '../model/entry-diff.js';
import type { Entry, FamilyState } from '../model/types.js';

type Source = Pick<FamilyState, 'entries' | 'changes' | 'snapshot'>;

/**
 * What a record keeps of a state's entries: a model's state itself (its entries never change,
 * and its array is made only if read), a copy of another's.
 */
function kept(state: Source): Pick<FamilyState, 'entries' | 'snapshot'> {
  const snapshot = state.snapshot;
  if (snapshot) {
    return {
      get entries() {
        return snapshot.entries();
      },
      snapshot,
    };
  }
  return { entries: state.changes ? state.entries : state.entries.slice() };
}

/** The entries of one family a backend programmed, and how to get from them to new ones. */
export class ElementStorage {
  /** The entries, in the order of the desired state they came from; never modified. */
  private source: Pick<FamilyState, 'entries' | 'snapshot'>;
  private objects: Set<Entry>;

  constructor(state: Source) {
    this.source = kept(state);
    this.objects = new Set(state.entries);
  }

  values(): IterableIterator<Entry> {
    return this.objects.values();
  }

  /** What to write so that the kernel goes from the recorded entries to `state.entries`. */
  changesTo(state: Source): EntryDiff {
    return entryDiff(this.recorded, state);
  }

  /** Records that `changes` (from changesTo) were written: the kernel now holds `state.entries`. */
  commit(state: Source, changes: EntryDiff): void {
    this.source = kept(state);
    if (changes.renewed) {
      this.objects = new Set(state.entries);
      return;
    }
    for (const e of changes.removed) this.objects.delete(e);
    for (const [old, current] of changes.replaced) {
      this.objects.delete(old);
      this.objects.add(current);
    }
    for (const e of changes.added) this.objects.add(e);
  }

  private get recorded(): RecordedEntries {
    const source = this.source;
    return {
      get entries() {
        return source.entries;
      },
      objects: this.objects,
      snapshot: source.snapshot,
    };
  }
}
