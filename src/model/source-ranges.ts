// loadBalancerSourceRanges as kube-proxy reads them: which sources of a LoadBalancer address are
// translated (semantics.md, source ranges).

import { cidrContains, disjointCidrs, formatCidr, parseSourceRange } from './ip.js';
import type { ParsedCidr, ParsedIp } from './ip.js';
import { FAMILIES, type Family } from './types.js';

/**
 * A Service's loadBalancerSourceRanges as kube-proxy reads them, per family: invalid ones left
 * out (kube-proxy logs and ignores them), a family whose ranges include 0.0.0.0/0 or ::/0 not
 * filtered, and a family with no range not filtered either. Undefined for a family kube-proxy does
 * not filter; `invalid` lists what was left out.
 */
export function sourceRangesByFamily(texts: readonly unknown[] | undefined): {
  ranges: Partial<Record<Family, ParsedCidr[]>>;
  invalid: string[];
  count: number;
} {
  const byFamily: Record<Family, ParsedCidr[]> = { ipv4: [], ipv6: [] };
  const invalid: string[] = [];
  let count = 0;
  for (const text of texts ?? []) {
    const cidr = parseSourceRange(text);
    if (!cidr) {
      // kube-proxy ignores an empty string without a word.
      if (typeof text !== 'string' || text.trim() !== '') invalid.push(String(text));
      continue;
    }
    byFamily[cidr.family].push(cidr);
    count++;
  }
  const ranges: Partial<Record<Family, ParsedCidr[]>> = {};
  for (const family of FAMILIES) {
    const list = byFamily[family];
    if (list.length === 0 || list.some((c) => c.prefixLength === 0)) continue;
    ranges[family] = disjointCidrs(list);
  }
  return { ranges, invalid, count };
}

/**
 * How an address's ranges filter its sources, as kube-proxy does: a source inside a range is let
 * through, but the LoadBalancer IP itself (the source a node process gets for an address bound on
 * kube-ipvs0) only when the node IP of its family is inside a range (allowFromNode), whether a
 * range holds the LoadBalancer IP or not. The ranges are those of the Service, never split around
 * one of its addresses: every address of the family shares them (`ranges` is returned as given).
 */
export interface SourceFilter {
  sourceRanges: readonly string[];
  /** The address itself, as a source, is translated (Entry.sourcesFromNode). */
  sourcesFromNode: boolean;
}

export function sourceFilter(ranges: readonly ParsedCidr[], nodeIp: ParsedIp | undefined): SourceFilter {
  return {
    sourceRanges: ranges.map(formatCidr),
    sourcesFromNode: nodeIp !== undefined && ranges.some((c) => cidrContains(c, nodeIp)),
  };
}
