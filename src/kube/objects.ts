// API objects -> the stripped shapes the model reads. Never trusts the object: any field may be
// missing or of the wrong type; what is unusable becomes undefined and the model skips it.
// Accepts both raw JSON (watch events, files) and client-node's deserialized models (Date timestamps).

import { PROBE_ANNOTATION, SKIP_ANNOTATION, type NodeInfo, type ServiceInfo } from '../model/types.js';

type Loose = Record<string, unknown>;

function obj(v: unknown): Loose | undefined {
  return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Loose) : undefined;
}

function str(v: unknown): string | undefined {
  return typeof v === 'string' ? v : undefined;
}

function strList(v: unknown): string[] | undefined {
  return Array.isArray(v) ? v.map((x) => (typeof x === 'string' ? x : String(x))) : undefined;
}

/**
 * Values that repeat across Services (type, policies, protocols, port names, ipMode) shared as
 * one string each: JSON.parse makes a fresh copy per object, 30-odd bytes each, kept per Service.
 * Bounded, so that values that do not repeat cannot grow it without limit.
 */
const COMMON_VALUES = new Map<string, string>();
const MAX_COMMON_VALUES = 1024;

function common(v: unknown): string | undefined {
  if (typeof v !== 'string') return undefined;
  const known = COMMON_VALUES.get(v);
  if (known !== undefined) return known;
  if (COMMON_VALUES.size < MAX_COMMON_VALUES && v.length <= 64) COMMON_VALUES.set(v, v);
  return v;
}

type Port = NonNullable<ServiceInfo['ports']>[number];

/**
 * Port lists shared by every Service that has the same one ([TCP 80, TCP 443] is everywhere),
 * frozen: an array and an object per port would otherwise be kept per Service. Bounded as
 * COMMON_VALUES; lists that are long or made of unusual values are kept per Service.
 */
const COMMON_PORT_LISTS = new Map<string, readonly Port[]>();
const MAX_COMMON_PORT_LISTS = 1024;
const MAX_COMMON_PORT_LIST_LENGTH = 8;

function portList(v: unknown): Port[] | undefined {
  if (!Array.isArray(v)) return undefined;
  const ports = v.map((p): Port => {
    const port = obj(p) ?? {};
    // The port's name is not read by the model: not kept.
    return { protocol: common(port.protocol), port: port.port as number | undefined };
  });
  if (ports.length > MAX_COMMON_PORT_LIST_LENGTH) return ports;
  const parts: string[] = [];
  for (const p of ports) {
    if (!Number.isInteger(p.port) || (p.protocol !== undefined && p.protocol.length > 8)) return ports;
    parts.push(`${p.protocol ?? ''}/${p.port}`);
  }
  const key = parts.join(',');
  const known = COMMON_PORT_LISTS.get(key);
  if (known) return known as Port[];
  if (COMMON_PORT_LISTS.size >= MAX_COMMON_PORT_LISTS) return ports;
  const shared = Object.freeze(ports.map((p) => Object.freeze(p)));
  COMMON_PORT_LISTS.set(key, shared);
  return shared as Port[];
}

function timestamp(v: unknown): string | undefined {
  if (v instanceof Date) return Number.isNaN(v.getTime()) ? undefined : v.toISOString();
  return str(v);
}

export function toServiceInfo(raw: unknown): ServiceInfo | undefined {
  const o = obj(raw);
  const meta = obj(o?.metadata);
  const name = str(meta?.name);
  const namespace = str(meta?.namespace);
  const annotations = obj(meta?.annotations);
  if (!o || !name || !namespace) return undefined;
  const spec = obj(o.spec) ?? {};
  const status = obj(o.status) ?? {};
  const ingress = obj(status.loadBalancer)?.ingress;
  const ports = Array.isArray(spec.ports) ? spec.ports : undefined;
  const clusterIP = str(spec.clusterIP);
  // The primary ClusterIP is also clusterIPs[0]: one string for both, and no list when it is the
  // only one (the model reads clusterIP when clusterIPs is missing).
  let clusterIPs = strList(spec.clusterIPs)?.map((ip) => (ip === clusterIP ? clusterIP : ip));
  if (clusterIPs?.length === 1 && clusterIPs[0] === clusterIP && clusterIP !== '') clusterIPs = undefined;
  return {
    namespace,
    name,
    uid: str(meta?.uid),
    creationTimestamp: timestamp(meta?.creationTimestamp),
    type: common(spec.type),
    clusterIP,
    clusterIPs,
    externalIPs: strList(spec.externalIPs),
    ...(Array.isArray(spec.loadBalancerSourceRanges) && spec.loadBalancerSourceRanges.length > 0
      ? { loadBalancerSourceRanges: strList(spec.loadBalancerSourceRanges) }
      : {}),
    externalTrafficPolicy: common(spec.externalTrafficPolicy),
    ports: portList(ports),
    ingress: Array.isArray(ingress)
      ? ingress.map((i) => {
          const entry = obj(i) ?? {};
          return { ip: str(entry.ip), hostname: str(entry.hostname), ipMode: common(entry.ipMode) };
        })
      : undefined,
    // Annotations are not kept (memory): only the booleans the model and the probe read.
    ...(annotations?.[SKIP_ANNOTATION] === 'true' ? { skip: true } : {}),
    ...(annotations?.[PROBE_ANNOTATION] === 'true' ? { probe: true } : {}),
  };
}

export function toNodeInfo(raw: unknown): NodeInfo | undefined {
  const o = obj(raw);
  const name = str(obj(o?.metadata)?.name);
  if (!o || !name) return undefined;
  const spec = obj(o.spec) ?? {};
  const listed = (Array.isArray(obj(o.status)?.addresses) ? (obj(o.status)!.addresses as unknown[]) : []).map((a) =>
    obj(a),
  );
  const ofType = (type: string) =>
    listed
      .filter((a) => a?.type === type)
      .map((a) => str(a!.address))
      .filter((a): a is string => a !== undefined);
  const addresses = listed
    .filter((a) => a?.type === 'InternalIP' || a?.type === 'ExternalIP')
    .map((a) => str(a!.address))
    .filter((a): a is string => a !== undefined);
  // kube-proxy's node IPs: InternalIP addresses first, then ExternalIP ones (GetNodeHostIPs).
  const hostIPs = [...ofType('InternalIP'), ...ofType('ExternalIP')];
  return {
    name,
    podCIDR: str(spec.podCIDR),
    podCIDRs: strList(spec.podCIDRs),
    ...(addresses.length > 0 ? { addresses, hostIPs } : {}),
  };
}
