// The Service rules of design/semantics.md for one Service: which of its addresses are
// translated, to which ClusterIP, and which are skipped and why. What they read beyond the Service
// is its RequestContext (request-context.ts); which Service holds an address that several claim
// is decided by the key contests (key-contests.ts). test/unit/model.test.ts covers each row.

import {
  cidrContains,
  disjointCidrs,
  formatCidr,
  nodeScopedKind,
  type ParsedCidr,
  type ParsedIp,
  parsedIpSortKey,
  parseIp,
  parseSourceRange,
} from './ip.js';
import type { RequestContext } from './request-context.js';
import { serviceKey } from './types.js';
import {
  FAMILIES,
  type Family,
  MAX_SOURCE_RANGES_PER_SERVICE,
  type Protocol,
  PROTOCOLS,
  type ServiceInfo,
  type Skip,
  SKIP_ANNOTATION,
  type SkipReason,
} from './types.js';

/**
 * Calls `each` with every ClusterIP of a Service (canonical), `spec.clusterIPs` and
 * `spec.clusterIP` both: an address may come twice, the same for the same object. What does not
 * parse (`None`, '') is no address.
 */
export function forEachClusterIp(svc: ServiceInfo, each: (address: string) => void): void {
  if (Array.isArray(svc.clusterIPs)) {
    for (const text of svc.clusterIPs) {
      const ip = parseIp(text);
      if (ip) each(ip.address);
    }
  }
  const primary = parseIp(svc.clusterIP);
  if (primary) each(primary.address);
}

/** Why an address belongs to the cluster itself (semantics.md), or undefined. */
function clusterAddressKind(ip: ParsedIp, context: RequestContext): string | undefined {
  if (context.clusterIps.has(ip.address)) return 'the ClusterIP of a Service';
  const cidr = context.serviceCidrs.find((c) => cidrContains(c, ip));
  if (cidr) return `inside the Service CIDR ${formatCidr(cidr)} (--service-cluster-ip-range)`;
  const nodes = context.nodeAddressRanges.find((c) => cidrContains(c, ip));
  if (nodes) return `inside the node address range ${formatCidr(nodes)} (--node-address-ranges)`;
  return undefined;
}

/** One external address a Service asks to have translated, with the ClusterIP of its family. */
export interface RequestedAddress {
  ip: ParsedIp;
  /** Orders addresses numerically (ip.ts ipSortKey). */
  sortKey: string;
  clusterIp: string;
  /** The sources translated (Entry.sourceRanges, Entry.sourcesFromNode); undefined: every source. */
  sources?: SourceFilter;
}

/**
 * What one Service asks for, before conflicts between Services are resolved: every address times
 * every port is one entry. Kept in this form (its size is that of the Service's fields), the
 * entries themselves are made only for a Service that is programmed.
 */
export interface ServiceRequest {
  addresses: RequestedAddress[];
  /** Distinct (protocol, port) pairs. */
  ports: Array<{ protocol: Protocol; port: number }>;
  /** Entries asked for, per family, and the Service's source ranges of the family once (semantics.md, Limits). */
  counts: Record<Family, number>;
}

const NOTHING: ServiceRequest = Object.freeze({
  addresses: [],
  ports: [],
  counts: Object.freeze({ ipv4: 0, ipv6: 0 }),
}) as unknown as ServiceRequest;

/** Skips of one reason a Service reports one by one; the rest are folded into one more. */
export const MAX_SKIPS_PER_REASON = 8;

/** Collects one Service's skips, folding those past MAX_SKIPS_PER_REASON of a reason. */
class ServiceSkips {
  private readonly perReason = new Map<SkipReason, number>();
  private readonly folded = new Map<SkipReason, Skip>();

  constructor(
    private readonly out: Skip[],
    private readonly service: string,
  ) {}

  add(reason: SkipReason, detail: string): void {
    const n = (this.perReason.get(reason) ?? 0) + 1;
    this.perReason.set(reason, n);
    if (n <= MAX_SKIPS_PER_REASON) {
      this.out.push({ service: this.service, reason, detail });
      return;
    }
    const folded = this.folded.get(reason);
    if (folded) folded.count! += 1;
    else {
      const skip: Skip = { service: this.service, reason, detail: '', count: 1 };
      this.folded.set(reason, skip);
      this.out.push(skip);
    }
  }

  finish(): void {
    for (const skip of this.folded.values()) skip.detail = `${skip.count} more of this reason`;
  }
}

/**
 * What one Service asks for, with its skips; the work is linear in its fields. `lookedUp`, when
 * given, receives every address whose fate the ClusterIPs of other Services decide (each once).
 */
export function serviceRequest(
  svc: ServiceInfo,
  context: RequestContext,
  skips: Skip[],
  service = serviceKey(svc),
  lookedUp?: string[],
): ServiceRequest {
  const collector = new ServiceSkips(skips, service);
  const request = readRequest(svc, context, collector, lookedUp);
  collector.finish();
  return request;
}

function readRequest(
  svc: ServiceInfo,
  context: RequestContext,
  skips: ServiceSkips,
  lookedUp: string[] | undefined,
): ServiceRequest {
  const { config } = context;
  const skip = (reason: SkipReason, detail: string) => skips.add(reason, detail);

  if (!isDnsName(svc.namespace, 63) || !isDnsName(svc.name, 63)) {
    // The name becomes a rule comment; a real API server never serves such a name.
    skip('invalidName', 'namespace or name is not a DNS label');
    return NOTHING;
  }
  // Addresses the Service exposes, in the order they appear; `external`: from spec.externalIPs.
  const requested: Array<{ text: string; external: boolean }> = [];
  if (svc.type === 'LoadBalancer') {
    for (const ing of svc.ingress ?? []) {
      if (ing.ip === undefined || ing.ip === '') {
        if (ing.hostname) skip('hostnameOnly', `ingress hostname ${ing.hostname}`);
        continue;
      }
      if (ing.ipMode === 'Proxy') {
        skip('ipModeProxy', `ingress ${String(ing.ip)}`);
        continue;
      }
      if (ing.ipMode !== undefined && ing.ipMode !== 'VIP') {
        skip('unknownIpMode', `ingress ${String(ing.ip)} ipMode ${String(ing.ipMode)}`);
        continue;
      }
      requested.push({ text: ing.ip, external: false });
    }
  }
  for (const ip of svc.externalIPs ?? []) requested.push({ text: ip, external: true });
  if (requested.length === 0) return NOTHING;

  if (svc.skip === true) {
    skip('optedOut', `annotation ${SKIP_ANNOTATION}: "true"`);
    return NOTHING;
  }
  if (config.localTrafficPolicyOnly && svc.externalTrafficPolicy !== 'Local') {
    skip('notLocalTrafficPolicy', `externalTrafficPolicy ${svc.externalTrafficPolicy ?? 'Cluster'}`);
    return NOTHING;
  }
  if (svc.type === 'ExternalName') {
    skip('externalName', 'type ExternalName');
    return NOTHING;
  }
  const clusterIpTexts = svc.clusterIPs && svc.clusterIPs.length > 0 ? svc.clusterIPs : [svc.clusterIP ?? ''];
  if (clusterIpTexts.includes('None')) {
    skip('headless', 'clusterIP None');
    return NOTHING;
  }
  const clusterIps: Partial<Record<Family, string>> = {};
  for (const text of clusterIpTexts) {
    if (text === '' || text === undefined) continue;
    const ip = parseIp(text);
    if (!ip) {
      skip('invalidAddress', `clusterIP ${String(text)}`);
      continue;
    }
    clusterIps[ip.family] ??= ip.address;
  }
  if (!clusterIps.ipv4 && !clusterIps.ipv6) {
    if (clusterIpTexts.every((t) => !t)) skip('noClusterIP', 'empty clusterIP');
    return NOTHING;
  }

  const ports: ServiceRequest['ports'] = [];
  const seenPorts = new Set<string>();
  for (const p of svc.ports ?? []) {
    const protocol = (p.protocol ?? 'TCP') as Protocol;
    if (!PROTOCOLS.includes(protocol)) {
      skip('unsupportedProtocol', `port ${String(p.port)} protocol ${String(p.protocol)}`);
      continue;
    }
    if (!Number.isInteger(p.port) || p.port! < 1 || p.port! > 65535) {
      skip('invalidPort', `port ${String(p.port)}`);
      continue;
    }
    // A port listed twice asks for the same entries twice: once.
    const key = `${protocol}/${p.port}`;
    if (seenPorts.has(key)) continue;
    seenPorts.add(key);
    ports.push({ protocol, port: p.port! });
  }
  if (ports.length === 0) return NOTHING;

  // kube-proxy filters the sources of LoadBalancer addresses only, never of externalIPs.
  const hasIngress = requested.some((r) => !r.external);
  const sources = hasIngress ? sourceRangesByFamily(svc.loadBalancerSourceRanges) : undefined;
  for (const text of sources?.invalid.slice(0, 1) ?? []) {
    skip(
      'invalidAddress',
      `loadBalancerSourceRanges ${text}${sources!.invalid.length > 1 ? ` and ${sources!.invalid.length - 1} more` : ''} (ignored, as kube-proxy does)`,
    );
  }
  const tooManyRanges = sources !== undefined && sources.count > MAX_SOURCE_RANGES_PER_SERVICE;
  /** Each family's source filter, made once: every ranged address of the family shares it. */
  const filters: Partial<Record<Family, SourceFilter>> = {};
  const addresses: RequestedAddress[] = [];
  const seen = new Set<string>();
  for (const { text, external } of requested) {
    const ip = parseIp(text);
    if (!ip) {
      skip('invalidAddress', `external address ${String(text)}`);
      continue;
    }
    if (seen.has(ip.address)) continue;
    seen.add(ip.address);
    const scoped = nodeScopedKind(ip);
    if (scoped || context.nodeAddresses.has(ip.address)) {
      const what = scoped
        ? `${/^[aeiou]/.test(scoped) ? 'an' : 'a'} ${scoped} address`
        : "one of the node's own addresses";
      skip('pointsAtNode', `${ip.address} is ${what}`);
      continue;
    }
    // A tenant claiming kube-dns's ClusterIP would take every pod's DNS on the node.
    lookedUp?.push(ip.address);
    const cluster = clusterAddressKind(ip, context);
    if (cluster) {
      skip('clusterAddress', `${ip.address} is ${cluster}`);
      continue;
    }
    if (external && !context.allowServiceExternalIPs) {
      skip('externalIpsDisabled', `external IP ${ip.address}`);
      continue;
    }
    if (external && context.externalIpRanges && !context.externalIpRanges.some((c) => cidrContains(c, ip))) {
      skip('externalIpNotAllowed', `external IP ${ip.address}`);
      continue;
    }
    const clusterIp = clusterIps[ip.family];
    if (!clusterIp) {
      skip('familyWithoutClusterIP', `${ip.address} has no ${ip.family} clusterIP`);
      continue;
    }
    const ranges = external ? undefined : sources?.ranges[ip.family];
    if (ranges && tooManyRanges) {
      skip(
        'tooManySourceRanges',
        `${ip.address}: ${sources!.count} loadBalancerSourceRanges, more than the ${MAX_SOURCE_RANGES_PER_SERVICE} one Service may have`,
      );
      continue;
    }
    if (ranges && !context.sourceRangesSupported) {
      skip(
        'sourceRangesUnsupported',
        `${ip.address} has loadBalancerSourceRanges, which this backend cannot filter here`,
      );
      continue;
    }
    const address: RequestedAddress = { ip, sortKey: parsedIpSortKey(ip), clusterIp };
    if (ranges) address.sources = filters[ip.family] ??= sourceFilter(ranges, context.nodeIps[ip.family]);
    addresses.push(address);
  }
  if (addresses.length === 0) return NOTHING;

  const counts: Record<Family, number> = { ipv4: 0, ipv6: 0 };
  for (const a of addresses) counts[a.ip.family] += ports.length;
  // A family's ranges are written once for the Service (an object each, whatever its entries):
  // they count as entries, against both limits.
  let rangeCount = 0;
  for (const family of FAMILIES) {
    const n = filters[family]?.sourceRanges.length ?? 0;
    counts[family] += n;
    rangeCount += n;
  }
  const total = counts.ipv4 + counts.ipv6;
  if (total > context.maxEntriesPerService) {
    const ranged = rangeCount > 0 ? ` + ${rangeCount} source ranges` : '';
    skip(
      'tooManyEntries',
      `${addresses.length} addresses x ${ports.length} ports${ranged} = ${total} entries, more than the ${context.maxEntriesPerService} one Service may ask for (--max-entries-per-service)`,
    );
    return NOTHING;
  }
  return { addresses, ports, counts };
}

function isDnsName(text: unknown, maxLength: number): boolean {
  return typeof text === 'string' && text.length <= maxLength && /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(text);
}

// loadBalancerSourceRanges as kube-proxy reads them: which sources of a LoadBalancer address are
// translated (semantics.md, source ranges).

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
