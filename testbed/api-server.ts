// A small Kubernetes API server for tests, benchmarks and the demo.
//
// It speaks the wire protocol of the real kube-apiserver for the few core/v1 resources the
// controller uses (Services, Nodes, Events, Namespaces), so that the real
// @kubernetes/client-node and the real kubectl run against it end to end: HTTPS with a CA of
// its own, bearer tokens, discovery, JSON lists with a global resourceVersion and chunking,
// chunked watch streams with history replay, BOOKMARK events and 410 Gone, metav1.Status
// errors, and merge / strategic-merge / JSON patches. Tests drive it through apply/remove and
// can make it unavailable, forget its watch history, or inject the faults of api/faults.ts.
//
// This file is the server itself: its connections, the routing of requests, and what tests call.
// The parts live in api/: the resources and their objects (resources.ts, objects.ts, store.ts),
// reads (read-path.ts, list.ts, watch.ts, selectors.ts, table.ts), writes (writes.ts,
// patches.ts), and the plumbing (http.ts, errors.ts, tls.ts).

import { randomBytes } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import https from 'node:https';
import { isIP, type AddressInfo, type Socket } from 'node:net';
import { ApiError, methodNotAllowed, type KubeObject } from './api/errors.js';
import { Faults } from './api/faults.js';
import { chargeResponse, discovery, parseRoute, sendJson } from './api/http.js';
import { ListServer } from './api/list.js';
import { ObjectWriter } from './api/objects.js';
import { ClientLedger, readPathFeatures, type ClientReads, type ReadPathOptions } from './api/read-path.js';
import { normalize, resourceOfKind, withTypeMeta, type StoredKind, type Verb } from './api/resources.js';
import { parseSelection } from './api/selectors.js';
import { ObjectStore } from './api/store.js';
import { toTable, wantsTable } from './api/table.js';
import { kubeconfigYaml, makeServingCertificate } from './api/tls.js';
import { WatchServer } from './api/watch.js';
import { WriteVerbs } from './api/writes.js';

export type { ClientReads } from './api/read-path.js';

export interface ApiStandInOptions extends ReadPathOptions {
  /** Address to listen on; default 127.0.0.1. */
  host?: string;
  /** 0 picks an ephemeral port. */
  port?: number;
  /** Period of BOOKMARK events on watches that asked for them; default 1000. */
  bookmarkIntervalMs?: number;
  /** Number of change events kept for watch resumption; default 1000. */
  historyLimit?: number;
}

export interface ApiStandInStats {
  /** List requests (not watches) by resource plural, e.g. lists.services. */
  lists: Record<string, number>;
  /** Watch requests by resource plural, e.g. watches.nodes. */
  watches: Record<string, number>;
  /** Every HTTP request that reached the server. */
  requests: number;
  /** TCP connections accepted (a keep-alive client reuses one for many requests). */
  connections: number;
}

export class ApiStandIn {
  readonly url: string;
  readonly caPem: string;
  readonly stats: ApiStandInStats = { lists: {}, watches: {}, requests: 0, connections: 0 };

  private readonly store: ObjectStore;
  private readonly writer: ObjectWriter;
  private readonly writes: WriteVerbs;
  private readonly faults: Faults;
  private readonly lists: ListServer;
  private readonly watches: WatchServer;
  private readonly sockets = new Set<Socket>();
  private readonly token = 'stand-in-' + randomBytes(8).toString('hex');
  private readonly ledger = new ClientLedger(this.token);
  private readonly minor: number;
  private unavailable = false;

  private constructor(
    private readonly server: https.Server,
    url: string,
    caPem: string,
    opts: ApiStandInOptions,
  ) {
    this.url = url;
    this.caPem = caPem;
    const features = readPathFeatures(opts);
    this.minor = features.minor;
    this.store = new ObjectStore(opts.historyLimit ?? 1000);
    this.writer = new ObjectWriter(this.store);
    this.writes = new WriteVerbs(this.store, this.writer);
    this.faults = new Faults(this.store);
    this.lists = new ListServer(this.store, this.faults, features);
    this.watches = new WatchServer(this.store, this.faults, features, opts.bookmarkIntervalMs ?? 1000);
  }

  static async start(opts: ApiStandInOptions = {}): Promise<ApiStandIn> {
    const host = opts.host ?? '127.0.0.1';
    const cert = await makeServingCertificate(host);
    const server = https.createServer({ key: cert.keyPem, cert: cert.certPem });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(opts.port ?? 0, host, () => {
        server.off('error', reject);
        resolve();
      });
    });
    const { port } = server.address() as AddressInfo;
    const url = `https://${isIP(host) === 6 ? `[${host}]` : host}:${port}`;
    const standIn = new ApiStandIn(server, url, cert.caPem, opts);
    standIn.listen();
    return standIn;
  }

  /**
   * A kubeconfig for this server. `client` names the client in readsByClient() (its bearer
   * token carries the name); default 'default'.
   */
  kubeconfig(client?: string): string {
    return kubeconfigYaml(this.url, this.caPem, client === undefined ? this.token : `${this.token}.${client}`);
  }

  async writeKubeconfig(path: string, client?: string): Promise<void> {
    await writeFile(path, this.kubeconfig(client), { mode: 0o600 });
  }

  /** What each client has cost so far (a copy), by client name (see kubeconfig()). */
  readsByClient(): Record<string, ClientReads> {
    return this.ledger.byClient();
  }

  /** Forgets the counts of readsByClient(). */
  resetReads(): void {
    this.ledger.reset();
  }

  /**
   * The next WatchList stream (a watch with sendInitialEvents=true) sends `afterEvents` of its
   * initial events, then an ERROR event with `code` (410: as if its resourceVersion had been
   * compacted meanwhile), and ends.
   */
  breakNextWatchList(afterEvents: number, code: number | 'end' = 410): void {
    this.faults.breakNextWatchList(afterEvents, code);
  }

  /**
   * The next list response (a page, for a paginated list) sends `afterItems` of its items, then
   * its connection is reset in the middle of the body, as when the API server or a proxy in
   * front of it goes away while a list is being read.
   */
  breakNextList(afterItems: number): void {
    this.faults.breakNextList(afterItems);
  }

  /**
   * From now on, the watch cache that new requests reach stays at the current resourceVersion,
   * as an API server's cache that lags behind etcd (another API server behind the same address,
   * or one busy catching up): a list at resourceVersion=0 (or at a version it has reached) is
   * served the state it holds, older than etcd's; a list or WatchList stream asking for a version
   * newer than it holds is answered 504 "Too large resource version", and so is a watch from such
   * a version (as an ERROR event); a consistent list (resourceVersion unset) falls back to etcd, as
   * ConsistentListFromCache does when the cache is not fresh. Watches opened before go on as
   * they were (they are on a server that is up to date); watches opened meanwhile from a version
   * it holds deliver their replay up to it and nothing newer until catchUpWatchCache().
   */
  lagWatchCache(): void {
    this.faults.lagWatchCache();
  }

  /** The watch cache is up to date again: the watches it parked get what they missed and go on. */
  catchUpWatchCache(): void {
    this.faults.catchUpWatchCache();
  }

  /**
   * Creates or replaces an object by kind/namespace/name, status included, and returns what
   * was stored. Only metadata is filled in (no Service defaults), so tests can store shapes a
   * real server would not produce. A given uid or creationTimestamp is kept. A replace that
   * changes nothing is a no-op (no new resourceVersion, no event), as on the real server.
   */
  apply(obj: KubeObject): KubeObject {
    const resource = resourceOfKind(obj?.kind);
    const incoming = normalize(resource, obj);
    const existing = this.store.get(resource, incoming.metadata.namespace, incoming.metadata.name);
    if (existing) return structuredClone(this.writer.update(resource, existing, incoming, { keepCreation: false }));
    return structuredClone(this.writer.create(resource, incoming, { defaults: false }));
  }

  remove(kind: StoredKind, namespace: string | undefined, name: string): boolean {
    return this.store.delete(resourceOfKind(kind), namespace, name) !== undefined;
  }

  get(kind: StoredKind, namespace: string | undefined, name: string): KubeObject | undefined {
    const resource = resourceOfKind(kind);
    const obj = this.store.get(resource, namespace, name);
    return obj && withTypeMeta(resource, structuredClone(obj));
  }

  list(kind: StoredKind): KubeObject[] {
    const resource = resourceOfKind(kind);
    return this.store.list(resource).map((o) => withTypeMeta(resource, structuredClone(o)));
  }

  /** While on, every connection is reset, including open watches and idle keep-alive sockets. */
  setUnavailable(on: boolean): void {
    this.unavailable = on;
    if (on) {
      for (const socket of this.sockets) socket.resetAndDestroy();
      this.sockets.clear();
    }
  }

  /**
   * Writes `line` (newline added), whatever it is, into every open watch of `kind` at once, as
   * a broken proxy or server in front of the client could. Returns the number of watches.
   */
  injectWatchLine(kind: StoredKind, line: string): number {
    const open = this.watches.of(resourceOfKind(kind));
    for (const watch of open) watch.writeLine(line);
    return open.length;
  }

  /**
   * Makes every watch of `kind` open now a half-open connection, as a NAT or load balancer that
   * dropped its state leaves it: it stays open but delivers nothing more (no event, no bookmark,
   * not even its end at timeoutSeconds). Watches started afterwards work. Returns their number.
   */
  silenceOpenWatches(kind: StoredKind): number {
    const open = this.watches.of(resourceOfKind(kind));
    for (const watch of open) watch.silence();
    return open.length;
  }

  /** Open watch streams of `kind`. */
  openWatchCount(kind: StoredKind): number {
    return this.watches.of(resourceOfKind(kind)).length;
  }

  /**
   * Forgets the watch history (and open list snapshots): resuming a watch from any
   * resourceVersion seen so far gets 410 Gone; a new list works and can be watched from.
   */
  expireHistory(): void {
    this.store.expireHistory();
    this.lists.forgetSnapshots();
  }

  async stop(): Promise<void> {
    this.watches.closeAll();
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const socket of this.sockets) socket.destroy();
    this.server.closeAllConnections();
    await closed;
  }

  private listen(): void {
    this.server.on('connection', (socket: Socket) => {
      if (this.unavailable) {
        socket.resetAndDestroy();
        return;
      }
      this.stats.connections++;
      this.sockets.add(socket);
      socket.on('close', () => this.sockets.delete(socket));
    });
    // A TLS handshake cut short by setUnavailable is expected; nothing to report.
    this.server.on('tlsClientError', () => undefined);
    this.server.on('request', (req: IncomingMessage, res: ServerResponse) => {
      this.handle(req, res).catch((err: unknown) => this.fail(res, err));
    });
  }

  private fail(res: ServerResponse, err: unknown): void {
    const apiError = err instanceof ApiError ? err : new ApiError(500, `internal error: ${String(err)}`);
    if (res.headersSent) {
      res.destroy();
      return;
    }
    sendJson(res, apiError.code, apiError.toStatus());
  }

  /** Routes a request: discovery, then the resources' verbs. */
  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    this.stats.requests++;
    if (!req.headers.authorization) throw new ApiError(401, 'Unauthorized');
    const reads = this.ledger.of(req.headers.authorization);
    reads.requests++;
    chargeResponse(res, reads);
    const url = new URL(req.url ?? '/', 'https://stand-in');
    const method = req.method ?? 'GET';
    if (url.pathname === '/debug/reads' && method === 'GET') {
      sendJson(res, 200, this.readsByClient());
      return;
    }
    const document = discovery(url.pathname, new URL(this.url).host, this.minor);
    if (document !== undefined) {
      if (method !== 'GET') throw methodNotAllowed();
      sendJson(res, 200, document);
      return;
    }
    const route = parseRoute(url.pathname);
    if (!route) throw new ApiError(404, 'the server could not find the requested resource', 'NotFound', {});
    const query = url.searchParams;
    const watch = route.watchPath || query.get('watch') === 'true' || query.get('watch') === '1';
    const { resource, name, subresource } = route;
    const verbAllowed = (verb: Verb) => {
      if (!resource.verbs.includes(verb)) throw methodNotAllowed();
    };
    if (method === 'GET' && (watch || name === undefined)) {
      verbAllowed(watch ? 'watch' : 'list');
      if (subresource) throw methodNotAllowed();
      const selection = parseSelection(resource, query, name);
      const counts = watch ? this.stats.watches : this.stats.lists;
      counts[resource.plural] = (counts[resource.plural] ?? 0) + 1;
      const read = { req, res, route, selection, query, reads };
      if (watch) this.watches.serve(read);
      else this.lists.serve(read);
      return;
    }
    if (name === undefined) {
      if (method !== 'POST') throw methodNotAllowed();
      verbAllowed('create');
      if (resource.namespaced && route.namespace === undefined) throw methodNotAllowed();
      await this.writes.create(req, res, route, query);
      return;
    }
    switch (method) {
      case 'GET': {
        verbAllowed('get');
        const obj = this.writes.mustGet(route);
        if (wantsTable(req)) {
          sendJson(res, 200, toTable(resource, [obj], {}, query.get('includeObject') ?? 'Metadata'));
        } else {
          sendJson(res, 200, withTypeMeta(resource, obj));
        }
        return;
      }
      case 'PUT':
        verbAllowed('update');
        await this.writes.replace(req, res, route, query);
        return;
      case 'PATCH':
        verbAllowed('patch');
        await this.writes.patch(req, res, route, query);
        return;
      case 'DELETE':
        verbAllowed('delete');
        if (subresource) throw methodNotAllowed();
        await this.writes.delete(req, res, route, query);
        return;
      default:
        throw methodNotAllowed();
    }
  }
}
