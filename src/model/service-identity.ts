// Who a Service is, and which of two Services comes first where both ask for one thing (a map
// key, or room in the entries the backend is given): the oldest, then by namespace/name.

import type { ServiceInfo } from './types.js';

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
