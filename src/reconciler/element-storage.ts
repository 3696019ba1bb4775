// What a backend must write so that a kernel map holds a family's entries (kube-proxy's
// nftElementStorage is the model): one record of what was programmed, one entry key, one diff,
// shared by the nft and eBPF backends.

import { holdsEntry } from '../driver/driver.js';
import { orderedChanges } from '../model/ordered-changes.js';
import { entryKey, sameSourceRanges, type Entry, type EntryKeyFields, type FamilyState } from '../model/types.js';

/** Whether two entries of the same key program the same element (value, comment, source ranges). */
function sameElement(a: Entry, b: Entry): boolean {
  return holdsEntry(a, b) && sameSourceRanges(a, b);
}

export interface ElementChanges {
  /** Entries whose elements must go (a changed value is removed and added). */
  removed: Entry[];
  added: Entry[];
  /** Programmed entries whose equal replacement is a new object: nothing to write to the kernel. */
  replaced: Array<[Entry, Entry]>;
  /** True when the changes were found by key: the record's object set must be rebuilt. */
  renewed: boolean;
}

export function isEmpty(changes: Pick<ElementChanges, 'removed' | 'added'>): boolean {
  return changes.removed.length === 0 && changes.added.length === 0;
}

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

  /**
   * What to write so that the kernel goes from the recorded entries to `state.entries`. The model
   * says what changed since the entries it gave before; if those are the recorded ones, nothing
   * needs comparing. Else the lists are walked side by side (unchanged entries are the same
   * objects, in sorted order), and compared by key as the last resort.
   */
  changesTo(state: Pick<FamilyState, 'entries' | 'changes'>): ElementChanges {
    const hint = state.changes;
    if (hint && hint.since === this.entries) return pairReplacements(hint.removed, hint.added);
    return diffProgrammed(this, state.entries);
  }

  /** Records that `changes` (from changesTo) were written: the kernel now holds `state.entries`. */
  commit(state: Pick<FamilyState, 'entries' | 'changes'>, changes: ElementChanges): void {
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

  /** For diffProgrammed. */
  get recorded(): { entries: readonly Entry[]; objects: ReadonlySet<Entry> } {
    return { entries: this.entries, objects: this.objects };
  }
}

/**
 * What to write so that the kernel map holds `next`, from the programmed entries: walking both
 * side by side finds the changes at the cost of the changes, not of the table. Entries from a
 * caller that does not keep unchanged entries as the same objects are compared by key.
 */
export function diffProgrammed(
  programmed: ElementStorage | { entries: readonly Entry[]; objects: ReadonlySet<Entry> },
  next: readonly Entry[],
): ElementChanges {
  const p = programmed instanceof ElementStorage ? programmed.recorded : programmed;
  const walked =
    p.objects.size === p.entries.length ? orderedChanges(p.entries, next, (e) => p.objects.has(e)) : undefined;
  if (!walked || new Set(walked.fresh).size !== walked.fresh.length) {
    return { ...diffByKey(p.objects, next), replaced: [], renewed: true };
  }
  return pairReplacements(walked.gone, walked.fresh);
}

/**
 * Entries gone and new as objects, as element changes: a new object equal to the one it
 * replaces (same key and element) is no change for the kernel.
 */
export function pairReplacements(gone: readonly Entry[], fresh: readonly Entry[]): ElementChanges {
  const freshByKey = new Map(fresh.map((e) => [entryKey(e), e]));
  const removed: Entry[] = [];
  const replaced: Array<[Entry, Entry]> = [];
  for (const old of gone) {
    const key = entryKey(old);
    const current = freshByKey.get(key);
    if (current && sameElement(current, old)) {
      replaced.push([old, current]);
      freshByKey.delete(key);
    } else {
      removed.push(old);
    }
  }
  return { removed, added: [...freshByKey.values()], replaced, renewed: false };
}

/**
 * Elements to delete and to add so that a map holding `current` holds exactly `next`, by key:
 * a changed element (`same` says whether it is) is both deleted and added.
 */
export function diffByKey<C extends EntryKeyFields>(
  current: Iterable<C>,
  next: readonly Entry[],
  same: (old: C, e: Entry) => boolean = sameElement as unknown as (old: C, e: Entry) => boolean,
): { removed: C[]; added: Entry[] } {
  const have = new Map<string, C>();
  for (const c of current) have.set(entryKey(c), c);
  const removed: C[] = [];
  const added: Entry[] = [];
  for (const e of next) {
    const key = entryKey(e);
    const old = have.get(key);
    if (!old) added.push(e);
    else {
      have.delete(key);
      if (!same(old, e)) {
        removed.push(old);
        added.push(e);
      }
    }
  }
  for (const c of have.values()) removed.push(c);
  return { removed, added };
}
