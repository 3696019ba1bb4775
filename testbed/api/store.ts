// The store: objects by resource, one global resourceVersion as etcd keeps it, and the change
// history that watches replay (410 Gone once it no longer reaches back far enough).

import type { KubeObject } from './errors.js';
import { RESOURCES, objectKey, withTypeMeta, type Resource } from './resources.js';
import { inScope, type Selection } from './selectors.js';

export type ChangeType = 'ADDED' | 'MODIFIED' | 'DELETED';

export interface Change {
  rv: number;
  resource: Resource;
  type: ChangeType;
  object: KubeObject;
  /** The object before a MODIFIED change, so filtered watches see objects enter and leave. */
  previous?: KubeObject;
}

/** A watch as the store delivers to it: what it sees, and where its events go. */
export interface Watcher {
  resource: Resource;
  namespace: string | undefined;
  selection: Selection;
  send(type: ChangeType, object: KubeObject): void;
}

/** What a watch sees of a change through its namespace and selectors; undefined when nothing. */
export function visibleChange(change: Change, watcher: Watcher): ChangeType | undefined {
  if (change.resource !== watcher.resource) return undefined;
  const seen = (o: KubeObject | undefined) => o !== undefined && inScope(watcher.namespace, watcher.selection, o);
  const now = change.type !== 'DELETED' && seen(change.object);
  const before = change.type === 'DELETED' ? seen(change.object) : seen(change.previous);
  if (now && before) return 'MODIFIED';
  if (now) return 'ADDED';
  if (before) return 'DELETED';
  return undefined;
}

export class ObjectStore {
  private rv = 0;
  /** Watches from a resourceVersion below this one cannot be replayed: 410 Gone. */
  private oldestResumableRv = 0;
  private history: Change[] = [];
  private readonly objects = new Map(RESOURCES.map((r) => [r, new Map<string, KubeObject>()] as const));
  private readonly watchers = new Set<Watcher>();

  constructor(private readonly historyLimit: number) {}

  get resourceVersion(): number {
    return this.rv;
  }

  get(resource: Resource, namespace: string | undefined, name: string): KubeObject | undefined {
    return this.objects.get(resource)!.get(objectKey(resource.namespaced ? namespace : undefined, name));
  }

  /** Objects sorted by namespace/name, as etcd returns them. */
  list(resource: Resource): KubeObject[] {
    return [...this.objects.get(resource)!.entries()]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([, o]) => o);
  }

  /** Stores obj (metadata complete but resourceVersion) as new or replacing the current one. */
  put(resource: Resource, obj: KubeObject): KubeObject {
    const key = objectKey(obj.metadata.namespace, obj.metadata.name);
    const previous = this.objects.get(resource)!.get(key);
    const stored = structuredClone(obj);
    stored.metadata.resourceVersion = String(++this.rv);
    this.objects.get(resource)!.set(key, stored);
    this.record({ rv: this.rv, resource, type: previous ? 'MODIFIED' : 'ADDED', object: stored, previous });
    return stored;
  }

  delete(resource: Resource, namespace: string | undefined, name: string): KubeObject | undefined {
    const key = objectKey(resource.namespaced ? namespace : undefined, name);
    const current = this.objects.get(resource)!.get(key);
    if (!current) return undefined;
    this.objects.get(resource)!.delete(key);
    // The DELETED event carries the object at the resourceVersion of its deletion.
    const last = structuredClone(current);
    last.metadata.resourceVersion = String(++this.rv);
    this.record({ rv: this.rv, resource, type: 'DELETED', object: last });
    return last;
  }

  /** Changes of resource after rv, or undefined when history no longer reaches back that far. */
  changesSince(resource: Resource, rv: number): Change[] | undefined {
    if (rv < this.oldestResumableRv) return undefined;
    return this.history.filter((c) => c.rv > rv && c.resource === resource);
  }

  get oldestResumable(): number {
    return this.oldestResumableRv;
  }

  /**
   * Forgets all history, as after an etcd compaction. The resourceVersion moves on by one,
   * as it would through writes to other resources, so every version a client has seen so far
   * is now too old to resume from.
   */
  expireHistory(): void {
    this.rv++;
    this.history = [];
    this.oldestResumableRv = this.rv;
  }

  subscribe(watcher: Watcher): () => void {
    this.watchers.add(watcher);
    return () => this.watchers.delete(watcher);
  }

  private record(change: Change): void {
    this.history.push(change);
    while (this.history.length > this.historyLimit) {
      this.oldestResumableRv = this.history.shift()!.rv;
    }
    for (const watcher of this.watchers) {
      const type = visibleChange(change, watcher);
      if (type) watcher.send(type, withTypeMeta(change.resource, change.object));
    }
  }
}
