// The Service rules of design/semantics.md for one Service: which of its addresses are
// translated, to which ClusterIP, which are skipped and why, and which Service holds an address
// that several claim. test/unit/model.test.ts covers each row.

import { parsedIpSortKey, parseIp, type ParsedIp } from './ip.js';
import {
  PROTOCOLS,
  SKIP_ANNOTATION,
  type Family,
  type ModelConfig,
  type Protocol,
  type ServiceInfo,
  type Skip,
} from './types.js';

export function serviceKey(svc: Pick<ServiceInfo, 'namespace' | 'name'>): string {
  return flat([svc.namespace, '/', svc.name]);
}

/**
 * A string kept for as long as its Service: joined, it is one flat string; a template literal
 * would be a tree of pieces, several times its size.
 */
export function flat(parts: unknown[]): string {
  return parts.join('');
}

/** What decides which of several Services claiming one map key holds it. */
export interface Precedence {
  created: number;
  service: string;
  /** Order of first sight: breaks ties between two objects of one name (possible in files only). */
  seq: number;
}

/** The holder of a key: the oldest Service, ties broken by namespace/name (then by first sight). */
export function precedes(a: Precedence, b: Precedence): boolean {
  if (a.created !== b.created) return a.created < b.created;
  if (a.service !== b.service) return a.service < b.service;
  return a.seq < b.seq;
}

/** Milliseconds since the epoch; a Service without a valid time is the youngest. */
export function creationTime(svc: ServiceInfo): number {
  const t = svc.creationTimestamp ? Date.parse(svc.creationTimestamp) : NaN;
  return Number.isFinite(t) ? t : Number.POSITIVE_INFINITY;
}

/** One entry a Service asks for. */
export interface Candidate {
  family: Family;
  ip: ParsedIp;
  ipSortKey: string;
  protocol: Protocol;
  port: number;
  clusterIp: string;
}

/** The entries one Service asks for, before conflicts between Services are resolved. */
export function serviceCandidates(
  svc: ServiceInfo,
  config: ModelConfig,
  skips: Skip[],
  service = serviceKey(svc),
): Candidate[] {
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

  if (svc.skip === true) {
    skip('optedOut', `annotation ${SKIP_ANNOTATION}: "true"`);
    return [];
  }
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
    const sortKey = parsedIpSortKey(ip);
    for (const { protocol, port } of ports) {
      out.push({ family: ip.family, ip, ipSortKey: sortKey, protocol, port, clusterIp });
    }
  }
  return out;
}

function isDnsName(text: unknown, maxLength: number): boolean {
  return typeof text === 'string' && text.length <= maxLength && /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(text);
}
