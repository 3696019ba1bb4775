// Which conntrack entries keep an old behaviour after the kernel's translations changed. NAT is
// decided on a connection's first packet; a UDP or SCTP flow that keeps sending keeps that
// decision for as long as it lives. So when the translation of an (external IP, protocol, port)
// changes target, disappears or appears, the entries whose original destination is that tuple
// must go (semantics.md, "Connection tracking"). TCP is left alone, as kube-proxy does. Pure.

import { diffByKey } from '../reconciler/element-storage.js';
import {
  FAMILIES,
  entryKey,
  sameSourceRanges,
  type DesiredState,
  type Entry,
  type Family,
  type Protocol,
} from '../model/types.js';

export type ConntrackProtocol = Extract<Protocol, 'UDP' | 'SCTP'>;

/** Conntrack entries to delete: those whose original destination is (externalIp, protocol, port). */
export interface StaleTuple {
  family: Family;
  externalIp: string;
  protocol: ConntrackProtocol;
  port: number;
  /**
   * Only entries that were not translated (their reply comes from the external IP itself). Used
   * when what the kernel held before is not known (the first sync after a start): a flow a
   * previous run translated keeps its translation, and a restart costs no flow its endpoint.
   */
  untranslatedOnly: boolean;
  /** Why, for logs: `appeared`, `removed`, `retargeted` (new ClusterIP) or `first sync`. */
  why: 'appeared' | 'removed' | 'retargeted' | 'first sync' | 'local pod match changed';
}

function tracked(e: Entry): e is Entry & { protocol: ConntrackProtocol } {
  return e.protocol === 'UDP' || e.protocol === 'SCTP';
}

function tuple(
  e: Entry & { protocol: ConntrackProtocol },
  why: StaleTuple['why'],
  untranslatedOnly = false,
): StaleTuple {
  return { family: e.family, externalIp: e.externalIp, protocol: e.protocol, port: e.port, untranslatedOnly, why };
}

/** Entries of one family that differ between two entry lists, as stale tuples (one diff: element-storage's). */
function diffEntries(before: readonly Entry[], after: readonly Entry[]): StaleTuple[] {
  // The target and the sources translated matter to a flow: a comment (the owning Service) change
  // keeps its path, other source ranges change which flows are translated.
  const { removed, added } = diffByKey(
    before.filter(tracked),
    after.filter(tracked),
    (a, b) => a.clusterIp === b.clusterIp && sameSourceRanges(a, b),
  );
  const removedKeys = new Set(removed.map(entryKey));
  const addedKeys = new Set(added.map(entryKey));
  const out: StaleTuple[] = [];
  for (const e of added) if (tracked(e)) out.push(tuple(e, removedKeys.has(entryKey(e)) ? 'retargeted' : 'appeared'));
  for (const e of removed) if (tracked(e) && !addedKeys.has(entryKey(e))) out.push(tuple(e, 'removed'));
  return out;
}

/**
 * The tuples whose conntrack entries are stale once the kernel holds `next` instead of
 * `previous` (undefined: not known, as on the first sync after a start).
 */
export function staleTuples(previous: DesiredState | undefined, next: DesiredState): StaleTuple[] {
  const out: StaleTuple[] = [];
  for (const family of FAMILIES) {
    const after = next[family];
    if (previous === undefined) {
      for (const e of after.entries) if (tracked(e)) out.push(tuple(e, 'first sync', true));
      continue;
    }
    const before = previous[family];
    if (JSON.stringify(before.localPodMatch) !== JSON.stringify(after.localPodMatch)) {
      // Pod flows change from translated to not (or back) on every tuple of the family.
      const all = new Map<string, Entry & { protocol: ConntrackProtocol }>();
      for (const e of [...before.entries, ...after.entries]) if (tracked(e)) all.set(entryKey(e), e);
      for (const e of all.values()) out.push(tuple(e, 'local pod match changed'));
      continue;
    }
    if (after.entries === before.entries) continue;
    // The model says what changed since the list the kernel holds: no need to compare the lists.
    // One push per tuple: a change may hold more than a call can take arguments.
    const changed =
      after.changes?.since === before.entries
        ? diffEntries(after.changes.removed, after.changes.added)
        : diffEntries(before.entries, after.entries);
    for (const tuple of changed) out.push(tuple);
  }
  return out;
}
