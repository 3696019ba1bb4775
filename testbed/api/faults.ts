// The faults tests inject into the stand-in's read path: a list cut in the middle of its body, a
// WatchList stream ended before its initial state is complete, and a watch cache that lags
// behind etcd. Each is armed by a method of ApiStandIn (breakNextList, breakNextWatchList,
// lagWatchCache) and taken by the list or watch it hits.

import type { KubeObject } from './errors.js';
import { RESOURCES, type Resource } from './resources.js';
import type { ObjectStore } from './store.js';

/** The watch cache new requests reach, held at `rv`: its objects, and the watches parked on it. */
export interface LaggingCache {
  rv: number;
  objects: Map<Resource, KubeObject[]>;
  /** Resumes a watch opened meanwhile, once the cache has caught up. */
  parked: Array<() => void>;
}

export class Faults {
  /** The next WatchList stream ends after so many of its initial events: with an ERROR of this code, or cleanly ('end'). */
  private watchListBreak: { afterEvents: number; code: number | 'end' } | undefined;
  /** The next list response is cut (its connection reset) after so many of its items. */
  private listBreak: { afterItems: number } | undefined;
  private lagging: LaggingCache | undefined;

  constructor(private readonly store: ObjectStore) {}

  breakNextWatchList(afterEvents: number, code: number | 'end'): void {
    this.watchListBreak = { afterEvents, code };
  }

  breakNextList(afterItems: number): void {
    this.listBreak = { afterItems };
  }

  /** The cut armed for the next list, taken by it. */
  takeListBreak(): { afterItems: number } | undefined {
    const cut = this.listBreak;
    this.listBreak = undefined;
    return cut;
  }

  /** The end armed for the next WatchList stream, taken by it. */
  takeWatchListBreak(): { afterEvents: number; code: number | 'end' } | undefined {
    const cut = this.watchListBreak;
    this.watchListBreak = undefined;
    return cut;
  }

  /** The lagging watch cache, while lagWatchCache() holds it back. */
  get lag(): LaggingCache | undefined {
    return this.lagging;
  }

  /** The resourceVersion of the watch cache new requests reach. */
  get cacheVersion(): number {
    return this.lagging?.rv ?? this.store.resourceVersion;
  }

  lagWatchCache(): void {
    if (this.lagging) return;
    const objects = new Map(RESOURCES.map((r) => [r, this.store.list(r).map((o) => structuredClone(o))] as const));
    this.lagging = { rv: this.store.resourceVersion, objects, parked: [] };
  }

  catchUpWatchCache(): void {
    const lag = this.lagging;
    this.lagging = undefined;
    for (const resume of lag?.parked ?? []) resume();
  }
}
