// Server-side printing: kubectl asks for meta.k8s.io Tables (`get`, `get -w`); these are the
// columns the real server prints for each resource.

import type { IncomingMessage } from 'node:http';
import type { KubeObject } from './errors.js';
import { withTypeMeta, type Resource, type StoredKind } from './resources.js';

interface Column {
  name: string;
  type: 'string' | 'integer';
  format?: string;
  priority?: number;
  description: string;
  cell: (obj: KubeObject, now: number) => string | number;
}

function age(obj: KubeObject, now: number): string {
  const created = Date.parse(obj.metadata?.creationTimestamp ?? '');
  if (Number.isNaN(created)) return '<unknown>';
  const s = Math.max(0, Math.floor((now - created) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 48 * 3600) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

const NAME_COLUMN: Column = {
  name: 'Name',
  type: 'string',
  format: 'name',
  description: 'Name of the object',
  cell: (o) => o.metadata?.name ?? '',
};
const AGE_COLUMN: Column = {
  name: 'Age',
  type: 'string',
  description: 'Time since creation',
  cell: age,
};

function serviceExternalIPs(svc: KubeObject): string {
  const ips: string[] = [...(svc.spec?.externalIPs ?? [])];
  if (svc.spec?.type === 'LoadBalancer') {
    for (const ingress of svc.status?.loadBalancer?.ingress ?? []) {
      if (ingress.ip) ips.push(ingress.ip);
      else if (ingress.hostname) ips.push(ingress.hostname);
    }
    if (ips.length === 0) return '<pending>';
  }
  if (svc.spec?.type === 'ExternalName') return svc.spec.externalName ?? '<none>';
  return ips.length > 0 ? ips.join(',') : '<none>';
}

function nodeStatus(node: KubeObject): string {
  const ready = (node.status?.conditions ?? []).find((c: KubeObject) => c.type === 'Ready');
  const status = !ready ? 'Unknown' : ready.status === 'True' ? 'Ready' : 'NotReady';
  return node.spec?.unschedulable ? `${status},SchedulingDisabled` : status;
}

function nodeAddress(node: KubeObject, type: string): string {
  return (node.status?.addresses ?? []).find((a: KubeObject) => a.type === type)?.address ?? '<none>';
}

const TABLE_COLUMNS: Record<StoredKind, Column[]> = {
  Service: [
    NAME_COLUMN,
    { name: 'Type', type: 'string', description: 'Service type', cell: (s) => s.spec?.type ?? 'ClusterIP' },
    {
      name: 'Cluster-IP',
      type: 'string',
      description: 'Cluster IP',
      cell: (s) => (s.spec?.type === 'ExternalName' ? '<none>' : s.spec?.clusterIP || '<none>'),
    },
    { name: 'External-IP', type: 'string', description: 'External IPs', cell: serviceExternalIPs },
    {
      name: 'Port(s)',
      type: 'string',
      description: 'Service ports',
      cell: (s) =>
        (s.spec?.ports ?? [])
          .map((p: KubeObject) => `${p.port}${p.nodePort ? `:${p.nodePort}` : ''}/${p.protocol ?? 'TCP'}`)
          .join(',') || '<none>',
    },
    AGE_COLUMN,
    {
      name: 'Selector',
      type: 'string',
      priority: 1,
      description: 'Pod selector',
      cell: (s) =>
        Object.entries(s.spec?.selector ?? {})
          .map(([k, v]) => `${k}=${String(v)}`)
          .join(',') || '<none>',
    },
  ],
  Node: [
    NAME_COLUMN,
    { name: 'Status', type: 'string', description: 'Readiness', cell: nodeStatus },
    {
      name: 'Roles',
      type: 'string',
      description: 'Node roles',
      cell: (n) =>
        Object.keys(n.metadata?.labels ?? {})
          .filter((l) => l.startsWith('node-role.kubernetes.io/'))
          .map((l) => l.slice('node-role.kubernetes.io/'.length))
          .join(',') || '<none>',
    },
    AGE_COLUMN,
    {
      name: 'Version',
      type: 'string',
      description: 'Kubelet version',
      cell: (n) => n.status?.nodeInfo?.kubeletVersion ?? '',
    },
    {
      name: 'Internal-IP',
      type: 'string',
      priority: 1,
      description: 'Internal address',
      cell: (n) => nodeAddress(n, 'InternalIP'),
    },
    {
      name: 'External-IP',
      type: 'string',
      priority: 1,
      description: 'External address',
      cell: (n) => nodeAddress(n, 'ExternalIP'),
    },
  ],
  Event: [
    NAME_COLUMN,
    { name: 'Type', type: 'string', description: 'Event type', cell: (e) => e.type ?? '' },
    { name: 'Reason', type: 'string', description: 'Reason', cell: (e) => e.reason ?? '' },
    {
      name: 'Object',
      type: 'string',
      description: 'Involved object',
      cell: (e) => `${(e.involvedObject?.kind ?? '').toLowerCase()}/${e.involvedObject?.name ?? ''}`,
    },
    { name: 'Message', type: 'string', description: 'Message', cell: (e) => e.message ?? '' },
  ],
  Namespace: [
    NAME_COLUMN,
    { name: 'Status', type: 'string', description: 'Phase', cell: (n) => n.status?.phase ?? 'Active' },
    AGE_COLUMN,
  ],
};

export function toTable(
  resource: Resource,
  items: KubeObject[],
  listMeta: KubeObject,
  includeObject: string,
): KubeObject {
  const columns = TABLE_COLUMNS[resource.kind];
  const now = Date.now();
  return {
    kind: 'Table',
    apiVersion: 'meta.k8s.io/v1',
    metadata: listMeta,
    columnDefinitions: columns.map((c) => ({
      name: c.name,
      type: c.type,
      format: c.format ?? '',
      description: c.description,
      priority: c.priority ?? 0,
    })),
    rows: items.map((obj) => ({
      cells: columns.map((c) => c.cell(obj, now)),
      object:
        includeObject === 'None'
          ? undefined
          : includeObject === 'Object'
            ? withTypeMeta(resource, obj)
            : { kind: 'PartialObjectMetadata', apiVersion: 'meta.k8s.io/v1', metadata: obj.metadata },
    })),
  };
}

export function wantsTable(req: IncomingMessage): boolean {
  return /as=Table/.test(req.headers.accept ?? '');
}
