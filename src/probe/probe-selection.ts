// Which Services the continuous probe tries, and which of their paths. Pure.
//
// The operator's (--probe-service, in the order given) come first, then the Services whose
// owners annotated them `ipvs-node-controller/probe: "true"`, the oldest first (as a contested
// key goes to the oldest: a tenant's new Service never displaces one already probed), up to
// --probe-max-services in all. Of each, its first MAX_PATHS_PER_SERVICE translated paths in the
// model's order, leaving out those the node's own connections are not translated for
// (loadBalancerSourceRanges that leave the node out). One tenant's Service of 10,000 ports costs
// what one of four does.

import { creationTime, precedes, serviceKey, type Precedence } from '../model/types.js';
import type { DesiredState, Entry, ServiceInfo } from '../model/types.js';

/** Paths of one Service tried in a round, at most. */
export const MAX_PATHS_PER_SERVICE = 4;

export type ProbeOrigin = 'flag' | 'annotation';

export interface ProbedService {
  service: string;
  origin: ProbeOrigin;
  /** What is tried; empty with `notProbed` when the node translates nothing of it that it can try. */
  paths: Entry[];
  notProbed?: string;
}

/** The Services of this round, at most `maxServices`, with their paths. */
export function probedServices(
  named: readonly string[],
  services: readonly ServiceInfo[],
  desired: DesiredState | undefined,
  maxServices: number,
): ProbedService[] {
  const chosen: Array<{ service: string; origin: ProbeOrigin }> = [];
  const seen = new Set<string>();
  for (const service of named) {
    if (chosen.length >= maxServices) break;
    if (seen.has(service)) continue;
    seen.add(service);
    chosen.push({ service, origin: 'flag' });
  }
  // One pass over the Services: the annotated ones, and whether each named one exists (only
  // those and the Services of a named one's namespace are keyed).
  const namedNamespaces = new Set(chosen.map((c) => c.service.slice(0, c.service.indexOf('/'))));
  const known = new Set<string>();
  const annotated: Precedence[] = [];
  services.forEach((s, seq) => {
    if (s.probe !== true && !namedNamespaces.has(s.namespace)) return;
    const key = serviceKey(s);
    if (seen.has(key)) known.add(key);
    else if (s.probe === true) annotated.push({ created: creationTime(s), service: key, seq });
  });
  if (chosen.length < maxServices) {
    annotated.sort((a, b) => (precedes(a, b) ? -1 : precedes(b, a) ? 1 : 0));
    for (const a of annotated.slice(0, maxServices - chosen.length)) {
      chosen.push({ service: a.service, origin: 'annotation' });
      known.add(a.service);
    }
  }
  const paths = new Map<string, Entry[]>(chosen.map((c) => [c.service, []]));
  const leftOut = new Set<string>();
  if (desired) {
    for (const entries of [desired.ipv4.entries, desired.ipv6.entries]) {
      for (const e of entries) {
        const list = paths.get(e.service);
        if (!list) continue;
        if (e.sourceRanges && !e.sourcesFromNode) leftOut.add(e.service);
        else if (list.length < MAX_PATHS_PER_SERVICE) list.push(e);
      }
    }
  }
  return chosen.map(({ service, origin }) => {
    const list = paths.get(service)!;
    if (list.length > 0) return { service, origin, paths: list };
    const notProbed = !known.has(service)
      ? 'no such Service on the API server'
      : leftOut.has(service)
        ? "loadBalancerSourceRanges leave the node's own connections untranslated"
        : 'nothing of it is translated on this node (see the skips)';
    return { service, origin, paths: [], notProbed };
  });
}
