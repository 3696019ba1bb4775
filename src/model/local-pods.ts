// Local-pod detection: how each detect-local mode of design/semantics.md tells traffic from this
// node's pods, per family, or why it cannot.

import { formatCidr, parseCidr } from './ip.js';
import type { Family, LocalPodMatch, ModelConfig, NodeInfo } from './types.js';

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
