// loadBalancerSourceRanges as kube-proxy reads them: which sources of a LoadBalancer address are
// translated (semantics.md, source ranges).

import { cidrContains, cidrsWithout, disjointCidrs, formatCidr, parseCidr, parseSourceRange } from './ip.js';
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
 * The sources of `ip` that kube-proxy lets through its source-ranges firewall: the ranges, but the
 * LoadBalancer IP itself (the source a node process gets for an address bound on kube-ipvs0) only
 * when the node IP of its family is inside a range (allowFromNode), whether a range holds it or not.
 */
export function allowedSources(ranges: readonly ParsedCidr[], ip: ParsedIp, nodeIp: ParsedIp | undefined): string[] {
  const fromNode = nodeIp !== undefined && ranges.some((c) => cidrContains(c, nodeIp));
  let allowed = cidrsWithout(ranges, ip);
  if (fromNode) allowed = disjointCidrs([...allowed, parseCidr(`${ip.address}/${ip.family === 'ipv4' ? 32 : 128}`)!]);
  return allowed.map(formatCidr);
}
