// An informer's cache: the stripped info of each object by namespace/name, and the log of its
// changes, offered to the model as a ChangeFeed (src/model/change-feed.ts).
// - Only the stripped form is kept: `strip` makes it as each object arrives.
// - An update whose stripped form equals the cached one changes nothing and records nothing (a
//   Node's heartbeat status updates never cause a sync).
// - A whole new state (a list, or a WatchList stream's initial state) is built aside and replaces
//   the cache at once (rebuild): an object it holds unchanged keeps its identity, so a consumer of
//   the feed sees a rebuild as the few changes it made.

import { ChangeLog } from './change-log.js';

/** Structural equality of stripped infos (plain JSON: objects, arrays, primitives, undefined). */
export function sameInfo(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) {
    const bb = b as unknown[];
    if (a.length !== bb.length) return false;
    for (let i = 0; i < a.length; i++) if (!sameInfo(a[i], bb[i])) return false;
    return true;
  }
  const ao = a as Record<string, unknown>;
  const bo = b as Record<string, unknown>;
  for (const key in ao) if (!sameInfo(ao[key], bo[key])) return false;
  for (const key in bo) if (!(key in ao) && bo[key] !== undefined) return false;
  return true;
}

export function plainObject(v: unknown): Record<string, unknown> | undefined {
  return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
}

/** An object as the cache keeps it: its key, its stripped info, and its resourceVersion. */
export interface DecodedObject<T> {
  key: string;
  info: T;
  resourceVersion?: string;
}

/** A new state being built aside (see ObjectStore.rebuild). */
export interface Rebuild {
  /** Puts an object into the new state (or takes it out: `deleted`); false when it is unusable. */
  apply(raw: unknown, deleted: boolean): boolean;
  /** Forgets what was applied: the state is built again from its first object. */
  restart(): void;
  /** The new state replaces the cache whole, each difference recorded; true when anything changed. */
  swap(): boolean;
}

export class ObjectStore<T> {
  /** The info of each object by namespace/name; replaced whole by a rebuild. */
  private objects = new Map<string, T>();
  /** The feed of this cache's changes, read by the model directly. */
  readonly changes: ChangeLog<T>;

  constructor(
    private readonly strip: (raw: unknown) => T | undefined,
    maxChangeLog?: number,
  ) {
    this.changes = new ChangeLog<T>(() => this.list(), maxChangeLog);
  }

  /** The cached objects; a changed object keeps its place, so a sync can compare by identity. */
  list(): T[] {
    return Array.from(this.objects.values());
  }

  /** Empties the cache for a new start: no cursor given before is valid any more. */
  clear(): void {
    this.objects.clear();
    this.changes.restart();
  }

  /** namespace/name, the stripped info and the resourceVersion of an object; undefined if unusable. */
  decode(raw: unknown): DecodedObject<T> | undefined {
    const meta = plainObject(plainObject(raw)?.metadata);
    const name = meta?.name;
    if (typeof name !== 'string' || name === '') return undefined;
    const info = this.strip(raw);
    if (info === undefined) return undefined;
    const namespace = typeof meta?.namespace === 'string' ? meta.namespace : '';
    const resourceVersion = typeof meta?.resourceVersion === 'string' ? meta.resourceVersion : undefined;
    // Joined, the key kept per object is one flat string; a template literal keeps a tree of pieces.
    return { key: [namespace, '/', name].join(''), info, resourceVersion };
  }

  /** Stores an object's info; false when it equals what is cached (nothing recorded). */
  put(key: string, info: T): boolean {
    const old = this.objects.get(key);
    if (old !== undefined && sameInfo(old, info)) return false;
    this.changes.record(old, info);
    this.objects.set(key, info);
    return true;
  }

  /** Removes an object; false when it was not cached. */
  remove(key: string): boolean {
    const gone = this.objects.get(key);
    if (gone === undefined) return false;
    this.changes.record(gone, undefined);
    this.objects.delete(key);
    return true;
  }

  /**
   * A new state of the cache, built aside from a whole state: `apply` each object of it as it
   * arrives (or remove it: `deleted`), then `swap`: the new state replaces the cache whole and
   * each difference is recorded (added, changed, deleted). Until then the cache is left as it
   * was, so a state that does not arrive whole changes nothing. An object equal to the cached
   * one keeps the cached info (its identity, and no second copy in memory).
   */
  rebuild(): Rebuild {
    let next = new Map<string, T>();
    return {
      apply: (raw, deleted) => {
        const decoded = this.decode(raw);
        if (!decoded) return false;
        if (deleted) {
          next.delete(decoded.key);
          return true;
        }
        const old = this.objects.get(decoded.key);
        next.set(decoded.key, old !== undefined && sameInfo(old, decoded.info) ? old : decoded.info);
        return true;
      },
      restart: () => {
        next = new Map<string, T>();
      },
      swap: () => {
        let changed = false;
        for (const [key, info] of next) {
          const old = this.objects.get(key);
          if (old === info) continue;
          this.changes.record(old, info);
          changed = true;
        }
        for (const [key, old] of this.objects) {
          if (next.has(key)) continue;
          this.changes.record(old, undefined);
          changed = true;
        }
        this.objects = next;
        next = new Map<string, T>();
        return changed;
      },
    };
  }
}
