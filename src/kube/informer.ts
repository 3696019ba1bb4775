// List+watch caches built on client-node's ListWatch, holding stripped objects only.
// - The list is paginated and each page stripped before it is kept (memory stays flat).
// - Watch events are stripped before ListWatch caches them; bookmarks are requested.
// - ListWatch relists by itself on 410 Gone; on any other error it stops: we restart it with
//   backoff, resuming from the last resourceVersion. The cache keeps its content meanwhile,
//   so an unreachable API server never empties the desired state.

import { KubeConfig, ListWatch, Watch } from '@kubernetes/client-node';
import type { ChangeTracked } from '../model/types.js';

export interface Stripped<T> {
  metadata: { name: string; namespace?: string; resourceVersion?: string };
  info: T;
}

export interface InformerObserver {
  /** A full list was fetched (first sync or relist). */
  onList?(resource: string): void;
  /** A watch was (re)established: the API server accepted the request. */
  onWatch?(resource: string): void;
  /** The list or watch failed; the informer retries on its own. */
  onError?(resource: string, err: Error, retryInMs: number): void;
}

export interface InformerOptions<T> {
  /** e.g. 'services', 'nodes': used in logs and metrics. */
  resource: string;
  /** API path, e.g. /api/v1/services. */
  path: string;
  /** Fetches one page of the list as raw objects. */
  listPage(
    continueToken: string | undefined,
  ): Promise<{ items: unknown[]; resourceVersion?: string; continue?: string }>;
  strip(raw: unknown): T | undefined;
  fieldSelector?: string;
  onChange(): void;
  observer?: InformerObserver;
  /** Server-side watch timeout, so a silently dead connection is replaced. */
  watchTimeoutSeconds?: number;
  pageSize?: number;
}

const MAX_BACKOFF_MS = 30_000;
/** Changes kept for a reader that does not come (the log is short when the controller syncs). */
const MAX_CHANGE_LOG = 10_000;

export class Informer<T> implements ChangeTracked<T> {
  private listWatch: ListWatch<Stripped<T>> | undefined;
  private synced = false;
  private syncWaiters: Array<() => void> = [];
  private retryTimer: NodeJS.Timeout | undefined;
  private failures = 0;
  private stopped = false;
  /** The info of ListWatch's objects by namespace/name, kept by its events: cheaper to list. */
  private readonly objects = new Map<string, T>();
  /** Changes since mark `logStart`, in order, for changesSince(). */
  private changeLog: Array<{ removed?: T; added?: T }> = [];
  private logStart = 0;

  constructor(
    private readonly kubeConfig: KubeConfig,
    private readonly options: InformerOptions<T>,
  ) {}

  get resource(): string {
    return this.options.resource;
  }

  hasSynced(): boolean {
    return this.synced;
  }

  waitForSync(): Promise<void> {
    if (this.synced) return Promise.resolve();
    return new Promise((resolve) => this.syncWaiters.push(resolve));
  }

  /** The cached objects; a changed object keeps its place, so a sync can compare by identity. */
  list(): T[] {
    return Array.from(this.objects.values());
  }

  get mark(): number {
    return this.logStart + this.changeLog.length;
  }

  /**
   * What changed since `mark` (see ChangeTracked). For one reader: the log before the mark it
   * asks with is dropped, and a log that nobody reads is dropped when it grows long.
   */
  changesSince(mark: number): { removed: T[]; added: T[] } | undefined {
    if (mark < this.logStart || mark > this.mark) return undefined;
    this.changeLog = this.changeLog.slice(mark - this.logStart);
    this.logStart = mark;
    const removed = new Set<T>();
    const added = new Set<T>();
    for (const change of this.changeLog) {
      if (change.removed !== undefined && !added.delete(change.removed)) removed.add(change.removed);
      if (change.added !== undefined) added.add(change.added);
    }
    return { removed: [...removed], added: [...added] };
  }

  private record(removed: T | undefined, added: T | undefined): void {
    if (this.changeLog.length >= MAX_CHANGE_LOG) {
      this.logStart += this.changeLog.length;
      this.changeLog = [];
    }
    this.changeLog.push({ removed, added });
  }

  start(): void {
    this.stopped = false;
    const watch = this.strippingWatch();
    this.listWatch = new ListWatch<Stripped<T>>(
      this.options.path,
      watch as unknown as Watch,
      () => this.listAllPages() as never,
      false,
      undefined,
      this.options.fieldSelector,
    );
    this.objects.clear();
    // A new cache: no reader's mark is valid any more.
    this.logStart += this.changeLog.length + 1;
    this.changeLog = [];
    const keyOf = (o: Stripped<T>) => [o.metadata.namespace ?? '', o.metadata.name].join('/');
    for (const verb of ['add', 'update'] as const) {
      this.listWatch.on(verb, (o: Stripped<T>) => {
        const key = keyOf(o);
        this.record(this.objects.get(key), o.info);
        this.objects.set(key, o.info);
        this.options.onChange();
      });
    }
    this.listWatch.on('delete', (o: Stripped<T>) => {
      const key = keyOf(o);
      const gone = this.objects.get(key);
      if (gone !== undefined) this.record(gone, undefined);
      this.objects.delete(key);
      this.options.onChange();
    });
    this.listWatch.on('error', (err: unknown) => this.retry(err));
    void this.listWatch.start();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    await this.listWatch?.stop();
  }

  private retry(err: unknown): void {
    if (this.stopped) return;
    this.failures++;
    const delay = Math.min(MAX_BACKOFF_MS, 500 * 2 ** Math.min(this.failures - 1, 6));
    this.options.observer?.onError?.(this.options.resource, toError(err), delay);
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => {
      if (!this.stopped) void this.listWatch?.start();
    }, delay);
    this.retryTimer.unref?.();
  }

  private async listAllPages(): Promise<{ items: Array<Stripped<T>>; metadata: { resourceVersion?: string } }> {
    const items: Array<Stripped<T>> = [];
    let token: string | undefined;
    let resourceVersion: string | undefined;
    do {
      const page = await this.options.listPage(token);
      for (const raw of page.items) {
        const s = this.stripObject(raw);
        if (s) items.push(s);
      }
      resourceVersion = page.resourceVersion;
      token = page.continue || undefined;
    } while (token);
    this.options.observer?.onList?.(this.options.resource);
    return { items, metadata: { resourceVersion } };
  }

  private stripObject(raw: unknown): Stripped<T> | undefined {
    const meta = (raw as { metadata?: Record<string, unknown> } | undefined)?.metadata;
    const name = meta?.name;
    if (typeof name !== 'string') return undefined;
    const info = this.options.strip(raw);
    if (info === undefined) return undefined;
    const namespace = typeof meta?.namespace === 'string' ? meta.namespace : undefined;
    const resourceVersion = typeof meta?.resourceVersion === 'string' ? meta.resourceVersion : undefined;
    return { metadata: { name, namespace, resourceVersion }, info };
  }

  /** A Watch look-alike for ListWatch: strips objects, asks for bookmarks, marks the cache synced. */
  private strippingWatch() {
    const inner = new Watch(this.kubeConfig);
    return {
      watch: (
        path: string,
        query: Record<string, unknown>,
        callback: (phase: string, obj: unknown, watchObj?: unknown) => void,
        done: (err: unknown) => void,
      ) => {
        // ListWatch calls watch() right after it stored a successful list: the cache is complete.
        this.markSynced();
        const params = {
          ...query,
          allowWatchBookmarks: true,
          timeoutSeconds: this.options.watchTimeoutSeconds ?? 300 + Math.floor(Math.random() * 300),
        };
        let failed = false;
        const request = inner.watch(
          path,
          params,
          (phase, obj, watchObj) => {
            if (phase === 'ADDED' || phase === 'MODIFIED' || phase === 'DELETED') {
              const stripped = this.stripObject(obj);
              if (stripped) callback(phase, stripped, watchObj);
              return;
            }
            callback(phase, obj, watchObj);
          },
          (err) => {
            if (err) failed = true;
            else this.failures = 0;
            done(err);
          },
        );
        // Reported only once the server answered, so that an observer can tell a connected watch
        // from a retry that is about to fail (the request fails before it resolves).
        return request.then((controller) => {
          if (!failed) this.options.observer?.onWatch?.(this.options.resource);
          return controller;
        });
      },
    };
  }

  private markSynced(): void {
    if (this.synced) return;
    this.synced = true;
    this.failures = 0;
    for (const resolve of this.syncWaiters.splice(0)) resolve();
  }
}

function toError(err: unknown): Error {
  if (err instanceof Error) return err;
  const status = err as { code?: number; message?: string; reason?: string } | undefined;
  return new Error(status?.message ?? status?.reason ?? String(err));
}
