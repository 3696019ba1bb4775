// The two caches the controller reads: every Service, and this node's Node object.

// The one part of client-node the controller runs, imported from its module: the package's index
// would load all of client-node (its generated API, Watch, node-fetch, ...).
import { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import type { NodeInfo, ServiceInfo } from '../model/types.js';
import { Informer, type InformerObserver } from './informer.js';
import { toNodeInfo, toServiceInfo } from './objects.js';
import { formatSize } from '../bytes.js';
import { ListBodySplitter } from './list-stream.js';
import { apiGetStream, apiRequest, MAX_RESPONSE_BYTES, ResponseTooLargeError, statusMessage } from './request.js';

export function loadKubeConfig(path: string | undefined): KubeConfig {
  const kc = new KubeConfig();
  if (path) kc.loadFromFile(path);
  else if (process.env.KUBERNETES_SERVICE_HOST) kc.loadFromCluster();
  else kc.loadFromDefault();
  if (!kc.getCurrentCluster()) {
    throw new Error(
      path
        ? `kubeconfig ${path} has no current cluster`
        : 'no Kubernetes configuration found: pass --kubeconfig, set KUBECONFIG, or run in a pod',
    );
  }
  return kc;
}

export interface ClusterCaches {
  services: Informer<ServiceInfo>;
  node: Informer<NodeInfo>;
}

/** Objects asked for per list page: 500 Services of a few KiB each make a page of 1 to 2 MiB. */
export const PAGE_SIZE = 500;
/**
 * The most bytes of one list page: as much as the largest object takes (request.ts), so that a
 * page of one object always fits. A page of large objects is asked for again with a smaller
 * limit (listPager), so that large objects never fail a list.
 */
export const MAX_LIST_PAGE_BYTES = MAX_RESPONSE_BYTES;
const LIST_TIMEOUT_MS = 60_000;

type ListPage = { items: unknown[]; resourceVersion?: string; continue?: string; bytes: number };

/** A list page larger than the bound even with limit=1: the list fails (the informer retries). */
export class ListPageTooLargeError extends Error {
  constructor(
    readonly path: string,
    readonly limitBytes: number,
  ) {
    super(
      `listing ${path}: a page of one object (limit=1) is larger than ${formatSize(limitBytes)}, the most one page ` +
        'may hold (an object cannot be that large in etcd: does something between here and the API server ignore limit?)',
    );
    this.name = 'ListPageTooLargeError';
  }
}

/**
 * One page of a list as plain JSON, at most `maxBytes` long (a longer one is a
 * ResponseTooLargeError, not read further). The typed list calls of client-node deserialize
 * every field of every object into model classes (dates included) before the informer strips
 * them to the few fields it keeps: with tens of thousands of Services that is most of the time
 * and garbage of a list.
 */
export async function listPageJson(
  kc: KubeConfig,
  path: string,
  query: Record<string, string | undefined>,
  maxBytes = MAX_LIST_PAGE_BYTES,
): Promise<ListPage> {
  const response = await apiRequest(kc, path, { query, timeoutMs: LIST_TIMEOUT_MS, maxResponseBytes: maxBytes });
  if (response.status !== 200) {
    // statusCode as client-node's errors carry it: the informer relists on 410.
    throw Object.assign(new Error(`listing ${path}: ${statusMessage(response)}`), { statusCode: response.status });
  }
  const parsed = (response.json ?? {}) as {
    items?: unknown;
    metadata?: { resourceVersion?: unknown; continue?: unknown };
  };
  const meta = parsed.metadata ?? {};
  return {
    items: Array.isArray(parsed.items) ? parsed.items : [],
    resourceVersion: typeof meta.resourceVersion === 'string' ? meta.resourceVersion : undefined,
    continue: typeof meta.continue === 'string' && meta.continue !== '' ? meta.continue : undefined,
    bytes: response.bytes,
  };
}

/**
 * Reads a list page by page (`listPage(undefined)` starts a list, then each page's continue
 * token), each page at most `maxPageBytes`. A page over the bound is asked for again with half
 * the limit, down to one object; a page under half the bound lets the next one double, up to
 * PAGE_SIZE. Pages of ordinary Services stay at PAGE_SIZE; Services near etcd's 1.5 MiB make
 * pages of a few objects, and the list goes on. Only a page of one object over the bound fails
 * the list (ListPageTooLargeError). The limit may change between the pages of one list: the
 * continue token carries where the list is, not its page size.
 */
export function listPager(
  kc: KubeConfig,
  path: string,
  query: Record<string, string | undefined> = {},
  maxPageBytes = MAX_LIST_PAGE_BYTES,
): (continueToken: string | undefined) => Promise<ListPage> {
  let limit = PAGE_SIZE;
  return async (continueToken) => {
    if (continueToken === undefined) limit = PAGE_SIZE;
    for (;;) {
      try {
        const page = await listPageJson(
          kc,
          path,
          { ...query, limit: String(limit), continue: continueToken },
          maxPageBytes,
        );
        if (page.bytes < maxPageBytes / 2) limit = Math.min(PAGE_SIZE, limit * 2);
        return page;
      } catch (err) {
        if (!(err instanceof ResponseTooLargeError)) throw err;
        if (limit === 1) throw new ListPageTooLargeError(path, maxPageBytes);
        limit = Math.max(1, Math.floor(limit / 2));
      }
    }
  };
}

/**
 * Reads a whole list at `resourceVersion`, each object handed to `onItem` as it arrives (not the
 * body: list-stream.ts), each at most MAX_RESPONSE_BYTES long. '0': any state, which the API
 * server's watch cache serves whole in one response whatever the limit; a version: a state not
 * older than it, also served whole from the cache (a limit would send it to etcd: none is asked);
 * '': the newest state, a consistent read, asked in pages of PAGE_SIZE as client-go does (from
 * the cache with ConsistentListFromCache, 1.31; page by page from etcd before). A server that
 * paginates anyway (its watch cache is off) is followed page by page. Returns the list's
 * resourceVersion. Errors carry the HTTP status as `statusCode`.
 */
export async function streamList(
  kc: KubeConfig,
  path: string,
  query: Record<string, string | undefined>,
  resourceVersion: string,
  onItem: (raw: unknown) => void,
): Promise<string | undefined> {
  let listVersion: string | undefined;
  let continueToken: string | undefined;
  let first = true;
  do {
    const pageQuery: Record<string, string | undefined> = { ...query };
    if (continueToken !== undefined) {
      // The token says where and at which version: a resourceVersion beside it is refused.
      pageQuery.continue = continueToken;
      pageQuery.limit = String(PAGE_SIZE);
    } else {
      if (resourceVersion !== '') pageQuery.resourceVersion = resourceVersion;
      if (resourceVersion === '' || resourceVersion === '0') pageQuery.limit = String(PAGE_SIZE);
    }
    const body = new ListBodySplitter(path, MAX_RESPONSE_BYTES, onItem);
    const response = await apiGetStream(kc, path, { query: pageQuery, timeoutMs: LIST_TIMEOUT_MS }, (chunk) =>
      body.push(chunk),
    );
    if (response.error) {
      throw Object.assign(new Error(`listing ${path}: ${statusMessage(response.error)}`), {
        statusCode: response.status,
      });
    }
    body.end();
    const meta = (body.members.metadata ?? {}) as { resourceVersion?: unknown; continue?: unknown };
    if (first && typeof meta.resourceVersion === 'string') listVersion = meta.resourceVersion;
    first = false;
    continueToken = typeof meta.continue === 'string' && meta.continue !== '' ? meta.continue : undefined;
  } while (continueToken !== undefined);
  return listVersion;
}

/** Every item of a list, page by page, each stripped as its page arrives. */
export async function listAllJson<T>(
  kc: KubeConfig,
  path: string,
  query: Record<string, string | undefined>,
  strip: (raw: unknown) => T | undefined,
): Promise<T[]> {
  const out: T[] = [];
  const listPage = listPager(kc, path, query);
  let token: string | undefined;
  do {
    const page = await listPage(token);
    for (const raw of page.items) {
      const item = strip(raw);
      if (item !== undefined) out.push(item);
    }
    token = page.continue;
  } while (token);
  return out;
}

/** Informer settings the command line can change. */
export interface WatchSettings {
  /** Lower bound of the server-side watch timeout (randomised in [min, 2*min)). */
  minWatchTimeoutMs?: number;
}

export function createClusterCaches(
  kc: KubeConfig,
  nodeName: string,
  onChange: () => void,
  observer?: InformerObserver,
  settings: WatchSettings = {},
): ClusterCaches {
  const services = new Informer<ServiceInfo>(kc, {
    resource: 'services',
    path: '/api/v1/services',
    list: (rv, onItem) => streamList(kc, '/api/v1/services', {}, rv, onItem),
    watchList: true,
    strip: toServiceInfo,
    onChange,
    observer,
    minWatchTimeoutMs: settings.minWatchTimeoutMs,
  });
  const fieldSelector = `metadata.name=${nodeName}`;
  const node = new Informer<NodeInfo>(kc, {
    resource: 'nodes',
    path: '/api/v1/nodes',
    fieldSelector,
    list: (rv, onItem) => streamList(kc, '/api/v1/nodes', { fieldSelector }, rv, onItem),
    watchList: true,
    strip: toNodeInfo,
    onChange,
    observer,
    minWatchTimeoutMs: settings.minWatchTimeoutMs,
  });
  return { services, node };
}
