// What a write does to an object, whether it comes over HTTP or from a test's apply(): metadata
// filled in (uid, creationTimestamp, generation), the defaults the real server gives a new
// Service (a ClusterIP allocated from 10.96.0.0/16) or Namespace, and a replace that changes
// nothing left as a no-op (no new resourceVersion, no event).

import { randomUUID } from 'node:crypto';
import { isIP } from 'node:net';
import { isDeepStrictEqual } from 'node:util';
import type { KubeObject } from './errors.js';
import { resourceOfKind, rfc3339, type Resource } from './resources.js';
import type { ObjectStore } from './store.js';

export class ObjectWriter {
  private nextClusterIp = 10;

  constructor(private readonly store: ObjectStore) {
    for (const name of ['default', 'kube-system']) this.ensureNamespace(name);
  }

  /** defaults: as the real server fills in a new object (HTTP creates); apply() stores shapes as given. */
  create(resource: Resource, incoming: KubeObject, opts: { defaults: boolean }): KubeObject {
    if (resource.namespaced) this.ensureNamespace(incoming.metadata.namespace);
    const obj = structuredClone(incoming);
    const meta = obj.metadata;
    meta.uid ??= randomUUID();
    meta.creationTimestamp ??= rfc3339(new Date());
    meta.generation = 1;
    delete meta.resourceVersion;
    delete meta.deletionTimestamp;
    if (opts.defaults && resource.kind === 'Service') this.defaultService(obj, undefined);
    if (opts.defaults && resource.kind === 'Namespace') defaultNamespace(obj);
    return this.store.put(resource, obj);
  }

  /** keepCreation: uid and creationTimestamp stay those of the stored object (HTTP writes). */
  update(resource: Resource, existing: KubeObject, incoming: KubeObject, opts: { keepCreation: boolean }): KubeObject {
    const obj = structuredClone(incoming);
    const meta = obj.metadata;
    meta.uid = existing.metadata.uid;
    if (opts.keepCreation || !meta.creationTimestamp) meta.creationTimestamp = existing.metadata.creationTimestamp;
    const specChanged = !isDeepStrictEqual(obj.spec, existing.spec);
    meta.generation = (existing.metadata.generation ?? 1) + (specChanged ? 1 : 0);
    meta.resourceVersion = existing.metadata.resourceVersion;
    if (isDeepStrictEqual(obj, existing)) return existing;
    return this.store.put(resource, obj);
  }

  /** What the real server fills in on a new Service; a replace keeps the allocated ClusterIP. */
  defaultService(svc: KubeObject, existing: KubeObject | undefined): void {
    const spec = (svc.spec ??= {});
    spec.type ??= 'ClusterIP';
    if (spec.type !== 'ExternalName') {
      if (!spec.clusterIP && existing?.spec?.clusterIP) {
        spec.clusterIP = existing.spec.clusterIP;
        spec.clusterIPs ??= existing.spec.clusterIPs;
      }
      if (!spec.clusterIP) spec.clusterIP = this.allocateClusterIp();
      spec.clusterIPs ??= [spec.clusterIP];
      if (spec.clusterIP !== 'None') {
        spec.ipFamilies ??= spec.clusterIPs.map((ip: string) => (isIP(ip) === 6 ? 'IPv6' : 'IPv4'));
      }
      spec.ipFamilyPolicy ??= spec.clusterIPs.length > 1 ? 'PreferDualStack' : 'SingleStack';
      spec.sessionAffinity ??= 'None';
      spec.internalTrafficPolicy ??= 'Cluster';
    }
    for (const port of spec.ports ?? []) {
      port.protocol ??= 'TCP';
      port.targetPort ??= port.port;
    }
    svc.status ??= { loadBalancer: {} };
  }

  private ensureNamespace(name: string): void {
    const namespaces = resourceOfKind('Namespace');
    if (this.store.get(namespaces, undefined, name)) return;
    this.create(namespaces, { apiVersion: 'v1', kind: 'Namespace', metadata: { name } }, { defaults: true });
  }

  private allocateClusterIp(): string {
    const inUse = new Set(this.store.list(resourceOfKind('Service')).map((s) => s.spec?.clusterIP));
    for (;;) {
      const n = this.nextClusterIp++;
      const ip = `10.96.${(n >> 8) & 255}.${n & 255}`;
      if (!inUse.has(ip)) return ip;
    }
  }
}

function defaultNamespace(ns: KubeObject): void {
  ns.metadata.labels = { ...ns.metadata.labels, 'kubernetes.io/metadata.name': ns.metadata.name };
  ns.spec ??= { finalizers: ['kubernetes'] };
  ns.status ??= { phase: 'Active' };
}
