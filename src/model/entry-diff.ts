// The one difference of a family's entries between two states (kube-proxy's svcPortMap.Update is
// the model): what the reconciler has a driver write, and what it tells its subscribers (the
// conntrack clean-up maps it to tuples). Found at the cost of the change where the model says
// what changed (FamilyState.changes) or where unchanged entries are the same objects; by key
// otherwise, the last resort. Pure.

import { orderedChanges } from './ordered-changes.js';
import {
  entryKey,
  sameSourceRanges,
  type Entry,
  type EntryKeyFields,
  type EntrySnapshot,
  type FamilyState,
} from './types.js';

/** Whether two elements of the same key translate to the same ClusterIP and name the same Service. */
export function sameTarget(
  a: { clusterIp: string; service?: string },
  b: { clusterIp: string; service?: string },
): boolean {
  return a.clusterIp === b.clusterIp && a.service === b.service;
}

/** Whether two entries of the same key program the same element (value, comment, source ranges). */
export function sameElement(a: Entry, b: Entry): boolean {
  return sameTarget(a, b) && sameSourceRanges(a, b);
}

/** What changes between two entry lists of one family, element by element. */
export interface EntryDiff {
  /** Entries whose elements go (a changed value is removed and added). */
  removed: Entry[];
  added: Entry[];
  /** Entries replaced by an equal new object: nothing changes in the kernel. */
  replaced: Array<[Entry, Entry]>;
  /** True when it was found by key: a record of the entries as objects must be rebuilt. */
  renewed: boolean;
}

/** Entries as a record keeps them: in the order given, and as a set of the objects. */
export interface RecordedEntries {
  /** Read only when the model's changes do not start from `snapshot`. */
  readonly entries: readonly Entry[];
  objects: ReadonlySet<Entry>;
  /** The model's hand-out they are, if they came from one (FamilyState.snapshot). */
  snapshot?: EntrySnapshot | undefined;
}

export function isEmpty(diff: Pick<EntryDiff, 'removed' | 'added'>): boolean {
  return diff.removed.length === 0 && diff.added.length === 0;
}

/**
 * The difference from `from` to `to`. The model says what changed since the entries it gave
 * before: if those are `from`'s, nothing needs comparing. Else the lists are walked side by side
 * (unchanged entries are the same objects, in sorted order), and compared by key as the last resort.
 */
export function entryDiff(from: RecordedEntries, to: Pick<FamilyState, 'entries' | 'changes'>): EntryDiff {
  const hint = to.changes;
  if (hint && from.snapshot !== undefined && hint.since === from.snapshot) {
    return pairReplacements(hint.removed, hint.added);
  }
  const walked =
    from.objects.size === from.entries.length
      ? orderedChanges(from.entries, to.entries, (e) => from.objects.has(e))
      : undefined;
  if (!walked || new Set(walked.fresh).size !== walked.fresh.length) {
    return { ...diffByKey(from.objects, to.entries), replaced: [], renewed: true };
  }
  return pairReplacements(walked.gone, walked.fresh);
}

/** The entries of a state as a record: for a difference from a state nobody keeps a record of. */
export function recorded(state: Pick<FamilyState, 'entries' | 'snapshot'>): RecordedEntries {
  const entries = state.entries;
  return { entries, objects: new Set(entries), snapshot: state.snapshot };
}

/**
 * Entries gone and new as objects, as element changes: a new object equal to the one it
 * replaces (same key and element) is no change for the kernel.
 */
export function pairReplacements(gone: readonly Entry[], fresh: readonly Entry[]): EntryDiff {
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

/**
 * Differences written one after another, composed: per key, the entry before the first and the
 * entry after the last. What a record's subscribers are told once, however many writes came
 * between two tellings; it costs what the writes changed.
 */
export class ComposedDiff {
  private readonly byKey = new Map<string, { before: Entry | undefined; after: Entry | undefined }>();

  /** Adds a difference that starts where the ones added before end. */
  add(diff: Pick<EntryDiff, 'removed' | 'added'>): void {
    for (const e of diff.removed) {
      const key = entryKey(e);
      const slot = this.byKey.get(key);
      if (slot) slot.after = undefined;
      else this.byKey.set(key, { before: e, after: undefined });
    }
    for (const e of diff.added) {
      const key = entryKey(e);
      const slot = this.byKey.get(key);
      if (slot) slot.after = e;
      else this.byKey.set(key, { before: undefined, after: e });
    }
  }

  /** The composed difference: an entry back as it was is no change. */
  result(): Pick<EntryDiff, 'removed' | 'added'> {
    const removed: Entry[] = [];
    const added: Entry[] = [];
    for (const { before, after } of this.byKey.values()) {
      if (before && after && (before === after || sameElement(before, after))) continue;
      if (before) removed.push(before);
      if (after) added.push(after);
    }
    return { removed, added };
  }
}
