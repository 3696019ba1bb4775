// Which conntrack entries keep an old behaviour after the kernel's translations changed. NAT is
// decided on a connection's first packet; a UDP or SCTP flow that keeps sending keeps that
// decision for as long as it lives. So when the translation of an (external IP, protocol, port)
// changes target, disappears or appears, the entries whose original destination is that tuple
// must go (semantics.md, "Connection tracking"). TCP is left alone, as kube-proxy does. Pure.

import type { FamilyChange, KernelChange } from '../driver/kernel-change.js';
import { entryKey, sameSourceRanges, type Entry, type Family, type Protocol } from '../model/types.js';

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

/**
 * The tuples of one family's change, by key: the target and the sources translated matter to a
 * flow; a comment (the owning Service) changing keeps its path, other source ranges change which
 * flows are translated.
 */
function changedTuples({ removed, added }: Pick<FamilyChange, 'removed' | 'added'>, out: StaleTuple[]): void {
  const gone = new Map<string, Entry>();
  for (const e of removed) if (tracked(e)) gone.set(entryKey(e), e);
  for (const e of added) {
    if (!tracked(e)) continue;
    const key = entryKey(e);
    const old = gone.get(key);
    gone.delete(key);
    if (!old) out.push(tuple(e, 'appeared'));
    else if (old.clusterIp !== e.clusterIp || !sameSourceRanges(old, e)) out.push(tuple(e, 'retargeted'));
  }
  for (const e of gone.values()) out.push(tuple(e as Entry & { protocol: ConntrackProtocol }, 'removed'));
}

/**
 * The tuples whose conntrack entries are stale after `change`: its difference mapped to tuples
 * (never a comparison of whole states). What the kernel held before not known (the first sync
 * after a start): every tuple, for its untranslated flows only. The local-pod match changed:
 * every tuple held before or after.
 */
export function staleTuples(change: Pick<KernelChange, 'previous' | 'families'>): StaleTuple[] {
  const out: StaleTuple[] = [];
  for (const family of change.families) {
    if (family.previousUnknown) {
      for (const e of family.added) if (tracked(e)) out.push(tuple(e, 'first sync', true));
    } else if (family.shapeChanged) {
      everyTuple(family.family, change.previous, family, out);
    } else {
      changedTuples(family, out);
    }
  }
  return out;
}

/** Pod flows change from translated to not (or back) on every tuple of the family, before or after. */
function everyTuple(
  family: Family,
  previous: KernelChange['previous'],
  change: Pick<FamilyChange, 'removed' | 'added'>,
  out: StaleTuple[],
): void {
  const all = new Map<string, Entry & { protocol: ConntrackProtocol }>();
  // What was held, then what went and came: every tuple of before and of after.
  for (const list of [previous?.[family].entries ?? [], change.removed, change.added]) {
    for (const e of list) if (tracked(e)) all.set(entryKey(e), e);
  }
  for (const e of all.values()) out.push(tuple(e, 'local pod match changed'));
}
