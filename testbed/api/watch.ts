// Watches: chunked streams of JSON lines. A watch from an unset or 0 resourceVersion starts with
// the current state as ADDED events (a WatchList ends it with the bookmark marked
// `k8s.io/initial-events-end`), one from a version replays the history after it (410 Gone when
// the history no longer reaches back); then live changes, BOOKMARKs when asked for, and the end
// at timeoutSeconds. The faults of faults.ts and the tests' own (a line injected, a watch made
// silent) act on the open streams.

import type { ServerResponse } from 'node:http';
import { ApiError, REASONS, failureStatus, tooLargeResourceVersion, type KubeObject } from './errors.js';
import type { Faults } from './faults.js';
import type { ReadRequest } from './http.js';
import { initialEventsOf, type ClientReads, type ReadPathFeatures } from './read-path.js';
import { withTypeMeta, type Resource } from './resources.js';
import { inScope } from './selectors.js';
import { visibleChange, type ChangeType, type ObjectStore, type Watcher } from './store.js';
import { toTable, wantsTable } from './table.js';

/** What a watch's replay writes before it waits for the connection to drain. */
const REPLAY_SLICE_BYTES = 256 << 10;

/** The annotation of the bookmark that ends a watch's initial state (metav1.InitialEventsAnnotationKey). */
const INITIAL_EVENTS_END_ANNOTATION = 'k8s.io/initial-events-end';

interface OpenWatch {
  resource: Resource;
  close(): void;
  /** Writes one line as it is, newline added. */
  writeLine(line: string): void;
  /** Delivers nothing more (events, bookmarks, the end at its timeout) and stays open. */
  silence(): void;
}

interface Event {
  type: ChangeType;
  object: KubeObject;
}

/** One watch response: its lines, held back behind its replay while that is being streamed. */
class WatchStream {
  silent = false;
  private held: string[] | undefined;
  private columnsSent = false;

  constructor(
    private readonly res: ServerResponse,
    private readonly resource: Resource,
    private readonly reads: ClientReads,
    /** kubectl get -w asks for Table rows; the column definitions come with the first one only. */
    private readonly asTable: boolean,
    private readonly includeObject: string,
  ) {}

  /** Writes a line now; nothing once the stream is silent or gone (a reset closes it a moment later). */
  put(line: string): void {
    if (!this.silent && !this.res.destroyed && !this.res.writableEnded) {
      this.reads.responseBytes += Buffer.byteLength(line) + 1;
      this.res.write(line + '\n');
    }
  }

  /** Writes a line, behind the replay while one is streamed. */
  writeLine(line: string): void {
    if (this.held) this.held.push(line);
    else this.put(line);
  }

  write(event: KubeObject): void {
    this.writeLine(JSON.stringify(event));
  }

  send(type: ChangeType, object: KubeObject): void {
    this.writeLine(this.eventLine(type, object));
  }

  /** One event as its line (a Table row for kubectl get -w). */
  private eventLine(type: ChangeType, object: KubeObject): string {
    this.reads.objects++;
    if (!this.asTable) return JSON.stringify({ type, object });
    const table = toTable(
      this.resource,
      [object],
      { resourceVersion: object.metadata.resourceVersion },
      this.includeObject,
    );
    if (this.columnsSent) table.columnDefinitions = [];
    this.columnsSent = true;
    return JSON.stringify({ type, object: table });
  }

  /**
   * Streams `events` as the client reads them, as the real server writes a watch: a slice, then
   * a wait for the connection to drain, so that the client decodes the first events while the
   * rest are being encoded, and a slow client holds one slice, not the whole state, in the
   * server's memory. Then `atEnd`, then the lines that waited behind the replay, in order.
   */
  replay(events: Event[], atEnd: () => void): void {
    this.held = [];
    let next = 0;
    const pump = (): void => {
      while (next < events.length) {
        if (this.silent || this.res.destroyed || this.res.writableEnded) return;
        const { type, object } = events[next++]!;
        this.put(this.eventLine(type, object));
        if (this.res.writableLength >= REPLAY_SLICE_BYTES) {
          this.res.once('drain', pump);
          return;
        }
      }
      atEnd();
      const waiting = this.held ?? [];
      this.held = undefined;
      for (const line of waiting) this.put(line);
    };
    pump();
  }
}

export class WatchServer {
  private readonly open = new Set<OpenWatch>();

  constructor(
    private readonly store: ObjectStore,
    private readonly faults: Faults,
    private readonly features: ReadPathFeatures,
    private readonly bookmarkIntervalMs: number,
  ) {}

  /** Open watch streams of `resource`. */
  of(resource: Resource): OpenWatch[] {
    return [...this.open].filter((w) => w.resource === resource);
  }

  closeAll(): void {
    for (const watch of this.open) watch.close();
  }

  serve({ req, res, route, selection, query, reads }: ReadRequest): void {
    const { resource } = route;
    reads.watches++;
    const from = query.get('resourceVersion') ?? '';
    if (from !== '' && !/^\d+$/.test(from)) {
      throw new ApiError(400, `resourceVersion: Invalid value: "${from}": must be a non-negative integer`);
    }
    const initialEvents = initialEventsOf(this.features, query, from);
    const lag = this.faults.lag;
    const cacheVersion = this.faults.cacheVersion;
    if (initialEvents !== undefined && from !== '' && from !== '0' && Number(from) > cacheVersion) {
      throw tooLargeResourceVersion(from, cacheVersion);
    }
    // A consistent start waits for the cache to reach etcd's revision, in vain while it lags.
    if (initialEvents === true && from === '' && lag && lag.rv < this.store.resourceVersion) {
      throw tooLargeResourceVersion(String(this.store.resourceVersion), lag.rv);
    }
    // A consistent start (resourceVersion unset) reads etcd's current revision first.
    if (initialEvents !== undefined && from === '') reads.etcdRevisionReads++;
    const timeoutSeconds = Number(query.get('timeoutSeconds') ?? 0);
    const bookmarks = query.get('allowWatchBookmarks') === 'true';
    const stream = new WatchStream(res, resource, reads, wantsTable(req), query.get('includeObject') ?? 'Metadata');
    const watcher: Watcher = {
      resource,
      namespace: route.namespace,
      selection,
      send: (type, object) => stream.send(type, object),
    };

    res.writeHead(200, { 'Content-Type': 'application/json', 'Cache-Control': 'no-cache, private' });
    res.flushHeaders();
    res.socket?.setNoDelay(true);
    res.on('error', () => undefined);

    if (lag && from !== '' && from !== '0' && Number(from) > lag.rv) {
      stream.write({ type: 'ERROR', object: tooLargeResourceVersion(from, lag.rv).toStatus() });
      res.end();
      return;
    }
    // Unset or 0: start with the current state as synthetic ADDED events, as the real server does.
    let replay: Event[];
    if (initialEvents === false) {
      replay = [];
    } else if (initialEvents === true || from === '' || from === '0') {
      replay = (lag ? lag.objects.get(resource)! : this.store.list(resource))
        .filter((o) => inScope(route.namespace, selection, o))
        .map((o) => ({ type: 'ADDED', object: withTypeMeta(resource, o) }));
    } else {
      const changes = this.store.changesSince(resource, Number(from));
      if (!changes) {
        const message = `too old resource version: ${from} (${this.store.oldestResumable})`;
        stream.write({ type: 'ERROR', object: failureStatus(410, 'Expired', message) });
        res.end();
        return;
      }
      replay = changes.flatMap((c) => {
        if (lag && c.rv > lag.rv) return [];
        const type = visibleChange(c, watcher);
        return type ? [{ type, object: withTypeMeta(resource, c.object) }] : [];
      });
    }
    if (initialEvents === true) {
      reads.watchLists++;
      const breakAt = this.faults.takeWatchListBreak();
      if (breakAt) {
        for (const event of replay.slice(0, breakAt.afterEvents)) stream.send(event.type, event.object);
        if (breakAt.code !== 'end') {
          const message = `too old resource version: ${from || this.store.resourceVersion}`;
          const reason = REASONS[breakAt.code] ?? 'Unknown';
          stream.write({ type: 'ERROR', object: failureStatus(breakAt.code, reason, message) });
        }
        res.end();
        return;
      }
    }
    const bookmark = (metadata: KubeObject) => ({
      type: 'BOOKMARK',
      object: { kind: resource.kind, apiVersion: 'v1', metadata },
    });
    stream.replay(replay, () => {
      if (initialEvents !== true || !bookmarks) return;
      // The end of the initial state: the resourceVersion it is at, marked for WatchList clients.
      reads.bookmarks++;
      const metadata = {
        resourceVersion: String(cacheVersion),
        annotations: { [INITIAL_EVENTS_END_ANNOTATION]: 'true' },
      };
      stream.put(JSON.stringify(bookmark(metadata)));
    });

    // A watch opened on a lagging cache gets nothing newer than it until the cache catches up.
    let unsubscribe = () => undefined as unknown;
    let parked = lag !== undefined;
    let closed = false;
    if (lag) {
      lag.parked.push(() => {
        parked = false;
        if (closed || stream.silent) return;
        for (const c of this.store.changesSince(resource, lag.rv) ?? []) {
          const type = visibleChange(c, watcher);
          if (type) stream.send(type, withTypeMeta(resource, c.object));
        }
        unsubscribe = this.store.subscribe(watcher);
      });
    } else {
      unsubscribe = this.store.subscribe(watcher);
    }
    const timers: NodeJS.Timeout[] = [];
    if (bookmarks) {
      timers.push(
        setInterval(() => {
          reads.bookmarks++;
          const rv = parked && lag ? lag.rv : this.store.resourceVersion;
          stream.write(bookmark({ resourceVersion: String(rv) }));
        }, this.bookmarkIntervalMs),
      );
    }
    const open: OpenWatch = {
      resource,
      close: () => res.end(),
      writeLine: (line) => stream.writeLine(line),
      silence: () => {
        stream.silent = true;
        unsubscribe();
        for (const t of timers) clearTimeout(t);
      },
    };
    // As the real server: the stream ends at the timeout the client asked for.
    if (timeoutSeconds > 0) timers.push(setTimeout(() => !stream.silent && open.close(), timeoutSeconds * 1000));
    this.open.add(open);
    res.on('close', () => {
      closed = true;
      unsubscribe();
      for (const t of timers) clearTimeout(t);
      this.open.delete(open);
    });
  }
}
