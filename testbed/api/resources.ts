// The core/v1 resources the stand-in serves (Services, Nodes, Events, Namespaces), as discovery
// describes them, and the shape of the objects it stores: plain JSON as on the wire.

import { ApiError, type KubeObject } from './errors.js';

export type StoredKind = 'Service' | 'Node' | 'Event' | 'Namespace';

export type Verb = 'create' | 'delete' | 'get' | 'list' | 'patch' | 'update' | 'watch';

export interface Resource {
  kind: StoredKind;
  plural: string;
  singular: string;
  namespaced: boolean;
  shortNames: string[];
  verbs: Verb[];
  /** Has a status subresource: writes to the main resource keep the stored status. */
  hasStatus: boolean;
  /** DELETE answers with the deleted object (as Services do) rather than a Status. */
  deleteReturnsObject: boolean;
  /** Fields a fieldSelector may name, as the real server allows them for this resource. */
  selectableFields: string[];
  categories?: string[];
}

const ALL_VERBS: Verb[] = ['create', 'delete', 'get', 'list', 'patch', 'update', 'watch'];

export const RESOURCES: readonly Resource[] = [
  {
    kind: 'Service',
    plural: 'services',
    singular: 'service',
    namespaced: true,
    shortNames: ['svc'],
    verbs: ALL_VERBS,
    hasStatus: true,
    deleteReturnsObject: true,
    categories: ['all'],
    selectableFields: ['metadata.name', 'metadata.namespace'],
  },
  {
    kind: 'Node',
    plural: 'nodes',
    singular: 'node',
    namespaced: false,
    shortNames: ['no'],
    verbs: ALL_VERBS,
    hasStatus: true,
    deleteReturnsObject: false,
    selectableFields: ['metadata.name', 'spec.unschedulable'],
  },
  {
    kind: 'Event',
    plural: 'events',
    singular: 'event',
    namespaced: true,
    shortNames: ['ev'],
    verbs: ['create', 'get', 'list', 'watch'],
    hasStatus: false,
    deleteReturnsObject: false,
    selectableFields: [
      'metadata.name',
      'metadata.namespace',
      'involvedObject.kind',
      'involvedObject.namespace',
      'involvedObject.name',
      'involvedObject.uid',
      'involvedObject.apiVersion',
      'involvedObject.resourceVersion',
      'involvedObject.fieldPath',
      'reason',
      'reportingComponent',
      'source',
      'type',
    ],
  },
  {
    kind: 'Namespace',
    plural: 'namespaces',
    singular: 'namespace',
    namespaced: false,
    shortNames: ['ns'],
    verbs: ['create', 'get', 'list', 'watch'],
    hasStatus: false,
    deleteReturnsObject: false,
    selectableFields: ['metadata.name', 'status.phase'],
  },
];

const BY_PLURAL = new Map(RESOURCES.map((r) => [r.plural, r]));
const BY_KIND = new Map(RESOURCES.map((r) => [r.kind as string, r]));

export function resourceOfPlural(plural: string): Resource | undefined {
  return BY_PLURAL.get(plural);
}

export function resourceOfKind(kind: unknown): Resource {
  const resource = BY_KIND.get(String(kind));
  if (!resource) throw new Error(`the API stand-in stores ${[...BY_KIND.keys()].join(', ')}; not kind ${String(kind)}`);
  return resource;
}

export function isPlainObject(v: unknown): v is KubeObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export function objectKey(namespace: string | undefined, name: string): string {
  return `${namespace ?? ''}/${name}`;
}

/** The object with the kind and apiVersion of its resource first, as single objects are served. */
export function withTypeMeta(resource: Resource, obj: KubeObject): KubeObject {
  const { kind: _kind, apiVersion: _apiVersion, ...rest } = obj;
  return { kind: resource.kind, apiVersion: 'v1', ...rest };
}

/** The object as a list item: the real server leaves kind and apiVersion out of them. */
export function withoutTypeMeta(obj: KubeObject): KubeObject {
  const { kind: _kind, apiVersion: _apiVersion, ...rest } = obj;
  return rest;
}

export function rfc3339(date: Date): string {
  return date.toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/** Puts kind, apiVersion and the scope-appropriate namespace on a client-supplied object. */
export function normalize(resource: Resource, obj: KubeObject): KubeObject {
  const copy = structuredClone(obj);
  copy.kind = resource.kind;
  copy.apiVersion = 'v1';
  const meta = (copy.metadata ??= {});
  if (typeof meta.name !== 'string' || meta.name === '') {
    throw new ApiError(422, `${resource.kind} "" is invalid: metadata.name: Required value`);
  }
  if (resource.namespaced) meta.namespace ||= 'default';
  else delete meta.namespace;
  return copy;
}

/** A body's kind and apiVersion, when given, must be those of the resource written. */
export function checkBody(resource: Resource, body: KubeObject): void {
  if (body.kind !== undefined && body.kind !== resource.kind) {
    throw new ApiError(
      400,
      `the kind of the object (${String(body.kind)}) does not match the resource (${resource.kind})`,
    );
  }
  if (body.apiVersion !== undefined && body.apiVersion !== 'v1') {
    throw new ApiError(400, `the API version of the object (${String(body.apiVersion)}) is not v1`);
  }
}
