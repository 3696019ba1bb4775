// The reconciler's record of the entries of one family it had a driver program (kube-proxy's
// nftElementStorage is the model): the one record of what the kernel holds of ours; drivers keep
// none. How to get from it to new entries is the model's one difference (model/entry-diff.ts).

import { entryDiff, type EntryDiff, type RecordedEntries } from '../model/entry-diff.js';
import type { Entry, FamilyState } from '../model/types.js';

/** The entries of one family a backend programmed, and how to get from them to new ones. */
export class ElementStorage {
  /** In the order of the desired state they came from; never modified (a model's arrays are not). */
  private entries: readonly Entry[];
  private objects: Set<Entry>;

  constructor(state: Pick<FamilyState, 'entries' | 'changes'>) {
    this.entries = state.changes ? state.entries : state.entries.slice();
    this.objects = new Set(state.entries);
  }

  values(): IterableIterator<Entry> {
    return this.objects.values();
  }

  /** What to write so that the kernel goes from the recorded entries to `state.entries`. */
  changesTo(state: Pick<FamilyState, 'entries' | 'changes'>): EntryDiff {
    return entryDiff(this.recorded, state);
  }

  /** Records that `changes` (from changesTo) were written: the kernel now holds `state.entries`. */
  commit(state: Pick<FamilyState, 'entries' | 'changes'>, changes: EntryDiff): void {
    this.entries = state.changes ? state.entries : state.entries.slice();
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
    return { entries: this.entries, objects: this.objects };
  }
}
