// An informer's cache: the stripped info of each object by namespace/name, and the log of its
// changes, offered to the model as a ChangeFeed (src/model/change-feed.ts).
// - Only the stripped form is kept: `strip` makes it as each object arrives.
// - An update whose stripped form equals the cached one changes nothing and records nothing (a
//   Node's heartbeat status updates never cause a sync).
// - A whole new state (a list, or a WatchList stream's initial state) is built aside and replaces
//   the cache at once (rebuild): an object it holds unchanged keeps its identity, so a consumer of
//   the feed sees a rebuild as the few changes it made.

import type { ChangeFeed, Changes } from '../model/change-feed.js';

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

// A cache's changes, offered as its ChangeFeed (src/model/change-feed.ts): each change
// is an object gone and/or an object come, at a position (the cursor) that only grows. Reading
// it changes nothing; what is before a cursor is dropped when the consumer releases it, and the
// whole log when it grows past its bound (a consumer that does not come back, or falls that far
// behind, rebuilds from the cache's list).

/** Changes kept for a consumer that does not come (the log is short when the controller syncs). */
export const MAX_CHANGE_LOG = 10_000;

export class ChangeLog<T> implements ChangeFeed<T> {
  /** Changes since position `start`, in order. */
  private entries: Array<{ removed?: T; added?: T }> = [];
  private start = 0;

  /** `list`: every object of the cache now (the store's). */
  constructor(
    readonly list: () => T[],
    private readonly max = MAX_CHANGE_LOG,
  ) {}

  /** The position after the last change. */
  get cursor(): number {
    return this.start + this.entries.length;
  }

  record(removed: T | undefined, added: T | undefined): void {
    if (this.entries.length >= this.max) {
      // Nobody read this far: the consumer behind it lists the cache instead.
      this.start += this.entries.length;
      this.entries = [];
    }
    this.entries.push({ removed, added });
  }

  /** What changed since `cursor`, folded (an object added then removed is neither); undefined when unknown. */
  changesSince(cursor: number): Changes<T> | undefined {
    if (cursor < this.start || cursor > this.cursor) return undefined;
    const removed = new Set<T>();
    const added = new Set<T>();
    for (let i = cursor - this.start; i < this.entries.length; i++) {
      const change = this.entries[i]!;
      if (change.removed !== undefined && !added.delete(change.removed)) removed.add(change.removed);
      if (change.added !== undefined) added.add(change.added);
    }
    return { removed: [...removed], added: [...added] };
  }

  /** Drops what is before `cursor` (a cursor outside the log drops nothing). */
  release(cursor: number): void {
    if (cursor <= this.start || cursor > this.cursor) return;
    this.entries = this.entries.slice(cursor - this.start);
    this.start = cursor;
  }

  /** A new history (the cache is built anew): no cursor given before is valid any more. */
  restart(): void {
    this.start += this.entries.length + 1;
    this.entries = [];
  }
}
