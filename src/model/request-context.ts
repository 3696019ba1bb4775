// What the Service rules (service-rules.ts) read beyond the Service itself: the configuration,
// the node's own addresses and node IPs, and the ClusterIPs of every Service. Prepared once per
// model, and again when the node's addresses change.

import { nodeScopedKind, parseCidr, parseIp, type ParsedCidr, type ParsedIp } from './ip.js';
import { DEFAULT_MAX_ENTRIES_PER_SERVICE, type Family, type ModelConfig, type NodeInfo } from './types.js';

/** What the rules read beyond the Service itself, prepared once per model. */
export interface RequestContext {
  config: ModelConfig;
  maxEntriesPerService: number;
  /** The node's own addresses, canonical. */
  nodeAddresses: ReadonlySet<string>;
  /** --service-external-ip-range, parsed; undefined: any address. */
  externalIpRanges: ParsedCidr[] | undefined;
  /** kube-proxy's AllowServiceExternalIPs gate. */
  allowServiceExternalIPs: boolean;
  /** The ClusterIPs of every Service (canonical), kept by the model as Services come and go. */
  clusterIps: ClusterIpLookup;
  /** --service-cluster-ip-range, parsed. */
  serviceCidrs: ParsedCidr[];
  /** --node-address-ranges, parsed. */
  nodeAddressRanges: ParsedCidr[];
  /** The node IP kube-proxy takes per family (its allowFromNode): the Node's first host IP of each. */
  nodeIps: Partial<Record<Family, ParsedIp>>;
  /** Whether the backend filters sources (ModelConfig.sourceRangesSupported). */
  sourceRangesSupported: boolean;
}

/** Whether an address (canonical) is a ClusterIP of some Service. */
export interface ClusterIpLookup {
  has(address: string): boolean;
}

const NO_CLUSTER_IPS: ClusterIpLookup = { has: () => false };

export function requestContext(
  config: ModelConfig,
  node: NodeInfo | undefined,
  interfaceAddresses: readonly string[] = [],
  clusterIps: ClusterIpLookup = NO_CLUSTER_IPS,
): RequestContext {
  const cidrs = (texts: string[] | undefined) => texts?.map((text) => parseCidr(text)).filter((c) => c !== undefined);
  return {
    config,
    maxEntriesPerService: config.maxEntriesPerService ?? DEFAULT_MAX_ENTRIES_PER_SERVICE,
    nodeAddresses: nodeAddresses([...(node?.addresses ?? []), ...interfaceAddresses]),
    externalIpRanges: cidrs(config.externalIpRanges),
    allowServiceExternalIPs: config.allowServiceExternalIPs !== false,
    clusterIps,
    serviceCidrs: cidrs(config.serviceCidrs) ?? [],
    nodeAddressRanges: cidrs(config.nodeAddressRanges) ?? [],
    nodeIps: nodeIps(node?.hostIPs ?? []),
    sourceRangesSupported: config.sourceRangesSupported !== false,
  };
}

/** The first address of each family, as kube-proxy picks its node IPs from the Node's host IPs. */
function nodeIps(texts: readonly string[]): Partial<Record<Family, ParsedIp>> {
  const out: Partial<Record<Family, ParsedIp>> = {};
  for (const text of texts) {
    const ip = parseIp(text);
    if (ip) out[ip.family] ??= ip;
  }
  return out;
}

/** The node's own addresses, canonical; what is not an address is ignored. */
/**
 * The node's addresses a Service could claim: what always means this node (link-local, loopback:
 * nodeScopedKind) is skipped whatever the node's addresses, so it is left out here and a pod's
 * veth (its host side has only its `fe80::` address) changes nothing.
 */
function nodeAddresses(texts: readonly string[]): Set<string> {
  const out = new Set<string>();
  for (const text of texts) {
    const ip = parseIp(text);
    if (ip && !nodeScopedKind(ip)) out.add(ip.address);
  }
  return out;
}
