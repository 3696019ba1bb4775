// The pure model: Services + this Node + config -> DesiredState. No I/O.
// The rules are those of design/semantics.md; test/unit/model.test.ts covers each row.

import { ipSortKey, parseCidr, parseIp, formatCidr } from './ip.js';
import {
  PROTOCOLS,
  type Conflict,
  type DesiredState,
  type Entry,
  type Family,
  type FamilyState,
  type LocalPodMatch,
  type ModelConfig,
  type NodeInfo,
  type Protocol,
  type ServiceInfo,
  type Skip,
} from './types.js';

interface Candidate extends Entry {
  created: number;
}

export function serviceKey(svc: Pick<ServiceInfo, 'namespace' | 'name'>): string {
  return `${svc.namespace}/${svc.name}`;
}

/** Computes what must be programmed. Output order is deterministic whatever the input order. */
export function buildDesiredState(
  services: Iterable<ServiceInfo>,
  node: NodeInfo | undefined,
  config: ModelConfig,
): DesiredState {
  const skips: Skip[] = [];
  const byKey = new Map<string, Candidate>();
  const conflicts: Conflict[] = [];

  for (const svc of services) {
    for (const c of serviceCandidates(svc, config, skips)) {
      const key = `${c.family}|${c.externalIp}|${c.protocol}|${c.port}`;
      const held = byKey.get(key);
      if (!held) {
        byKey.set(key, c);
        continue;
      }
      if (held.service === c.service) continue; // same Service, address listed twice
      const [winner, loser] = olderFirst(held, c);
      byKey.set(key, winner);
      conflicts.push({
        family: c.family,
        externalIp: c.externalIp,
        protocol: c.protocol,
        port: c.port,
        winner: winner.service,
        loser: loser.service,
      });
    }
  }
  // A loser of one comparison may have beaten an earlier holder: report against the final winner.
  const finalConflicts = conflicts
    .map((c) => ({ ...c, winner: byKey.get(`${c.family}|${c.externalIp}|${c.protocol}|${c.port}`)!.service }))
    .filter((c) => c.loser !== c.winner)
    .sort((a, b) => cmp(conflictSortKey(a), conflictSortKey(b)));

  const perFamily: Record<Family, Entry[]> = { ipv4: [], ipv6: [] };
  const sortKeys = new Map<Entry, string>();
  for (const c of byKey.values()) {
    const entry: Entry = {
      family: c.family,
      externalIp: c.externalIp,
      protocol: c.protocol,
      port: c.port,
      clusterIp: c.clusterIp,
      service: c.service,
    };
    sortKeys.set(entry, `${ipSortKey(c.externalIp)}|${c.protocol}|${String(c.port).padStart(5, '0')}`);
    perFamily[c.family].push(entry);
  }
  for (const list of Object.values(perFamily)) list.sort((a, b) => cmp(sortKeys.get(a)!, sortKeys.get(b)!));

  skips.sort((a, b) => cmp(`${a.service}|${a.reason}|${a.detail}`, `${b.service}|${b.reason}|${b.detail}`));

  const state = (family: Family): FamilyState => ({
    entries: perFamily[family],
    localPodMatch: localPodMatch(family, node, config),
  });
  return {
    ipv4: state('ipv4'),
    ipv6: state('ipv6'),
    masqueradeMark: 2 ** config.masqueradeBit,
    skips,
    conflicts: finalConflicts,
  };
}

function conflictSortKey(c: Conflict): string {
  return `${c.family}|${ipSortKey(c.externalIp)}|${c.protocol}|${c.port}|${c.loser}`;
}

function cmp(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function olderFirst(a: Candidate, b: Candidate): [Candidate, Candidate] {
  if (a.created !== b.created) return a.created < b.created ? [a, b] : [b, a];
  return a.service < b.service ? [a, b] : [b, a];
}

function creationTime(svc: ServiceInfo): number {
  const t = svc.creationTimestamp ? Date.parse(svc.creationTimestamp) : NaN;
  return Number.isFinite(t) ? t : Number.POSITIVE_INFINITY;
}

/** The entries one Service asks for, before conflicts between Services are resolved. */
function serviceCandidates(svc: ServiceInfo, config: ModelConfig, skips: Skip[]): Candidate[] {
  const service = serviceKey(svc);
  const skip = (reason: Skip['reason'], detail: string) => skips.push({ service, reason, detail });

  if (!isDnsName(svc.namespace, 63) || !isDnsName(svc.name, 63)) {
    // The name becomes a rule comment; a real API server never serves such a name.
    skip('invalidName', 'namespace or name is not a DNS label');
    return [];
  }
  // Addresses the Service exposes, in the order they appear.
  const requested: string[] = [];
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
      requested.push(ing.ip);
    }
  }
  for (const ip of svc.externalIPs ?? []) requested.push(ip);
  if (requested.length === 0) return [];

  if (config.localTrafficPolicyOnly && svc.externalTrafficPolicy !== 'Local') {
    skip('notLocalTrafficPolicy', `externalTrafficPolicy ${svc.externalTrafficPolicy ?? 'Cluster'}`);
    return [];
  }
  if (svc.type === 'ExternalName') {
    skip('externalName', 'type ExternalName');
    return [];
  }
  const clusterIpTexts = svc.clusterIPs && svc.clusterIPs.length > 0 ? svc.clusterIPs : [svc.clusterIP ?? ''];
  if (clusterIpTexts.includes('None')) {
    skip('headless', 'clusterIP None');
    return [];
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
    return [];
  }

  const ports: Array<{ protocol: Protocol; port: number }> = [];
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
    ports.push({ protocol, port: p.port! });
  }
  if (ports.length === 0) return [];

  const created = creationTime(svc);
  const out: Candidate[] = [];
  const seen = new Set<string>();
  for (const text of requested) {
    const ip = parseIp(text);
    if (!ip) {
      skip('invalidAddress', `external address ${String(text)}`);
      continue;
    }
    if (seen.has(ip.address)) continue;
    seen.add(ip.address);
    const clusterIp = clusterIps[ip.family];
    if (!clusterIp) {
      skip('familyWithoutClusterIP', `${ip.address} has no ${ip.family} clusterIP`);
      continue;
    }
    for (const { protocol, port } of ports) {
      out.push({ family: ip.family, externalIp: ip.address, protocol, port, clusterIp, service, created });
    }
  }
  return out;
}

function isDnsName(text: unknown, maxLength: number): boolean {
  return typeof text === 'string' && text.length <= maxLength && /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(text);
}

function localPodMatch(family: Family, node: NodeInfo | undefined, config: ModelConfig): LocalPodMatch {
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
      if (!config.podBridgeInterface) return { kind: 'none', reason: 'BridgeInterface mode: no --pod-bridge-interface' };
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

export function totalEntries(state: DesiredState): number {
  return state.ipv4.entries.length + state.ipv6.entries.length;
}
