// One HTTPS request to the API server with the credentials and TLS settings of a kubeconfig
// (client-node's applyToHTTPSOptions), the body as JSON. What the controller asks of the API
// server besides watches is a few fixed requests (list pages, Events): this keeps the generated
// API client, and the memory it costs, out of the process.

import http from 'node:http';
import https from 'node:https';
import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import { formatSize } from '../bytes.js';

export interface ApiResponse {
  status: number;
  /** The body parsed as JSON; undefined when it is not JSON. */
  json: unknown;
  /** Bytes of the body. */
  bytes: number;
}

export interface ApiRequest {
  method?: 'GET' | 'POST';
  query?: Record<string, string | undefined>;
  body?: unknown;
  timeoutMs?: number;
  /** The most bytes of body read; a longer one is a ResponseTooLargeError. Default MAX_RESPONSE_BYTES. */
  maxResponseBytes?: number;
}

const DEFAULT_TIMEOUT_MS = 60_000;
/** Most of an error response's body kept for its message (a metav1.Status is small). */
const MAX_ERROR_BODY_BYTES = 64 << 10;

/**
 * The most bytes of one response body (and of one watch line, watch.ts): what the largest object
 * the API server can hand out takes in JSON, with a margin. etcd refuses an object of more than
 * 1.5 MiB (--max-request-bytes); its JSON is longer than what etcd stores by at most the escaping
 * of its strings, where `<`, `>`, `&` and control characters take 6 bytes (`\u003c`): 1.5 MiB x 6
 * = 9 MiB. A list page is held to the same bound (cluster.ts shrinks a page of large objects),
 * so that one object always fits and nothing larger is ever read.
 *
 * Memory, at the bound: the chunks and their concatenation (32 MiB, briefly), the text and the
 * parsed objects (about twice the text for Service JSON): under 100 MiB for a moment, per
 * informer, against the pod's 512 MiB and the controller's 75 MiB at 10,000 Services.
 */
export const MAX_RESPONSE_BYTES = 16 << 20;

/** A response body longer than the bound: not read further, the connection is closed. */
export class ResponseTooLargeError extends Error {
  constructor(
    readonly path: string,
    readonly limitBytes: number,
  ) {
    super(`the response to ${path} is larger than ${formatSize(limitBytes)}, the most this controller reads`);
    this.name = 'ResponseTooLargeError';
  }
}

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

/** The URL of `path` on the current cluster's API server, with the query's defined values. */
function apiUrl(kc: KubeConfig, path: string, query: Record<string, string | undefined> = {}): URL {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new Error('the kubeconfig has no current cluster');
  const url = new URL(cluster.server.replace(/\/+$/, '') + path);
  for (const [key, value] of Object.entries(query)) {
    if (value !== undefined) url.searchParams.set(key, value);
  }
  return url;
}

export async function apiRequest(kc: KubeConfig, path: string, request: ApiRequest = {}): Promise<ApiResponse> {
  const url = apiUrl(kc, path, request.query);
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
  const maxBytes = request.maxResponseBytes ?? MAX_RESPONSE_BYTES;
  const { status, body } = await new Promise<{ status: number; body: Buffer }>((resolve, reject) => {
    const req = client.request(url, options, (response) => {
      const tooLarge = () => {
        req.destroy();
        reject(new ResponseTooLargeError(path, maxBytes));
      };
      // A body announced longer than the bound is not waited for.
      if (Number(response.headers['content-length']) > maxBytes) return tooLarge();
      const chunks: Buffer[] = [];
      let size = 0;
      response.on('data', (chunk: Buffer) => {
        size += chunk.length;
        if (size > maxBytes) return tooLarge();
        chunks.push(chunk);
      });
      response.on('end', () => {
        const body = Buffer.concat(chunks, size);
        chunks.length = 0;
        resolve({ status: response.statusCode ?? 0, body });
      });
      response.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`no answer from ${url.host} within ${timeoutMs / 1000} s`)));
    req.on('error', reject);
    req.end(payload);
  });
  const text = body.toString('utf8');
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status, json, bytes: body.length };
}

/** The message of a metav1.Status body, or the HTTP status. */
export function statusMessage(response: ApiResponse): string {
  const message = (response.json as { message?: unknown } | undefined)?.message;
  return typeof message === 'string' && message !== '' ? message : `HTTP ${response.status}`;
}

/**
 * A GET whose body, when the status is 200, is handed to `onChunk` as it arrives and not kept
 * (a list read item by item, list-stream.ts); an error thrown by `onChunk` ends the request and
 * is the rejection. Another status is answered as by apiRequest, its body bounded by
 * MAX_ERROR_BODY_BYTES. `bytes`: the body's length.
 */
export async function apiGetStream(
  kc: KubeConfig,
  path: string,
  request: { query?: Record<string, string | undefined>; timeoutMs?: number },
  onChunk: (chunk: Buffer) => void,
): Promise<{ status: number; bytes: number; error?: ApiResponse }> {
  const url = apiUrl(kc, path, request.query);
  const options = await requestOptions(kc, url);
  options.method = 'GET';
  options.headers = { ...options.headers, Accept: 'application/json' };
  const timeoutMs = request.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  options.timeout = timeoutMs;
  const client = url.protocol === 'http:' ? http : https;
  return new Promise((resolve, reject) => {
    const req = client.request(url, options, (response) => {
      const status = response.statusCode ?? 0;
      let bytes = 0;
      if (status !== 200) {
        const chunks: Buffer[] = [];
        response.on('data', (chunk: Buffer) => {
          bytes += chunk.length;
          if (bytes <= MAX_ERROR_BODY_BYTES) chunks.push(chunk);
        });
        response.on('end', () => {
          let json: unknown;
          try {
            json = JSON.parse(Buffer.concat(chunks).toString('utf8'));
          } catch {
            json = undefined;
          }
          resolve({ status, bytes, error: { status, json, bytes } });
        });
        response.on('error', reject);
        return;
      }
      response.on('data', (chunk: Buffer) => {
        bytes += chunk.length;
        try {
          onChunk(chunk);
        } catch (err) {
          req.destroy();
          reject(err instanceof Error ? err : new Error(String(err)));
        }
      });
      response.on('end', () => resolve({ status, bytes }));
      response.on('error', reject);
      // A connection closed in the middle of the body: 'close' without 'end'.
      response.on('close', () => {
        if (!response.complete) reject(new Error(`the connection to ${url.host} was closed before the list ended`));
      });
    });
    req.on('timeout', () => req.destroy(new Error(`no answer from ${url.host} within ${timeoutMs / 1000} s`)));
    req.on('error', reject);
    req.end();
  });
}
