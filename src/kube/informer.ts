// List+watch caches holding stripped objects only: our own loop over our own streaming watch
// (watch.ts), so that the only copy of each object is the stripped one in `objects`.
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
// - Watches resume from the last resourceVersion seen (events and bookmarks), ask for bookmarks
//   and for a server-side timeout randomised in [min, 2*min) as client-go does, so that a fleet
//   does not re-watch in step. A watch that delivers nothing (no event, no bookmark) for a while
//   past that timeout is a dead connection (a half-open one through a NAT or load balancer): it
//   is aborted and replaced.
// - 410 Gone (as an HTTP status or an ERROR event) rebuilds; an object the new state holds
//   unchanged keeps its identity, so readers of changesSince() see a rebuild as a few changes.
// - A line that is not a watch event (not JSON, or JSON of the wrong shape) is skipped and
//   counted; many in a row make the stream unusable and it is replaced, and so does a line too
//   long to buffer (the same line again first thing on the stream that replaced it is an event
//   of the watch history, which every resumption would replay: a relist reads past it). Nothing
//   a stream says can throw out of this loop.
// - Failures retry forever with jittered exponential backoff. The cache keeps its content
//   meanwhile, so an unreachable API server never empties the desired state, and the retry
//   timer keeps the process alive.
// - An update whose stripped form equals the cached one is dropped: no change is recorded and
//   onChange is not called (a Node's heartbeat status updates never cause a sync).

import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import type { ChangeTracked } from '../model/types.js';
import { startWatch, WatchLineTooLongError, type WatchStreamError } from './watch.js';

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
  strip(raw: unknown): T | undefined;
  fieldSelector?: string;
  onChange(): void;
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

const DEFAULT_MIN_WATCH_TIMEOUT_MS = 5 * 60_000;
const DEFAULT_BACKOFF = { initialMs: 500, maxMs: 30_000 };
/** Changes kept for a reader that does not come (the log is short when the controller syncs). */
const MAX_CHANGE_LOG = 10_000;
/** Undecodable lines in a row after which a stream is given up and replaced. */
const MAX_DECODE_ERRORS_IN_A_ROW = 100;
/** A watch that ends sooner than this without delivering anything counts as a failure. */
const SHORT_WATCH_MS = 1000;
/** The annotation of the bookmark that ends a WatchList stream's initial state. */
export const INITIAL_EVENTS_END_ANNOTATION = 'k8s.io/initial-events-end';

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

/** The server-side timeout of one watch, in seconds: uniformly in [min, 2*min), as client-go. */
export function watchTimeoutSeconds(minMs: number, random: () => number = Math.random): number {
  const minS = Math.max(1, Math.round(minMs / 1000));
  return minS + Math.floor(random() * minS);
}

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

type WatchEnd =
  /** The server ended the stream (its timeout): re-watch at once. */
  | { kind: 'closed' }
  /**
   * 410 Gone: the resourceVersion is too old; relist. `tooLarge`: the server has not seen it yet
   * (another API server behind the same address): a rebuild must ask for the newest state.
   */
  | { kind: 'expired'; tooLarge?: boolean }
  /**
   * A WatchList stream the server refused or ignored: build the cache with lists instead.
   * `thisOnce`: the stream ended before its initial state did, which says nothing about the
   * server: this rebuild lists, the next one tries a stream again.
   */
  | { kind: 'noWatchList'; why: string; thisOnce?: boolean }
  /** Anything else: retry with backoff, from the last resourceVersion (or a new list). */
  | { kind: 'failed'; err: Error; relist?: boolean };

class Stale extends Error {}

function plainObject(v: unknown): Record<string, unknown> | undefined {
  return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
}

export class Informer<T> implements ChangeTracked<T> {
  private synced = false;
  private syncWaiters: Array<() => void> = [];
  private failures = 0;
  private stopped = true;
  /** Bumped by start() and stop(): a loop of an earlier generation leaves the cache alone. */
  private generation = 0;
  /** Ends what the loop waits for now (a retry delay, a watch), so that stop() is immediate. */
  private interrupt: (() => void) | undefined;
  /** The info of each object by namespace/name; replaced whole by a rebuild. */
  private objects = new Map<string, T>();
  /** Changes since mark `logStart`, in order, for changesSince(). */
  private changeLog: Array<{ removed?: T; added?: T }> = [];
  private logStart = 0;
  /** The server refused or ignored a WatchList stream: lists build the cache. */
  private noWatchList = false;

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

  start(): void {
    this.stopped = false;
    const generation = ++this.generation;
    this.failures = 0;
    this.objects.clear();
    // A new cache: no reader's mark is valid any more.
    this.logStart += this.changeLog.length + 1;
    this.changeLog = [];
    void this.run(generation);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.generation++;
    this.interrupt?.();
  }

  private current(generation: number): boolean {
    return !this.stopped && generation === this.generation;
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
        const outcome = await this.watchOnce(generation, from, initial);
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
          try {
            this.options.observer?.onWatchListUnavailable?.(this.options.resource, end.why);
          } catch {
            // an observer's failure must not stop the informer
          }
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
        try {
          this.options.observer?.onError?.(this.options.resource, toError(err), delay);
        } catch {
          // an observer's failure must not stop the informer
        }
        if (delay > 0) await this.pause(delay);
      }
    }
  }

  /** Waits `ms`, or less when stopped. The timer holds the process up: retries never end. */
  private pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        if (this.interrupt === done) this.interrupt = undefined;
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.interrupt = done;
    });
  }

  /**
   * Lists the whole state and makes the cache equal to it; returns its resourceVersion. Asks
   * for a state not older than `known`: resourceVersion=0 when nothing is known yet, the newest
   * (a consistent read) when `known` is ''; when the server cannot serve `known` (410 Gone, or a
   * version it has not seen yet), for the newest.
   */
  private async relist(generation: number, known: string | undefined): Promise<string> {
    const rebuild = this.rebuild(generation);
    let resourceVersion: string | undefined;
    if (this.options.list) {
      const list = (rv: string, onItem: (raw: unknown) => void) => this.options.list!(rv, onItem);
      const from = known ?? '0';
      try {
        resourceVersion = await list(from, (raw) => void rebuild.apply(raw, false));
      } catch (err) {
        if (from === '0' || from === '' || !unavailableVersion(err) || !this.current(generation)) throw err;
        rebuild.restart();
        resourceVersion = await list('', (raw) => void rebuild.apply(raw, false));
      }
    } else {
      let token: string | undefined;
      do {
        const page = await this.options.listPage!(token);
        if (!this.current(generation)) throw new Stale();
        for (const raw of page.items) rebuild.apply(raw, false);
        resourceVersion = page.resourceVersion;
        token = page.continue || undefined;
      } while (token);
    }
    if (!this.current(generation)) throw new Stale();
    rebuild.swap();
    this.options.observer?.onList?.(this.options.resource);
    this.markSynced();
    // Without a resourceVersion, a watch from "" starts with the whole state (equal: no change).
    return resourceVersion ?? '';
  }

  /**
   * A new state of the cache, built aside from a whole state: `apply` each object of it as it
   * arrives (or remove it: `deleted`), then `swap`: the new state replaces the cache whole, each
   * difference is recorded (added, changed, deleted) and readers are told once. Until then the
   * cache is left as it was, so a state that does not arrive whole changes nothing. An object
   * equal to the cached one keeps the cached info (its identity, and no second copy in memory).
   */
  private rebuild(generation: number): {
    apply: (raw: unknown, deleted: boolean) => boolean;
    restart: () => void;
    swap: () => void;
  } {
    let next = new Map<string, T>();
    return {
      apply: (raw, deleted) => {
        if (!this.current(generation)) throw new Stale();
        const decoded = this.decodeObject(raw);
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
          this.record(old, info);
          changed = true;
        }
        for (const [key, old] of this.objects) {
          if (next.has(key)) continue;
          this.record(old, undefined);
          changed = true;
        }
        this.objects = next;
        next = new Map<string, T>();
        if (changed && this.current(generation)) this.options.onChange();
      },
    };
  }

  /** Stores an object's info; false when it equals what is cached (nothing recorded). */
  private put(key: string, info: T): boolean {
    const old = this.objects.get(key);
    if (old !== undefined && sameInfo(old, info)) return false;
    this.record(old, info);
    this.objects.set(key, info);
    return true;
  }

  private remove(key: string): boolean {
    const gone = this.objects.get(key);
    if (gone === undefined) return false;
    this.record(gone, undefined);
    this.objects.delete(key);
    return true;
  }

  private record(removed: T | undefined, added: T | undefined): void {
    if (this.changeLog.length >= MAX_CHANGE_LOG) {
      this.logStart += this.changeLog.length;
      this.changeLog = [];
    }
    this.changeLog.push({ removed, added });
  }

  /** namespace/name, the stripped info and the resourceVersion of an object; undefined if unusable. */
  private decodeObject(raw: unknown): { key: string; info: T; resourceVersion?: string } | undefined {
    const meta = plainObject(plainObject(raw)?.metadata);
    const name = meta?.name;
    if (typeof name !== 'string' || name === '') return undefined;
    const info = this.options.strip(raw);
    if (info === undefined) return undefined;
    const namespace = typeof meta?.namespace === 'string' ? meta.namespace : '';
    const resourceVersion = typeof meta?.resourceVersion === 'string' ? meta.resourceVersion : undefined;
    // Joined, the key kept per object is one flat string; a template literal keeps a tree of pieces.
    return { key: [namespace, '/', name].join(''), info, resourceVersion };
  }

  /**
   * One watch from `from`, until it ends; what it delivered is applied as it comes. `initial`:
   * a WatchList stream, which first delivers the whole state (not older than `from`; the newest
   * when ''), ended by a marked bookmark; the cache is built from that state (as by relist) and
   * the stream goes on as a watch. `resourceVersion`: where a watch may resume, undefined when an
   * initial stream ended before its state was whole. `delivered`: events or bookmarks after the
   * initial state. `synced`: the initial state arrived whole.
   */
  private watchOnce(
    generation: number,
    from: string,
    initial: boolean,
  ): Promise<{ end: WatchEnd; resourceVersion: string | undefined; delivered: boolean; synced: boolean }> {
    const { resource } = this.options;
    const timeoutSeconds = watchTimeoutSeconds(this.options.minWatchTimeoutMs ?? DEFAULT_MIN_WATCH_TIMEOUT_MS);
    const idleMs =
      this.options.watchIdleTimeoutMs ?? timeoutSeconds * 1000 + Math.min(30_000, Math.max(1000, timeoutSeconds * 100));
    let resourceVersion: string | undefined = initial ? undefined : from;
    /** The initial state being built (initial streams, until their marked bookmark). */
    let rebuild = initial ? this.rebuild(generation) : undefined;
    let delivered = false;
    let synced = false;
    let decodeErrors = 0;
    let decodeErrorsInARow = 0;
    let finished = false;
    let abort: (() => void) | undefined;
    let idleTimer: NodeJS.Timeout | undefined;

    return new Promise((resolve) => {
      const finish = (end: WatchEnd) => {
        if (finished) return;
        finished = true;
        clearTimeout(idleTimer);
        if (this.interrupt === interrupted) this.interrupt = undefined;
        abort?.();
        resolve({ end, resourceVersion, delivered, synced });
      };
      const interrupted = () => finish({ kind: 'closed' });
      this.interrupt = interrupted;
      // One timer for the whole watch: a line only notes when it came, and the timer, when it
      // fires, waits on for what is left since the last line (a timer per line costs more than
      // the line's own decoding at the start's thousands of lines).
      let lastLineAt = performance.now();
      const checkIdle = () => {
        // An event can end the watch (an ERROR, say): no deadline may outlive it.
        if (finished) return;
        const quietMs = performance.now() - lastLineAt;
        if (quietMs < idleMs) {
          idleTimer = setTimeout(checkIdle, Math.max(1, Math.ceil(idleMs - quietMs)));
          return;
        }
        finish({
          kind: 'failed',
          err: new Error(`the watch delivered nothing for ${Math.round(idleMs / 1000)} s: taken for dead`),
        });
      };
      const armIdle = () => {
        lastLineAt = performance.now();
        if (idleTimer === undefined && !finished) idleTimer = setTimeout(checkIdle, idleMs);
      };
      const decodeError = (problem: string) => {
        decodeErrors++;
        decodeErrorsInARow++;
        try {
          this.options.observer?.onDecodeError?.(resource, problem, decodeErrors === 1);
        } catch {
          // an observer's failure must not stop the informer
        }
        if (decodeErrorsInARow >= MAX_DECODE_ERRORS_IN_A_ROW) {
          finish({
            kind: 'failed',
            err: new Error(`${decodeErrorsInARow} watch lines in a row were not watch events: the stream is unusable`),
          });
        }
      };
      /** The marked bookmark: the state is whole at `rv`. */
      const initialStateEnds = (rv: string) => {
        const built = rebuild!;
        rebuild = undefined;
        built.swap();
        synced = true;
        resourceVersion = rv;
        try {
          this.options.observer?.onList?.(resource);
        } catch {
          // an observer's failure must not stop the informer
        }
        this.markSynced();
      };
      // Made once per watch, not per line.
      const setResourceVersion = (rv: string) => {
        if (!rebuild) resourceVersion = rv;
      };
      const initialState = {
        apply: (raw: unknown, deleted: boolean) => rebuild!.apply(raw, deleted),
        end: initialStateEnds,
        ignored: (why: string) => finish({ kind: 'noWatchList', why }),
      };
      const onLine = (line: unknown) => {
        if (finished || !this.current(generation)) return;
        try {
          const inInitialState = rebuild !== undefined;
          const problem = this.handleEvent(line, setResourceVersion, finish, rebuild && initialState);
          if (problem !== undefined) {
            decodeError(problem);
            return;
          }
          decodeErrorsInARow = 0;
          // An ERROR event ends the watch: it delivered nothing to resume from.
          if (!inInitialState && !finished) delivered = true;
          armIdle();
        } catch (err) {
          // onChange or strip threw: the event may be half applied; relist to be sure.
          finish({ kind: 'failed', err: toError(err), relist: true });
        }
      };
      const onDone = (err: WatchStreamError | undefined) => {
        if (finished) return;
        if (!err) {
          // Ended before the marked bookmark: a server restarting, a proxy's timeout. Nothing
          // of the state it streamed is kept; this rebuild lists.
          if (rebuild) {
            return finish({
              kind: 'noWatchList',
              why: 'the WatchList stream ended before the end of its initial state',
              thisOnce: true,
            });
          }
          return finish({ kind: 'closed' });
        }
        const status = err.statusCode;
        if (status === 410) return finish({ kind: 'expired' });
        if (status === 504 && /too large resource version/i.test(err.message)) {
          return finish({ kind: 'expired', tooLarge: true });
        }
        // Refused: the parameters are invalid to this server (before 1.27, or WatchList off).
        if (initial && (status === 400 || status === 422)) {
          return finish({ kind: 'noWatchList', why: err.message });
        }
        finish({ kind: 'failed', err: toError(err) });
      };

      armIdle();
      const query: Record<string, string | number | boolean> = {
        allowWatchBookmarks: true,
        timeoutSeconds,
      };
      if (from !== '') query.resourceVersion = from;
      if (initial) {
        query.sendInitialEvents = true;
        query.resourceVersionMatch = 'NotOlderThan';
      }
      if (this.options.fieldSelector) query.fieldSelector = this.options.fieldSelector;
      abort = startWatch(this.kubeConfig, this.options.path, query, {
        // Reported only once the server answered, so that an observer can tell a connected
        // watch from a retry that is about to fail.
        onOpen: () => {
          if (finished) return;
          try {
            this.options.observer?.onWatch?.(resource);
          } catch {
            // an observer's failure must not stop the informer
          }
        },
        onValue: onLine,
        onUndecodable: (problem) => {
          if (!finished && this.current(generation)) decodeError(problem);
        },
        onEnd: onDone,
      });
    });
  }

  /**
   * Applies one decoded watch line. Returns what is wrong with it when it is not a watch event
   * (nothing is applied then). `initialState`: the line belongs to a WatchList stream's initial
   * state (objects go to the state being built; a bookmark ends it, or, unmarked, says the
   * server ignored the request for it).
   */
  private handleEvent(
    line: unknown,
    setResourceVersion: (rv: string) => void,
    finish: (end: WatchEnd) => void,
    initialState?: {
      apply(raw: unknown, deleted: boolean): boolean;
      end(rv: string): void;
      ignored(why: string): void;
    },
  ): string | undefined {
    const event = plainObject(line);
    if (!event) return 'not a JSON object';
    const { type, object } = event;
    if (typeof type !== 'string') return 'no event type';
    switch (type) {
      case 'ADDED':
      case 'MODIFIED':
      case 'DELETED': {
        if (initialState) {
          return initialState.apply(object, type === 'DELETED') ? undefined : `a ${type} event without a usable object`;
        }
        const decoded = this.decodeObject(object);
        if (!decoded) return `a ${type} event without a usable object`;
        const changed = type === 'DELETED' ? this.remove(decoded.key) : this.put(decoded.key, decoded.info);
        if (decoded.resourceVersion) setResourceVersion(decoded.resourceVersion);
        if (changed) this.options.onChange();
        return undefined;
      }
      case 'BOOKMARK': {
        const meta = plainObject(plainObject(object)?.metadata);
        const rv = meta?.resourceVersion;
        if (typeof rv !== 'string' || rv === '') return 'a BOOKMARK event without a resourceVersion';
        if (initialState) {
          if (plainObject(meta?.annotations)?.[INITIAL_EVENTS_END_ANNOTATION] === 'true') initialState.end(rv);
          else initialState.ignored('a bookmark came before the end of the initial state');
          return undefined;
        }
        setResourceVersion(rv);
        return undefined;
      }
      case 'ERROR': {
        const status = plainObject(object);
        const code = status?.code;
        if (!status || typeof code !== 'number') {
          // An error we cannot read: the stream is of no use any more.
          finish({ kind: 'failed', err: new Error('the watch sent an ERROR event without a status') });
          return 'an ERROR event without a status';
        }
        const message = typeof status.message === 'string' ? status.message : `code ${code}`;
        if (code === 410) finish({ kind: 'expired' });
        else if (code === 504 && /too large resource version/i.test(message))
          finish({ kind: 'expired', tooLarge: true });
        else finish({ kind: 'failed', err: Object.assign(new Error(`watch error: ${message}`), { statusCode: code }) });
        return undefined;
      }
      default:
        return `unknown event type ${JSON.stringify(type).slice(0, 40)}`;
    }
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

function toError(err: unknown): Error {
  if (err instanceof Error) return err;
  const status = err as { code?: number; message?: string; reason?: string } | undefined;
  return new Error(status?.message ?? status?.reason ?? String(err));
}
