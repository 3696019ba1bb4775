// The two caches the controller reads: every Service, and this node's Node object.

// The one part of client-node the controller runs, imported from its module: the package's index
// would load all of client-node (its generated API, Watch, node-fetch, ...).
import { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import type { NodeInfo, ServiceInfo } from '../model/types.js';
import { Informer, type InformerObserver } from './informer.js';
import { toNodeInfo, toServiceInfo } from './objects.js';
import { apiRequest, statusMessage } from './request.js';

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

const PAGE_SIZE = 500;
const LIST_TIMEOUT_MS = 60_000;

type ListPage = { items: unknown[]; resourceVersion?: string; continue?: string };

/**
 * One page of a list as plain JSON. The typed list calls of client-node deserialize every field
 * of every object into model classes (dates included) before the informer strips them to the
 * few fields it keeps: with tens of thousands of Services that is most of the time and garbage
 * of a list.
 */
export async function listPageJson(
  kc: KubeConfig,
  path: string,
  query: Record<string, string | undefined>,
): Promise<ListPage> {
  const response = await apiRequest(kc, path, { query, timeoutMs: LIST_TIMEOUT_MS });
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
  };
}

/** Every item of a list, page by page, each stripped as its page arrives. */
export async function listAllJson<T>(
  kc: KubeConfig,
  path: string,
  query: Record<string, string | undefined>,
  strip: (raw: unknown) => T | undefined,
): Promise<T[]> {
  const out: T[] = [];
  let token: string | undefined;
  do {
    const page = await listPageJson(kc, path, { ...query, limit: String(PAGE_SIZE), continue: token });
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
    listPage: (token) => listPageJson(kc, '/api/v1/services', { limit: String(PAGE_SIZE), continue: token }),
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
    listPage: (token) =>
      listPageJson(kc, '/api/v1/nodes', { fieldSelector, limit: String(PAGE_SIZE), continue: token }),
    strip: toNodeInfo,
    onChange,
    observer,
    minWatchTimeoutMs: settings.minWatchTimeoutMs,
  });
  return { services, node };
}
