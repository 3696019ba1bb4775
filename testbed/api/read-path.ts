// The read path of a modelled kube-apiserver release: which lists and watches its watch cache
// serves and which reach etcd, how `limit` and continue tokens are treated, whether a watch may
// ask for its initial state (WatchList), and what each client cost (by its bearer token).

import { invalidListOptions } from './errors.js';

/** The releases whose read path the stand-in models (1.26: before WatchList existed). */
export type ModelledVersion = '1.26' | '1.27' | '1.28' | '1.29' | '1.30' | '1.31' | '1.32' | '1.33' | '1.34' | '1.35';

export interface ReadPathOptions {
  /**
   * The kube-apiserver release whose read path is modelled (its watch cache and the feature
   * gates' defaults of that release): which lists and watches the cache serves and which reach
   * etcd (readsByClient()), how `limit` and continue tokens are treated, and whether a watch may
   * ask for its initial state (WatchList). Default '1.34'.
   */
  serverVersion?: ModelledVersion;
  /**
   * The WatchList feature gate (watch with sendInitialEvents=true). Default: that of the
   * release (on in 1.32 and from 1.34, off in 1.27 to 1.31 and in 1.33; unknown before 1.27).
   * 'ignored' models a server that does not know the parameters and serves the watch as if they
   * were not there (not a kube-apiserver: some proxies and aggregated servers).
   */
  watchList?: boolean | 'ignored';
  /**
   * ConsistentListFromCache (lists with resourceVersion unset served from the cache after one
   * read of etcd's current revision). Default: on from 1.31; off models an etcd older than
   * 3.4.31 / 3.5.13, with which the server turns it off.
   */
  consistentListFromCache?: boolean;
}

/**
 * What one client cost the API server, by the bearer token it came with (kubeconfig(client)).
 * "etcd" counts what the modelled server would read from etcd for these requests: a list page
 * served from etcd reads its objects there; a consistent read served from the watch cache reads
 * only etcd's current revision (a one-key range read, counted apart).
 */
export interface ClientReads {
  /** HTTP requests. */
  requests: number;
  /** List requests (each page one). */
  lists: number;
  /** Watch requests, WatchList streams included. */
  watches: number;
  /** Watches that asked for their initial state (sendInitialEvents=true) and were served it. */
  watchLists: number;
  /** Bytes of response bodies: lists, watch streams, errors. */
  responseBytes: number;
  /** Objects sent: list items and watch events (bookmarks not counted). */
  objects: number;
  /** Bookmarks sent. */
  bookmarks: number;
  /** List requests (pages) the modelled server would serve from etcd. */
  etcdListReads: number;
  /** Objects those reads take from etcd. */
  etcdObjects: number;
  /** Reads of etcd's current revision by consistent reads served from the cache. */
  etcdRevisionReads: number;
}

/** The clients' reads, by the name their bearer token carries (`<token>.<name>`). */
export class ClientLedger {
  private readonly reads = new Map<string, ClientReads>();

  constructor(private readonly token: string) {}

  /** The reads of the client of a request's Authorization header; 'default' for the bare token. */
  of(authorization: string | undefined): ClientReads {
    const token = /^Bearer\s+(.*)$/i.exec(authorization ?? '')?.[1] ?? '';
    const client = token.startsWith(`${this.token}.`) ? token.slice(this.token.length + 1) : 'default';
    let reads = this.reads.get(client);
    if (!reads) {
      reads = {
        requests: 0,
        lists: 0,
        watches: 0,
        watchLists: 0,
        responseBytes: 0,
        objects: 0,
        bookmarks: 0,
        etcdListReads: 0,
        etcdObjects: 0,
        etcdRevisionReads: 0,
      };
      this.reads.set(client, reads);
    }
    return reads;
  }

  /** A copy of each client's reads so far. */
  byClient(): Record<string, ClientReads> {
    return Object.fromEntries([...this.reads].map(([client, reads]) => [client, { ...reads }]));
  }

  reset(): void {
    this.reads.clear();
  }
}

/** The feature set of a modelled release. */
export interface ReadPathFeatures {
  minor: number;
  /** Undefined before 1.27: the parameters are unknown to the server. */
  watchList: boolean | 'ignored' | undefined;
  consistentListFromCache: boolean;
  /** ListFromCacheSnapshot (beta, on from 1.34): continue tokens served from cache snapshots. */
  listFromCacheSnapshot: boolean;
}

export function readPathFeatures(opts: ReadPathOptions): ReadPathFeatures {
  const minor = Number((opts.serverVersion ?? '1.34').split('.')[1]);
  const defaultWatchList = minor < 27 ? undefined : minor === 32 || minor >= 34;
  return {
    minor,
    watchList: opts.watchList ?? defaultWatchList,
    consistentListFromCache: opts.consistentListFromCache ?? minor >= 31,
    listFromCacheSnapshot: minor >= 34,
  };
}

/**
 * Where the modelled server reads a list from: its watch cache, or etcd (the cacher's
 * shouldDelegateList of the release). A consistent read served from the cache first reads
 * etcd's current revision (revisionProbe).
 */
export function listReadPath(
  f: ReadPathFeatures,
  rv: string,
  match: string,
  limit: number,
  continued: boolean,
): { fromCache: boolean; revisionProbe: boolean } {
  const etcd = { fromCache: false, revisionProbe: false };
  const cache = { fromCache: true, revisionProbe: false };
  if (match === 'Exact') return etcd;
  // A limit with a resourceVersion other than 0 and no match is the legacy exact read.
  if (match === '' && limit > 0 && rv !== '' && rv !== '0') return etcd;
  // Continue tokens: from etcd, or from the cache's snapshots (ListFromCacheSnapshot, 1.34).
  if (continued) return f.listFromCacheSnapshot ? cache : etcd;
  if (rv === '') return f.consistentListFromCache ? { fromCache: true, revisionProbe: true } : etcd;
  // Before 1.31 the cache served no paginated list but those at resourceVersion 0.
  if (f.minor < 31 && limit > 0 && rv !== '0') return etcd;
  return cache;
}

/**
 * Whether a watch asked for its initial state (sendInitialEvents), validated as the modelled
 * release validates it; undefined for a legacy watch.
 */
export function initialEventsOf(f: ReadPathFeatures, query: URLSearchParams, rv: string): boolean | undefined {
  if (f.watchList === 'ignored') return undefined;
  const sie = query.get('sendInitialEvents');
  const match = query.get('resourceVersionMatch') ?? '';
  if (f.watchList === undefined) {
    // Before 1.27 sendInitialEvents is an unknown parameter (ignored); resourceVersionMatch is not.
    if (match !== '')
      throw invalidListOptions(['resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch']);
    return undefined;
  }
  const send = sie === null ? undefined : sie === 'true';
  const errors: string[] = [];
  if (send !== undefined) {
    if (match !== 'NotOlderThan') {
      errors.push(
        'resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan',
      );
    }
    if (!f.watchList) {
      errors.push(
        'sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled',
      );
    }
  }
  if (match !== '') {
    if (send === undefined) {
      errors.push(
        'resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided',
      );
    }
    if (match !== 'NotOlderThan') {
      errors.push(`resourceVersionMatch: Unsupported value: "${match}": supported values: "NotOlderThan"`);
    }
  }
  if (errors.length > 0) throw invalidListOptions(errors);
  // SetListOptionsDefaults: with WatchList on, a watch from "" or "0" is a WatchList.
  if (send === undefined && match === '' && (rv === '' || rv === '0')) return true;
  return send;
}
