// The two caches the controller reads: every Service, and this node's Node object.

import http from 'node:http';
import https from 'node:https';
import { KubeConfig } from '@kubernetes/client-node';
import type { NodeInfo, ServiceInfo } from '../model/types.js';
import { Informer, type InformerObserver } from './informer.js';
import { toNodeInfo, toServiceInfo } from './objects.js';

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
 * of a list. The request carries the same credentials and TLS settings (applyToHTTPSOptions).
 */
export async function listPageJson(
  kc: KubeConfig,
  path: string,
  query: Record<string, string | undefined>,
): Promise<ListPage> {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new Error('the kubeconfig has no current cluster');
  const url = new URL(cluster.server.replace(/\/+$/, '') + path);
  for (const [key, value] of Object.entries(query)) if (value !== undefined) url.searchParams.set(key, value);
  const options: https.RequestOptions = { headers: {} };
  await kc.applyToHTTPSOptions(options);
  options.headers = { ...options.headers, Accept: 'application/json' };
  options.timeout = LIST_TIMEOUT_MS;
  const { status, body } = await get(url, options);
  let parsed: { items?: unknown; metadata?: { resourceVersion?: unknown; continue?: unknown }; message?: unknown };
  try {
    parsed = JSON.parse(body) as typeof parsed;
  } catch {
    parsed = {};
  }
  if (status !== 200) {
    const message = typeof parsed.message === 'string' ? parsed.message : `HTTP ${status}`;
    // statusCode as client-node's errors carry it: ListWatch relists on 410.
    throw Object.assign(new Error(`listing ${path}: ${message}`), { statusCode: status });
  }
  const meta = parsed.metadata ?? {};
  return {
    items: Array.isArray(parsed.items) ? parsed.items : [],
    resourceVersion: typeof meta.resourceVersion === 'string' ? meta.resourceVersion : undefined,
    continue: typeof meta.continue === 'string' && meta.continue !== '' ? meta.continue : undefined,
  };
}

function get(url: URL, options: https.RequestOptions): Promise<{ status: number; body: string }> {
  const client = url.protocol === 'http:' ? http : https;
  return new Promise((resolve, reject) => {
    const request = client.get(url, options, (response) => {
      const chunks: Buffer[] = [];
      response.on('data', (chunk: Buffer) => chunks.push(chunk));
      response.on('end', () =>
        resolve({ status: response.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }),
      );
      response.on('error', reject);
    });
    request.on('timeout', () =>
      request.destroy(new Error(`no answer from ${url.host} within ${LIST_TIMEOUT_MS / 1000} s`)),
    );
    request.on('error', reject);
  });
}

export function createClusterCaches(
  kc: KubeConfig,
  nodeName: string,
  onChange: () => void,
  observer?: InformerObserver,
): ClusterCaches {
  const services = new Informer<ServiceInfo>(kc, {
    resource: 'services',
    path: '/api/v1/services',
    listPage: (token) => listPageJson(kc, '/api/v1/services', { limit: String(PAGE_SIZE), continue: token }),
    strip: toServiceInfo,
    onChange,
    observer,
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
  });
  return { services, node };
}
