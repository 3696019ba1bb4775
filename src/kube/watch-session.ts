// One watch of an informer (informer.ts runs the loop around it), from one resourceVersion until
// the stream ends, applying what it delivers to the cache (store.ts) as it comes.
// - A WatchList stream (`initial`) first delivers the whole state as ADDED events, ended by a
//   bookmark marked k8s.io/initial-events-end; that state is built aside and swapped in whole, then
//   the stream goes on as a watch. An unmarked bookmark first says the server ignored the request.
// - It asks for bookmarks and for a server-side timeout randomised in [min, 2*min) as client-go
//   does, so that a fleet does not re-watch in step. A watch that delivers nothing (no event, no
//   bookmark) for a while past that timeout is a dead connection (a half-open one through a NAT or
//   load balancer): it is aborted.
// - A line that is not a watch event (not JSON, or JSON of the wrong shape) is skipped and
//   reported; many in a row make the stream unusable and the session ends. Nothing a stream says
//   can throw out of a session: each way it ends is a WatchEnd, which the loop acts on.

import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import { plainObject, type ObjectStore, type Rebuild } from './store.js';
import { startWatch, type WatchStreamError } from './watch.js';

/** Undecodable lines in a row after which a stream is given up and replaced. */
const MAX_DECODE_ERRORS_IN_A_ROW = 100;
const DEFAULT_MIN_WATCH_TIMEOUT_MS = 5 * 60_000;
/** The annotation of the bookmark that ends a WatchList stream's initial state. */
export const INITIAL_EVENTS_END_ANNOTATION = 'k8s.io/initial-events-end';

/** The server-side timeout of one watch, in seconds: uniformly in [min, 2*min), as client-go. */
export function watchTimeoutSeconds(minMs: number, random: () => number = Math.random): number {
  const minS = Math.max(1, Math.round(minMs / 1000));
  return minS + Math.floor(random() * minS);
}

/** How a watch ended. */
export type WatchEnd =
  /** The server ended the stream (its timeout), or the informer stopped: re-watch at once. */
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

/**
 * What a session gave. `resourceVersion`: where a watch may resume, undefined when an initial
 * stream ended before its state was whole. `delivered`: events or bookmarks after the initial
 * state. `synced`: the initial state arrived whole.
 */
export interface WatchOutcome {
  end: WatchEnd;
  resourceVersion: string | undefined;
  delivered: boolean;
  synced: boolean;
}

/** What a session reads and tells; the informer gives it. Its reporting callbacks never throw. */
export interface WatchSessionContext<T> {
  kubeConfig: KubeConfig;
  /** API path, e.g. /api/v1/services. */
  path: string;
  fieldSelector?: string;
  /** Lower bound of the server-side watch timeout; default 5 minutes. */
  minWatchTimeoutMs?: number;
  /** How long the watch may deliver nothing; default the timeout asked for plus a margin. */
  watchIdleTimeoutMs?: number;
  store: ObjectStore<T>;
  /** The cache changed (may throw: the session then ends and asks for a relist). */
  onChange(): void;
  /** Whether the loop that started the session still runs; nothing is applied once it does not. */
  current(): boolean;
  /** Where the session leaves a function that ends it at once (the informer's stop()). */
  interrupt: { now?: () => void };
  /** The server accepted the watch. */
  opened(): void;
  /** A line that is not a watch event; `first`: the stream's first such line. */
  undecodable(problem: string, first: boolean): void;
  /** The initial state of a WatchList stream arrived whole and replaced the cache. */
  initialStateArrived(): void;
}

/** How an initial stream's lines reach the state being built. */
interface InitialState {
  apply(raw: unknown, deleted: boolean): boolean;
  end(rv: string): void;
  ignored(why: string): void;
}

/** One watch from `from`, until it ends (see the top of this file); never rejects. */
export function watchSession<T>(ctx: WatchSessionContext<T>, from: string, initial: boolean): Promise<WatchOutcome> {
  const timeoutSeconds = watchTimeoutSeconds(ctx.minWatchTimeoutMs ?? DEFAULT_MIN_WATCH_TIMEOUT_MS);
  const idleMs =
    ctx.watchIdleTimeoutMs ?? timeoutSeconds * 1000 + Math.min(30_000, Math.max(1000, timeoutSeconds * 100));
  let resourceVersion: string | undefined = initial ? undefined : from;
  /** The initial state being built (initial streams, until their marked bookmark). */
  let rebuild: Rebuild | undefined = initial ? ctx.store.rebuild() : undefined;
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
      if (ctx.interrupt.now === interrupted) ctx.interrupt.now = undefined;
      abort?.();
      resolve({ end, resourceVersion, delivered, synced });
    };
    const interrupted = () => finish({ kind: 'closed' });
    ctx.interrupt.now = interrupted;
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
      ctx.undecodable(problem, decodeErrors === 1);
      if (decodeErrorsInARow >= MAX_DECODE_ERRORS_IN_A_ROW) {
        finish({
          kind: 'failed',
          err: new Error(`${decodeErrorsInARow} watch lines in a row were not watch events: the stream is unusable`),
        });
      }
    };
    // Made once per watch, not per line.
    const setResourceVersion = (rv: string) => {
      if (!rebuild) resourceVersion = rv;
    };
    const initialState: InitialState = {
      apply: (raw, deleted) => rebuild!.apply(raw, deleted),
      /** The marked bookmark: the state is whole at `rv`. */
      end: (rv) => {
        const built = rebuild!;
        rebuild = undefined;
        if (built.swap()) ctx.onChange();
        synced = true;
        resourceVersion = rv;
        ctx.initialStateArrived();
      },
      ignored: (why) => finish({ kind: 'noWatchList', why }),
    };
    const onLine = (line: unknown) => {
      if (finished || !ctx.current()) return;
      try {
        const inInitialState = rebuild !== undefined;
        const problem = applyEvent(ctx, line, setResourceVersion, finish, rebuild && initialState);
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
    if (ctx.fieldSelector) query.fieldSelector = ctx.fieldSelector;
    abort = startWatch(ctx.kubeConfig, ctx.path, query, {
      // Reported only once the server answered, so that an observer can tell a connected
      // watch from a retry that is about to fail.
      onOpen: () => {
        if (!finished) ctx.opened();
      },
      onValue: onLine,
      onUndecodable: (problem) => {
        if (!finished && ctx.current()) decodeError(problem);
      },
      onEnd: onDone,
    });
  });
}

/**
 * Applies one decoded watch line. Returns what is wrong with it when it is not a watch event
 * (nothing is applied then). `initialState`: the line belongs to a WatchList stream's initial
 * state (objects go to the state being built; a bookmark ends it, or, unmarked, says the server
 * ignored the request for it).
 */
function applyEvent<T>(
  ctx: WatchSessionContext<T>,
  line: unknown,
  setResourceVersion: (rv: string) => void,
  finish: (end: WatchEnd) => void,
  initialState: InitialState | undefined,
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
      const decoded = ctx.store.decode(object);
      if (!decoded) return `a ${type} event without a usable object`;
      const changed = type === 'DELETED' ? ctx.store.remove(decoded.key) : ctx.store.put(decoded.key, decoded.info);
      if (decoded.resourceVersion) setResourceVersion(decoded.resourceVersion);
      if (changed) ctx.onChange();
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
      else if (code === 504 && /too large resource version/i.test(message)) finish({ kind: 'expired', tooLarge: true });
      else finish({ kind: 'failed', err: Object.assign(new Error(`watch error: ${message}`), { statusCode: code }) });
      return undefined;
    }
    default:
      return `unknown event type ${JSON.stringify(type).slice(0, 40)}`;
  }
}

export function toError(err: unknown): Error {
  if (err instanceof Error) return err;
  const status = err as { code?: number; message?: string; reason?: string } | undefined;
  return new Error(status?.message ?? status?.reason ?? String(err));
}
