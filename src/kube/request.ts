// One HTTPS request to the API server with the credentials and TLS settings of a kubeconfig
// (client-node's applyToHTTPSOptions), the body as JSON. What the controller asks of the API
// server besides watches is a few fixed requests (list pages, Events): this keeps the generated
// API client, and the memory it costs, out of the process.

import http from 'node:http';
import https from 'node:https';
import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';

export interface ApiResponse {
  status: number;
  /** The body parsed as JSON; undefined when it is not JSON. */
  json: unknown;
}

export interface ApiRequest {
  method?: 'GET' | 'POST';
  query?: Record<string, string | undefined>;
  body?: unknown;
  timeoutMs?: number;
}

const DEFAULT_TIMEOUT_MS = 60_000;

// client-node's applyToHTTPSOptions makes a new agent, without keep-alive, on every call: each
// request opened a TLS connection of its own, a list of 10,000 Services (20 pages) twenty of them.
// These agents keep connections open between requests. An agent pools connections by the TLS
// settings of each request (CA, client certificate and key, server name, verification), which
// the request options carry, so rotated credentials get connections of their own.
const keepAliveAgents = {
  'https:': new https.Agent({ keepAlive: true }),
  'http:': new http.Agent({ keepAlive: true }),
};

/**
 * Request options for `url` with the credentials and TLS settings of the kubeconfig, on a
 * keep-alive agent; through a proxy (the cluster's proxy-url), on the proxy agent client-node made.
 */
export async function requestOptions(kc: KubeConfig, url: URL): Promise<https.RequestOptions> {
  const options: https.RequestOptions = { headers: {} };
  await kc.applyToHTTPSOptions(options);
  if (!kc.getCurrentCluster()?.proxyUrl) {
    options.agent = url.protocol === 'http:' ? keepAliveAgents['http:'] : keepAliveAgents['https:'];
  }
  return options;
}

export async function apiRequest(kc: KubeConfig, path: string, request: ApiRequest = {}): Promise<ApiResponse> {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new Error('the kubeconfig has no current cluster');
  const url = new URL(cluster.server.replace(/\/+$/, '') + path);
  for (const [key, value] of Object.entries(request.query ?? {})) {
    if (value !== undefined) url.searchParams.set(key, value);
  }
  const options = await requestOptions(kc, url);
  const payload = request.body === undefined ? undefined : Buffer.from(JSON.stringify(request.body));
  options.method = request.method ?? 'GET';
  options.headers = {
    ...options.headers,
    Accept: 'application/json',
    ...(payload ? { 'Content-Type': 'application/json', 'Content-Length': String(payload.length) } : {}),
  };
  const timeoutMs = request.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  options.timeout = timeoutMs;
  const client = url.protocol === 'http:' ? http : https;
  const { status, text } = await new Promise<{ status: number; text: string }>((resolve, reject) => {
    const req = client.request(url, options, (response) => {
      const chunks: Buffer[] = [];
      response.on('data', (chunk: Buffer) => chunks.push(chunk));
      response.on('end', () =>
        resolve({ status: response.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') }),
      );
      response.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`no answer from ${url.host} within ${timeoutMs / 1000} s`)));
    req.on('error', reject);
    req.end(payload);
  });
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status, json };
}

/** The message of a metav1.Status body, or the HTTP status. */
export function statusMessage(response: ApiResponse): string {
  const message = (response.json as { message?: unknown } | undefined)?.message;
  return typeof message === 'string' && message !== '' ? message : `HTTP ${response.status}`;
}
