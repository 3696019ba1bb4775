// An informer: a cache of one resource (store.ts) kept equal to the API server's by a list+watch
// loop, as client-go's reflector keeps it; one watch at a time (watch-session.ts), over our own
// streaming watch (watch.ts), so that the only copy of each object is the stripped one.
// - The cache is built from the API server's watch cache, never page by page from etcd, because
//   a fleet of agents starts (and relists) together: with `watchList`, by a WatchList stream (a
//   watch with sendInitialEvents=true: the whole state as ADDED events, then a bookmark marked
//   k8s.io/initial-events-end, then the watch goes on on the same stream), as client-go's
//   reflector does. A server that refuses the parameters (422 before 1.27, or with the WatchList
//   feature gate off) or ignores them (an unmarked bookmark before the marked one) is read by
//   lists from then on. A stream that ends before the marked bookmark says nothing about the
//   server (a restart, a proxy's timeout): that rebuild is made by a list, and the next rebuild
//   tries a WatchList stream again, as client-go's reflector decides afresh at each ListAndWatch.
//   A list asks for resourceVersion=0 at the first start only (the watch cache, whatever its
//   age: nothing newer is known yet, as client-go), for "not older than the last version seen"
//   afterwards, and for the newest state (resourceVersion unset, a consistent read) once the
//   server said it cannot serve that version (410 Gone, or "Too large resource version" from an
//   API server that is behind): never for resourceVersion=0 again, which a lagging watch cache
//   would answer with a state older than the one already seen. Lists from the watch cache are
//   whole; each object is stripped as it arrives (list-stream.ts: memory stays flat).
// - Either way the new state is built aside and replaces the cache whole, only once it has all
//   arrived (the cache counts as synced then): a list or stream that fails part-way leaves the
//   cache as it was, a state the server did have. The swap is recorded object by object (added,
//   changed, deleted) and readers are told once.
// - Watches resume from the last resourceVersion seen (events and bookmarks). 410 Gone (as an
//   HTTP status or an ERROR event) rebuilds; an object the new state holds unchanged keeps its
//   identity, so readers of the change feed see a rebuild as a few changes.
// - A stream that became unusable (too many lines that are not watch events, a dead connection)
//   is replaced, and so is a line too long to buffer (the same line again first thing on the
//   stream that replaced it is an event of the watch history, which every resumption would
//   replay: a relist reads past it). Nothing a stream says can throw out of this loop.
// - Failures retry forever with jittered exponential backoff. The cache keeps its content
//   meanwhile, so an unreachable API server never empties the desired state, and the retry
//   timer keeps the process alive.
// - The informer offers its cache's change log (`changes`, a ChangeFeed: src/model/change-feed.ts)
//   to the model, which reads what changed since its cursor and releases it, with no hop between.

import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import type { ChangeFeed } from '../model/change-feed.js';
import { ObjectStore } from './store.js';
import { WatchLineTooLongError } from './watch.js';
import { toError, watchSession, type WatchSessionContext } from './watch-session.js';

export interface InformerObserver {
  /** A full state was fetched (first sync or relist): by a list, or by a WatchList stream. */
  onList?(resource: string): void;
  /** The server does not offer WatchList streams: lists from now on. `why`: one line. */
  onWatchListUnavailable?(resource: string, why: string): void;
  /** A watch was (re)established: the API server accepted the request. */
  onWatch?(resource: string): void;
  /** The list or watch failed; the informer retries on its own. */
  onError?(resource: string, err: Error, retryInMs: number): void;
  /**
   * A watch line that is not a watch event was skipped. `firstOnStream` is true for the first
   * such line of a watch stream (log that one; count them all).
   */
  onDecodeError?(resource: string, problem: string, firstOnStream: boolean): void;
}

export interface InformerOptions<T> {
  /** e.g. 'services', 'nodes': used in logs and metrics. */
  resource: string;
  /** API path, e.g. /api/v1/services. */
  path: string;
  /**
   * Reads the whole list at `resourceVersion` ('0': any, from the server's cache; a version:
   * not older than it; '': the newest, a consistent read), handing each raw object to `onItem`
   * as it arrives. Returns the list's resourceVersion.
   */
  list?(resourceVersion: string, onItem: (raw: unknown) => void): Promise<string | undefined>;
  /** Instead of list: fetches one page of a consistent list as raw objects. */
  listPage?(
    continueToken: string | undefined,
  ): Promise<{ items: unknown[]; resourceVersion?: string; continue?: string }>;
  /** Build the cache with a WatchList stream where the server offers one (see above). Default false. */
  watchList?: boolean;
  /** The fields kept of a raw object (undefined: not kept); called on its own, not on these options. */
  strip(this: void, raw: unknown): T | undefined;
  fieldSelector?: string;
  /** The cache changed; called on its own, not on these options. */
  onChange(this: void): void;
  observer?: InformerObserver;
  /**
   * Lower bound of the server-side watch timeout; each watch asks for a random one in
   * [min, 2*min). Default 5 minutes, as client-go.
   */
  minWatchTimeoutMs?: number;
  /**
   * How long a watch may deliver nothing before it is taken for dead. Default: the timeout the
   * server was asked for, plus a margin (a tenth of it, at least 1 s and at most 30 s).
   */
  watchIdleTimeoutMs?: number;
  /** Jittered exponential backoff of retries: first delay and cap. Defaults 500 ms and 30 s. */
  backoff?: { initialMs: number; maxMs: number };
}

const DEFAULT_BACKOFF = { initialMs: 500, maxMs: 30_000 };
/** A watch that ends sooner than this without delivering anything counts as a failure. */
const SHORT_WATCH_MS = 1000;

/**
 * Retry delay after `failures` consecutive failures (1, 2, ...): exponential up to the cap, with
 * "equal jitter": uniformly in [d/2, d) where d is the exponential delay. Never 0, never in step.
 */
export function backoffDelay(
  failures: number,
  backoff: { initialMs: number; maxMs: number } = DEFAULT_BACKOFF,
  random: () => number = Math.random,
): number {
  const exponent = Math.min(Math.max(failures, 1) - 1, 30);
  const d = Math.min(backoff.maxMs, backoff.initialMs * 2 ** exponent);
  return Math.max(1, Math.floor(d / 2 + random() * (d / 2)));
}

/** A loop of an earlier generation (stopped, or restarted): it ends without touching the cache. */
class Stale extends Error {}

export class Informer<T> {
  private synced = false;
  private syncWaiters: Array<() => void> = [];
  private failures = 0;
  private stopped = true;
  /** Bumped by start() and stop(): a loop of an earlier generation leaves the cache alone. */
  private generation = 0;
  /** Ends what the loop waits for now (a retry delay, a watch), so that stop() is immediate. */
  private readonly interrupt: { now?: () => void } = {};
  private readonly store: ObjectStore<T>;
  /** The server refused or ignored a WatchList stream: lists build the cache. */
  private noWatchList = false;

  constructor(
    private readonly kubeConfig: KubeConfig,
    private readonly options: InformerOptions<T>,
  ) {
    this.store = new ObjectStore<T>(options.strip);
  }

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
    return this.store.list();
  }

  /** The feed of the cache's changes (its store's log): what the model reads. */
  get changes(): ChangeFeed<T> {
    return this.store.changes;
  }

  start(): void {
    this.stopped = false;
    const generation = ++this.generation;
    this.failures = 0;
    // A new cache: no consumer's cursor is valid any more.
    this.store.clear();
    void this.run(generation);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.generation++;
    this.interrupt.now?.();
  }

  private current(generation: number): boolean {
    return !this.stopped && generation === this.generation;
  }

  /** Calls an observer; its failure must not stop the informer. */
  private report(call: (observer: InformerObserver) => void): void {
    const { observer } = this.options;
    if (!observer) return;
    try {
      call(observer);
    } catch {
      // an observer's failure must not stop the informer
    }
  }

  /** What a watch session of the loop of `generation` reads and tells. */
  private session(generation: number): WatchSessionContext<T> {
    const { resource } = this.options;
    return {
      kubeConfig: this.kubeConfig,
      path: this.options.path,
      fieldSelector: this.options.fieldSelector,
      minWatchTimeoutMs: this.options.minWatchTimeoutMs,
      watchIdleTimeoutMs: this.options.watchIdleTimeoutMs,
      store: this.store,
      onChange: this.options.onChange,
      current: () => this.current(generation),
      interrupt: this.interrupt,
      opened: () => this.report((o) => o.onWatch?.(resource)),
      undecodable: (problem, first) => this.report((o) => o.onDecodeError?.(resource, problem, first)),
      initialStateArrived: () => {
        this.report((o) => o.onList?.(resource));
        this.markSynced();
      },
    };
  }

  /** The loop: never rejects, never ends before stop(). */
  private async run(generation: number): Promise<void> {
    /** Where the watch resumes; undefined: the cache must be built again (a WatchList or a list). */
    let resourceVersion: string | undefined;
    /**
     * The newest resourceVersion the cache is known to be at: a rebuild asks for a state not
     * older than it, which the server's cache serves. Undefined until the first state arrived
     * (a list asks for resourceVersion=0 then); '' once the server said it cannot serve it: the
     * newest state then (a consistent read), until a state arrives again.
     */
    let known: string | undefined;
    /** No watch has delivered anything since the cache was built. */
    let justListed = false;
    /** The resourceVersion a watch resumed from and ended at a line too long, delivering nothing. */
    let tooLongFrom: string | undefined;
    /** The WatchList stream of this rebuild ended early: this rebuild lists. */
    let listThisOnce = false;
    while (this.current(generation)) {
      try {
        const initial =
          resourceVersion === undefined && this.options.watchList === true && !this.noWatchList && !listThisOnce;
        if (resourceVersion === undefined && !initial) {
          resourceVersion = await this.relist(generation, known);
          if (resourceVersion !== '') known = resourceVersion;
          listThisOnce = false;
          justListed = true;
        }
        const started = Date.now();
        const from = initial ? (known ?? '') : resourceVersion!;
        const outcome = await watchSession(this.session(generation), from, initial);
        if (!this.current(generation)) break;
        const end = outcome.end;
        if (end.kind === 'noWatchList') {
          resourceVersion = undefined;
          if (end.thisOnce) {
            listThisOnce = true;
            throw Object.assign(new Error(`${end.why}: this rebuild lists, the next one tries a stream again`), {
              retryAtOnce: true,
            });
          }
          this.noWatchList = true;
          this.report((o) => o.onWatchListUnavailable?.(this.options.resource, end.why));
          continue;
        }
        if (initial && outcome.synced) {
          this.failures = 0;
          justListed = true;
        }
        resourceVersion = outcome.resourceVersion;
        if (resourceVersion !== undefined && resourceVersion !== '') known = resourceVersion;
        const tooLong = !initial && end.kind === 'failed' && end.err instanceof WatchLineTooLongError;
        const tooLongAgain = tooLong && !outcome.delivered && tooLongFrom === from;
        tooLongFrom = tooLong && !outcome.delivered ? from : undefined;
        if (tooLongAgain) {
          tooLongFrom = undefined;
          resourceVersion = undefined;
        }
        // A watch that delivered is a working connection: the backoff starts again from its first
        // delay. A list alone is not (a server that lists but cannot watch is retried ever slower).
        if (outcome.delivered) {
          justListed = false;
          this.failures = 0;
        }
        if (end.kind === 'expired') {
          resourceVersion = undefined;
          if (end.tooLarge || (initial && !outcome.synced)) {
            // The server cannot serve a state not older than `known`: ask for the newest (a
            // consistent read, never resourceVersion=0), at once, unless that is what it just
            // refused, or what it just served.
            if (from === '') {
              throw Object.assign(new Error('the server cannot serve the newest state'), { statusCode: 410 });
            }
            known = '';
            if (!justListed) continue;
            throw Object.assign(new Error('the server cannot serve the version of the state it just served'), {
              statusCode: 504,
            });
          }
          // Rebuild at once, unless the server says so again right after a rebuild.
          if (!justListed) continue;
          throw Object.assign(new Error('the watch expired right after a list'), { statusCode: 410 });
        }
        if (end.kind === 'failed') {
          if (end.relist) resourceVersion = undefined;
          throw end.err;
        }
        if (!outcome.delivered && !(initial && outcome.synced) && Date.now() - started < SHORT_WATCH_MS) {
          throw new Error('the watch was closed at once, with no event');
        }
        this.failures = 0;
      } catch (err) {
        if (!this.current(generation) || err instanceof Stale) break;
        const atOnce = (err as { retryAtOnce?: unknown } | undefined)?.retryAtOnce === true;
        if (!atOnce) this.failures++;
        const delay = atOnce ? 0 : backoffDelay(this.failures, this.options.backoff);
        this.report((o) => o.onError?.(this.options.resource, toError(err), delay));
        if (delay > 0) await this.pause(delay);
      }
    }
  }

  /** Waits `ms`, or less when stopped. The timer holds the process up: retries never end. */
  private pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        if (this.interrupt.now === done) this.interrupt.now = undefined;
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.interrupt.now = done;
    });
  }

  /**
   * Lists the whole state and makes the cache equal to it; returns its resourceVersion. Asks
   * for a state not older than `known`: resourceVersion=0 when nothing is known yet, the newest
   * (a consistent read) when `known` is ''; when the server cannot serve `known` (410 Gone, or a
   * version it has not seen yet), for the newest.
   */
  private async relist(generation: number, known: string | undefined): Promise<string> {
    const rebuild = this.store.rebuild();
    const apply = (raw: unknown) => {
      if (!this.current(generation)) throw new Stale();
      rebuild.apply(raw, false);
    };
    let resourceVersion: string | undefined;
    if (this.options.list) {
      const list = (rv: string, onItem: (raw: unknown) => void) => this.options.list!(rv, onItem);
      const from = known ?? '0';
      try {
        resourceVersion = await list(from, apply);
      } catch (err) {
        if (from === '0' || from === '' || !unavailableVersion(err) || !this.current(generation)) throw err;
        rebuild.restart();
        resourceVersion = await list('', apply);
      }
    } else {
      let token: string | undefined;
      do {
        const page = await this.options.listPage!(token);
        if (!this.current(generation)) throw new Stale();
        for (const raw of page.items) apply(raw);
        resourceVersion = page.resourceVersion;
        token = page.continue || undefined;
      } while (token);
    }
    if (!this.current(generation)) throw new Stale();
    if (rebuild.swap()) this.options.onChange();
    this.options.observer?.onList?.(this.options.resource);
    this.markSynced();
    // Without a resourceVersion, a watch from "" starts with the whole state (equal: no change).
    return resourceVersion ?? '';
  }

  private markSynced(): void {
    if (this.synced) return;
    this.synced = true;
    for (const resolve of this.syncWaiters.splice(0)) resolve();
  }
}

/** A list or watch error that says the server cannot serve the resourceVersion asked for. */
function unavailableVersion(err: unknown): boolean {
  const status = (err as { statusCode?: unknown } | undefined)?.statusCode;
  return status === 410 || (status === 504 && /too large resource version/i.test(toError(err).message));
}
