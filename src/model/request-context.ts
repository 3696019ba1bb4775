// What the Service rules (service-rules.ts) read beyond the Service itself: the configuration,
// the node's own addresses and node IPs, and the ClusterIPs of every Service. Prepared once per
// model, and again when the node's addresses change. Also the node's local-pod match per family
// (localPodMatch).

import { formatCidr, nodeScopedKind, parseCidr, type ParsedCidr, type ParsedIp, parseIp } from './ip.js';
import {
  DEFAULT_MAX_ENTRIES_PER_SERVICE,
  type Family,
  type LocalPodMatch,
  type ModelConfig,
  type NodeInfo,
} from './types.js';

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

// Local-pod detection: how each detect-local mode of design/semantics.md tells traffic from this
// node's pods, per family, or why it cannot.

export function localPodMatch(family: Family, node: NodeInfo | undefined, config: ModelConfig): LocalPodMatch {
  switch (config.detectLocalMode) {
    case 'NodeCIDR': {
      if (!node) return { kind: 'none', reason: 'NodeCIDR mode: the Node object was not found' };
      const texts = node.podCIDRs && node.podCIDRs.length > 0 ? node.podCIDRs : node.podCIDR ? [node.podCIDR] : [];
      const cidrs = cidrsOfFamily(texts, family);
      if (cidrs.length === 0) {
        return { kind: 'none', reason: `NodeCIDR mode: node ${node.name} has no ${family} podCIDR` };
      }
      return { kind: 'cidrs', cidrs };
    }
    case 'ClusterCIDR': {
      const cidrs = cidrsOfFamily(config.clusterCidrs, family);
      if (cidrs.length === 0) return { kind: 'none', reason: `ClusterCIDR mode: no ${family} --cluster-cidr` };
      return { kind: 'cidrs', cidrs };
    }
    case 'BridgeInterface':
      if (!config.podBridgeInterface)
        return { kind: 'none', reason: 'BridgeInterface mode: no --pod-bridge-interface' };
      return { kind: 'interface', name: config.podBridgeInterface };
    case 'InterfaceNamePrefix':
      if (!config.podInterfaceNamePrefix) {
        return { kind: 'none', reason: 'InterfaceNamePrefix mode: no --pod-interface-name-prefix' };
      }
      return { kind: 'interfacePrefix', prefix: config.podInterfaceNamePrefix };
  }
}

function cidrsOfFamily(texts: string[], family: Family): string[] {
  const out = new Set<string>();
  for (const t of texts) {
    const c = parseCidr(t);
    if (c && c.family === family) out.add(formatCidr(c));
  }
  return [...out].sort();
}
