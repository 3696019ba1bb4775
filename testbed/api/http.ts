// Request plumbing: the paths of the core/v1 API and of discovery, JSON bodies in and out, and
// the count of response bytes each client was sent.

import type { IncomingMessage, ServerResponse } from 'node:http';
import { ApiError, type KubeObject } from './errors.js';
import { RESOURCES, isPlainObject, resourceOfPlural, type Resource } from './resources.js';
import type { ClientReads } from './read-path.js';
import type { Selection } from './selectors.js';

export interface Route {
  resource: Resource;
  /** undefined: all namespaces (namespaced resource) or a cluster-scoped resource. */
  namespace?: string;
  name?: string;
  subresource?: 'status';
  /** Reached through the legacy /api/v1/watch/ prefix. */
  watchPath: boolean;
}

/** A list or watch request, parsed: what the list and watch servers are handed. */
export interface ReadRequest {
  req: IncomingMessage;
  res: ServerResponse;
  route: Route;
  selection: Selection;
  query: URLSearchParams;
  /** The reads of the client that asks. */
  reads: ClientReads;
}

export function parseRoute(path: string): Route | undefined {
  const parts = path.split('/').filter((p) => p !== '');
  if (parts[0] !== 'api' || parts[1] !== 'v1') return undefined;
  let rest = parts.slice(2);
  const watchPath = rest[0] === 'watch';
  if (watchPath) rest = rest.slice(1);
  let namespace: string | undefined;
  if (rest[0] === 'namespaces' && rest.length >= 3) {
    namespace = rest[1];
    rest = rest.slice(2);
  }
  const [plural, name, subresource, ...extra] = rest;
  const resource = plural === undefined ? undefined : resourceOfPlural(plural);
  if (!resource || extra.length > 0) return undefined;
  if (namespace !== undefined && !resource.namespaced) return undefined;
  if (subresource !== undefined && !(subresource === 'status' && resource.hasStatus)) return undefined;
  return { resource, namespace, name, subresource: subresource as 'status' | undefined, watchPath };
}

const SERVER_VERSION = {
  major: '1',
  minor: '34',
  gitVersion: 'v1.34.0-stand-in',
  gitCommit: '0000000000000000000000000000000000000000',
  gitTreeState: 'clean',
  buildDate: '2025-01-01T00:00:00Z',
  goVersion: 'go1.23.0',
  compiler: 'gc',
  platform: 'linux/amd64',
};

/** The discovery document at `path` (undefined: not a discovery path); `host` is the server's, `minor` its release's. */
export function discovery(path: string, host: string, minor: number): KubeObject | undefined {
  const trimmed = path.replace(/\/+$/, '') || '/';
  switch (trimmed) {
    case '/api':
      return {
        kind: 'APIVersions',
        versions: ['v1'],
        serverAddressByClientCIDRs: [{ clientCIDR: '0.0.0.0/0', serverAddress: host }],
      };
    case '/apis':
      return { kind: 'APIGroupList', apiVersion: 'v1', groups: [] };
    case '/api/v1':
      return {
        kind: 'APIResourceList',
        groupVersion: 'v1',
        resources: RESOURCES.flatMap((r) => {
          const main: KubeObject = {
            name: r.plural,
            singularName: r.singular,
            namespaced: r.namespaced,
            kind: r.kind,
            verbs: r.verbs,
            shortNames: r.shortNames,
          };
          if (r.categories) main.categories = r.categories;
          if (!r.hasStatus) return [main];
          return [
            main,
            {
              name: `${r.plural}/status`,
              singularName: '',
              namespaced: r.namespaced,
              kind: r.kind,
              verbs: ['get', 'patch', 'update'],
            },
          ];
        }),
      };
    case '/version':
      return { ...SERVER_VERSION, minor: String(minor), gitVersion: `v1.${minor}.0-stand-in` };
    default:
      return undefined;
  }
}

export function isDryRun(query: URLSearchParams): boolean {
  return query.getAll('dryRun').includes('All');
}

const MAX_BODY_BYTES = 3 * 1024 * 1024;

/** A request's JSON body: an object unless `anyJson`; `optional`: an empty body is {}. */
export async function readJsonBody(req: IncomingMessage, anyJson = false, optional = false): Promise<KubeObject> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) throw new ApiError(413, 'request entity too large');
    chunks.push(chunk as Buffer);
  }
  const text = Buffer.concat(chunks).toString('utf8');
  if (optional && text.trim() === '') return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new ApiError(400, `the body of the request could not be decoded as JSON: ${(err as Error).message}`);
  }
  if (!anyJson && !isPlainObject(parsed)) throw new ApiError(400, 'the body of the request must be a JSON object');
  return parsed as KubeObject;
}

/** What each response counts its bytes into: the reads of the client it answers. */
const RESPONSE_READS = new WeakMap<ServerResponse, ClientReads>();

export function chargeResponse(res: ServerResponse, reads: ClientReads): void {
  RESPONSE_READS.set(res, reads);
}

export function sendJson(res: ServerResponse, code: number, body: unknown): void {
  const text = JSON.stringify(body);
  const bytes = Buffer.byteLength(text);
  const reads = RESPONSE_READS.get(res);
  if (reads) reads.responseBytes += bytes;
  res.writeHead(code, { 'Content-Type': 'application/json', 'Content-Length': bytes });
  res.end(text);
}
