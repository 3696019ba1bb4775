// A small Kubernetes API server for tests, benchmarks and the demo.
//
// It speaks the wire protocol of the real kube-apiserver for the few core/v1 resources the
// controller uses (Services, Nodes, Events, Namespaces), so that the real
// @kubernetes/client-node and the real kubectl run against it end to end: HTTPS with a CA of
// its own, bearer tokens, discovery, JSON lists with a global resourceVersion and chunking,
// chunked watch streams with history replay, BOOKMARK events and 410 Gone, metav1.Status
// errors, and merge / strategic-merge / JSON patches. Tests drive it through apply/remove and
// can make it unavailable or forget its watch history.

import { execFile } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import https from 'node:https';
import { isIP, type AddressInfo, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isDeepStrictEqual, promisify } from 'node:util';
import YAML from 'yaml';

export interface ApiStandInOptions {
  /** Address to listen on; default 127.0.0.1. */
  host?: string;
  /** 0 picks an ephemeral port. */
  port?: number;
  /** Period of BOOKMARK events on watches that asked for them; default 1000. */
  bookmarkIntervalMs?: number;
  /** Number of change events kept for watch resumption; default 1000. */
  historyLimit?: number;
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

/** The releases whose read path the stand-in models (1.26: before WatchList existed). */
export type ModelledVersion = '1.26' | '1.27' | '1.28' | '1.29' | '1.30' | '1.31' | '1.32' | '1.33' | '1.34' | '1.35';

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

function newClientReads(): ClientReads {
  return {
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
}

/** The feature set of a modelled release. */
interface ReadPathFeatures {
  minor: number;
  /** Undefined before 1.27: the parameters are unknown to the server. */
  watchList: boolean | 'ignored' | undefined;
  consistentListFromCache: boolean;
  /** ListFromCacheSnapshot (beta, on from 1.34): continue tokens served from cache snapshots. */
  listFromCacheSnapshot: boolean;
}

function readPathFeatures(opts: ApiStandInOptions): ReadPathFeatures {
  const minor = Number((opts.serverVersion ?? '1.34').split('.')[1]);
  const defaultWatchList = minor < 27 ? undefined : minor === 32 || minor >= 34;
  return {
    minor,
    watchList: opts.watchList ?? defaultWatchList,
    consistentListFromCache: opts.consistentListFromCache ?? minor >= 31,
    listFromCacheSnapshot: minor >= 34,
  };
}

/** What a watch's replay writes before it waits for the connection to drain. */
const REPLAY_SLICE_BYTES = 256 << 10;

/** The annotation of the bookmark that ends a watch's initial state (metav1.InitialEventsAnnotationKey). */
const INITIAL_EVENTS_END_ANNOTATION = 'k8s.io/initial-events-end';

export type StoredKind = 'Service' | 'Node' | 'Event' | 'Namespace';

// Objects are plain JSON as on the wire; the stand-in never interprets more than it must.
type KubeObject = Record<string, any>;

type Verb = 'create' | 'delete' | 'get' | 'list' | 'patch' | 'update' | 'watch';

interface Resource {
  kind: StoredKind;
  plural: string;
  singular: string;
  namespaced: boolean;
  shortNames: string[];
  verbs: Verb[];
  /** Has a status subresource: writes to the main resource keep the stored status. */
  hasStatus: boolean;
  /** DELETE answers with the deleted object (as Services do) rather than a Status. */
  deleteReturnsObject: boolean;
  /** Fields a fieldSelector may name, as the real server allows them for this resource. */
  selectableFields: string[];
  categories?: string[];
}

const ALL_VERBS: Verb[] = ['create', 'delete', 'get', 'list', 'patch', 'update', 'watch'];

const RESOURCES: readonly Resource[] = [
  {
    kind: 'Service',
    plural: 'services',
    singular: 'service',
    namespaced: true,
    shortNames: ['svc'],
    verbs: ALL_VERBS,
    hasStatus: true,
    deleteReturnsObject: true,
    categories: ['all'],
    selectableFields: ['metadata.name', 'metadata.namespace'],
  },
  {
    kind: 'Node',
    plural: 'nodes',
    singular: 'node',
    namespaced: false,
    shortNames: ['no'],
    verbs: ALL_VERBS,
    hasStatus: true,
    deleteReturnsObject: false,
    selectableFields: ['metadata.name', 'spec.unschedulable'],
  },
  {
    kind: 'Event',
    plural: 'events',
    singular: 'event',
    namespaced: true,
    shortNames: ['ev'],
    verbs: ['create', 'get', 'list', 'watch'],
    hasStatus: false,
    deleteReturnsObject: false,
    selectableFields: [
      'metadata.name',
      'metadata.namespace',
      'involvedObject.kind',
      'involvedObject.namespace',
      'involvedObject.name',
      'involvedObject.uid',
      'involvedObject.apiVersion',
      'involvedObject.resourceVersion',
      'involvedObject.fieldPath',
      'reason',
      'reportingComponent',
      'source',
      'type',
    ],
  },
  {
    kind: 'Namespace',
    plural: 'namespaces',
    singular: 'namespace',
    namespaced: false,
    shortNames: ['ns'],
    verbs: ['create', 'get', 'list', 'watch'],
    hasStatus: false,
    deleteReturnsObject: false,
    selectableFields: ['metadata.name', 'status.phase'],
  },
];

const BY_PLURAL = new Map(RESOURCES.map((r) => [r.plural, r]));
const BY_KIND = new Map(RESOURCES.map((r) => [r.kind as string, r]));

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

const MAX_BODY_BYTES = 3 * 1024 * 1024;
/** What each response counts its bytes into. */
const RESPONSE_READS = new WeakMap<ServerResponse, ClientReads>();
const CONTINUE_SNAPSHOTS_KEPT = 32;

// ---------------------------------------------------------------------------------------------
// Errors: every failure leaves as a metav1.Status, as the real server answers.

const REASONS: Record<number, string> = {
  400: 'BadRequest',
  401: 'Unauthorized',
  404: 'NotFound',
  405: 'MethodNotAllowed',
  406: 'NotAcceptable',
  409: 'Conflict',
  410: 'Expired',
  413: 'RequestEntityTooLarge',
  415: 'UnsupportedMediaType',
  422: 'Invalid',
  500: 'InternalError',
  504: 'Timeout',
};

class ApiError extends Error {
  constructor(
    readonly code: number,
    message: string,
    readonly reason: string = REASONS[code] ?? 'Unknown',
    readonly details?: KubeObject,
  ) {
    super(message);
  }

  toStatus(): KubeObject {
    return failureStatus(this.code, this.reason, this.message, this.details);
  }
}

function failureStatus(code: number, reason: string, message: string, details?: KubeObject): KubeObject {
  const status: KubeObject = { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason };
  if (details) status.details = details;
  status.code = code;
  return status;
}

function notFound(resource: Resource, name: string): ApiError {
  return new ApiError(404, `${resource.plural} "${name}" not found`, 'NotFound', { name, kind: resource.plural });
}

/** A read asked for a resourceVersion the server has not seen yet (storage.NewTooLargeResourceVersionError). */
function tooLargeResourceVersion(rv: string, current: number): ApiError {
  return new ApiError(504, `Too large resource version: ${rv}, current: ${current}`, 'Timeout', {
    causes: [{ reason: 'ResourceVersionTooLarge', message: 'Too large resource version' }],
    retryAfterSeconds: 1,
  });
}

/** ListOptions that fail validation, worded as the real server words them. */
function invalidListOptions(errors: string[]): ApiError {
  const what = errors.length === 1 ? errors[0]! : `[${errors.join(', ')}]`;
  return new ApiError(422, `ListOptions.meta.k8s.io "" is invalid: ${what}`, 'Invalid', {
    group: 'meta.k8s.io',
    kind: 'ListOptions',
  });
}

function methodNotAllowed(): ApiError {
  return new ApiError(405, 'the server does not allow this method on the requested resource', 'MethodNotAllowed');
}

function conflict(resource: Resource, name: string, why: string): ApiError {
  return new ApiError(409, `Operation cannot be fulfilled on ${resource.plural} "${name}": ${why}`, 'Conflict', {
    name,
    kind: resource.plural,
  });
}

// ---------------------------------------------------------------------------------------------
// Serving certificate: a throw-away CA and a leaf for 127.0.0.1 / localhost (plus the host).

interface ServingCertificate {
  caPem: string;
  certPem: string;
  keyPem: string;
}

const run = promisify(execFile);

async function makeServingCertificate(host: string): Promise<ServingCertificate> {
  const dir = await mkdtemp(join(tmpdir(), 'api-stand-in-'));
  try {
    const names = new Set(['IP:127.0.0.1', 'IP:::1', 'DNS:localhost']);
    names.add(isIP(host) ? `IP:${host}` : `DNS:${host}`);
    const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
    await run('openssl', [
      'req',
      '-x509',
      ...ec,
      '-keyout',
      join(dir, 'ca.key'),
      '-out',
      join(dir, 'ca.crt'),
      '-days',
      '3650',
      '-subj',
      '/CN=api-stand-in-ca',
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign,cRLSign',
    ]);
    await run('openssl', [
      'req',
      ...ec,
      '-keyout',
      join(dir, 'server.key'),
      '-out',
      join(dir, 'server.csr'),
      '-subj',
      '/CN=localhost',
    ]);
    await writeFile(
      join(dir, 'server.ext'),
      [
        'basicConstraints=CA:FALSE',
        'keyUsage=critical,digitalSignature,keyEncipherment',
        'extendedKeyUsage=serverAuth',
        `subjectAltName=${[...names].join(',')}`,
        '',
      ].join('\n'),
    );
    await run('openssl', [
      'x509',
      '-req',
      '-in',
      join(dir, 'server.csr'),
      '-CA',
      join(dir, 'ca.crt'),
      '-CAkey',
      join(dir, 'ca.key'),
      '-CAcreateserial',
      '-out',
      join(dir, 'server.crt'),
      '-days',
      '3650',
      '-extfile',
      join(dir, 'server.ext'),
    ]);
    return {
      caPem: await readFile(join(dir, 'ca.crt'), 'utf8'),
      certPem: await readFile(join(dir, 'server.crt'), 'utf8'),
      keyPem: await readFile(join(dir, 'server.key'), 'utf8'),
    };
  } catch (err) {
    const stderr = (err as { stderr?: string }).stderr ?? '';
    throw new Error(`cannot create the API stand-in's certificate with openssl: ${stderr || String(err)}`);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------------------------------------
// Selectors: labelSelector (equality and set-based) and the field selectors the server supports.

type LabelRequirement =
  | { key: string; op: 'eq' | 'ne'; value: string }
  | { key: string; op: 'in' | 'notin'; values: string[] }
  | { key: string; op: 'exists' | 'notexists' };

interface FieldRequirement {
  field: string;
  equal: boolean;
  value: string;
}

interface Selection {
  labels: LabelRequirement[];
  fields: FieldRequirement[];
}

const LABEL_KEY = '[A-Za-z0-9][-A-Za-z0-9_./]*';

function splitTopLevel(s: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let current = '';
  for (const ch of s) {
    if (ch === '(') depth++;
    if (ch === ')') depth--;
    if (ch === ',' && depth === 0) {
      parts.push(current);
      current = '';
    } else {
      current += ch;
    }
  }
  parts.push(current);
  return parts.map((p) => p.trim()).filter((p) => p !== '');
}

function parseLabelSelector(selector: string): LabelRequirement[] {
  return splitTopLevel(selector).map((term): LabelRequirement => {
    let m = new RegExp(`^!\\s*(${LABEL_KEY})$`).exec(term);
    if (m) return { key: m[1]!, op: 'notexists' };
    m = new RegExp(`^(${LABEL_KEY})\\s+(in|notin)\\s*\\(([^)]*)\\)$`).exec(term);
    if (m) return { key: m[1]!, op: m[2] as 'in' | 'notin', values: m[3]!.split(',').map((v) => v.trim()) };
    m = new RegExp(`^(${LABEL_KEY})\\s*(==|=|!=)\\s*([-A-Za-z0-9_.]*)$`).exec(term);
    if (m) return { key: m[1]!, op: m[2] === '!=' ? 'ne' : 'eq', value: m[3]! };
    m = new RegExp(`^(${LABEL_KEY})$`).exec(term);
    if (m) return { key: m[1]!, op: 'exists' };
    throw new ApiError(400, `unable to parse requirement: found '${term}', expected a label selector term`);
  });
}

function parseFieldSelector(resource: Resource, selector: string): FieldRequirement[] {
  return splitTopLevel(selector).map((term) => {
    const m = /^([A-Za-z.]+)\s*(==|=|!=)\s*(.*)$/.exec(term);
    if (!m) throw new ApiError(400, `invalid selector: '${selector}'; can't understand '${term}'`);
    const field = m[1]!;
    if (!resource.selectableFields.includes(field)) throw new ApiError(400, `field label not supported: ${field}`);
    return { field, equal: m[2] !== '!=', value: m[3]! };
  });
}

function parseSelection(resource: Resource, query: URLSearchParams): Selection {
  return {
    labels: parseLabelSelector(query.get('labelSelector') ?? ''),
    fields: parseFieldSelector(resource, query.get('fieldSelector') ?? ''),
  };
}

/** A field's value as field selectors compare it: a string, '' when absent. */
function fieldValue(obj: KubeObject, field: string): string {
  if (field === 'source') return obj.source?.component ?? '';
  const value: unknown = field.split('.').reduce<unknown>((o, k) => (isPlainObject(o) ? o[k] : undefined), obj);
  if (value === undefined || value === null) return field === 'spec.unschedulable' ? 'false' : '';
  return String(value);
}

function selects(selection: Selection, obj: KubeObject): boolean {
  const labels: Record<string, string> = obj.metadata?.labels ?? {};
  for (const r of selection.labels) {
    const has = Object.hasOwn(labels, r.key);
    const value = labels[r.key];
    const ok =
      r.op === 'eq'
        ? has && value === r.value
        : r.op === 'ne'
          ? !has || value !== r.value
          : r.op === 'in'
            ? has && r.values.includes(value!)
            : r.op === 'notin'
              ? !has || !r.values.includes(value!)
              : r.op === 'exists'
                ? has
                : !has;
    if (!ok) return false;
  }
  for (const r of selection.fields) {
    if ((fieldValue(obj, r.field) === r.value) !== r.equal) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Patches.

function isPlainObject(v: unknown): v is KubeObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** RFC 7386 JSON merge patch. */
function mergePatch(target: unknown, patch: unknown): unknown {
  if (!isPlainObject(patch)) return structuredClone(patch);
  const result: KubeObject = isPlainObject(target) ? { ...target } : {};
  for (const [key, value] of Object.entries(patch)) {
    if (value === null) delete result[key];
    else result[key] = mergePatch(result[key], value);
  }
  return result;
}

// Merge keys of the lists in our resources that are patched by merging (patchStrategy: merge);
// every other list is atomic and replaced, as the real server does.
const STRATEGIC_MERGE_KEYS: Record<string, string> = {
  'spec.ports': 'port',
  'status.conditions': 'type',
  'status.addresses': 'type',
  'metadata.ownerReferences': 'uid',
};
const STRATEGIC_PRIMITIVE_SETS = new Set(['metadata.finalizers']);

/**
 * An approximation of a strategic merge patch good enough for kubectl apply on Services and
 * Nodes: honours the merge keys above, `$patch: replace|delete`, `$setElementOrder/…`,
 * `$deleteFromPrimitiveList/…` and `$retainKeys`.
 */
function strategicMergePatch(target: unknown, patch: unknown, path = ''): unknown {
  if (!isPlainObject(patch)) return structuredClone(patch);
  if (patch.$patch === 'delete') return undefined;
  const plain = Object.fromEntries(Object.entries(patch).filter(([k]) => !k.startsWith('$')));
  if (patch.$patch === 'replace') return structuredClone(plain);
  let result: KubeObject = isPlainObject(target) ? { ...target } : {};
  if (Array.isArray(patch.$retainKeys)) {
    const keep = new Set<string>(patch.$retainKeys);
    result = Object.fromEntries(Object.entries(result).filter(([k]) => keep.has(k)));
  }
  for (const [key, value] of Object.entries(plain)) {
    const childPath = path ? `${path}.${key}` : key;
    if (value === null) {
      delete result[key];
    } else if (Array.isArray(value)) {
      result[key] = mergeList(result[key], value, childPath);
    } else if (isPlainObject(value)) {
      const merged = strategicMergePatch(result[key], value, childPath);
      if (merged === undefined) delete result[key];
      else result[key] = merged;
    } else {
      result[key] = value;
    }
  }
  for (const [directive, value] of Object.entries(patch)) {
    const [name, key] = directive.split('/', 2);
    if (!key || !Array.isArray(value)) continue;
    if (name === '$deleteFromPrimitiveList' && Array.isArray(result[key])) {
      result[key] = result[key].filter((v: unknown) => !value.some((d) => isDeepStrictEqual(d, v)));
    } else if (name === '$setElementOrder' && Array.isArray(result[key])) {
      result[key] = orderList(result[key], value, STRATEGIC_MERGE_KEYS[path ? `${path}.${key}` : key]);
    }
  }
  return result;
}

function mergeList(current: unknown, patch: unknown[], path: string): unknown[] {
  const mergeKey = STRATEGIC_MERGE_KEYS[path];
  const strip = (items: unknown[]) => items.filter((i) => !(isPlainObject(i) && i.$patch !== undefined));
  if (patch.some((i) => isPlainObject(i) && i.$patch === 'replace')) return structuredClone(strip(patch));
  if (!Array.isArray(current)) return structuredClone(strip(patch));
  if (STRATEGIC_PRIMITIVE_SETS.has(path)) {
    return [...current, ...patch.filter((p) => !current.includes(p))];
  }
  if (!mergeKey) return structuredClone(strip(patch));
  const result = [...current];
  for (const item of patch) {
    if (!isPlainObject(item)) continue;
    const at = result.findIndex((c) => isPlainObject(c) && c[mergeKey] === item[mergeKey]);
    if (item.$patch === 'delete') {
      if (at >= 0) result.splice(at, 1);
    } else if (at >= 0) {
      result[at] = strategicMergePatch(result[at], item, path);
    } else {
      result.push(strategicMergePatch(undefined, item, path));
    }
  }
  return result;
}

function orderList(items: unknown[], order: unknown[], mergeKey: string | undefined): unknown[] {
  const keyOf = (v: unknown) => (mergeKey && isPlainObject(v) ? v[mergeKey] : v);
  const wanted = order.map(keyOf);
  const rank = (v: unknown) => {
    const i = wanted.findIndex((w) => isDeepStrictEqual(w, keyOf(v)));
    return i < 0 ? wanted.length : i;
  };
  return items
    .map((v, i) => ({ v, i }))
    .sort((a, b) => rank(a.v) - rank(b.v) || a.i - b.i)
    .map((x) => x.v);
}

/** RFC 6902 JSON patch. */
function jsonPatch(doc: unknown, ops: unknown): unknown {
  if (!Array.isArray(ops)) throw new ApiError(400, 'a JSON patch must be an array of operations');
  let root = structuredClone(doc);
  const tokens = (pointer: unknown): string[] => {
    if (typeof pointer !== 'string' || (pointer !== '' && !pointer.startsWith('/'))) {
      throw new ApiError(400, `invalid JSON pointer: ${String(pointer)}`);
    }
    return pointer === ''
      ? []
      : pointer
          .slice(1)
          .split('/')
          .map((t) => t.replace(/~1/g, '/').replace(/~0/g, '~'));
  };
  const parentOf = (path: string[]): { parent: KubeObject | unknown[]; key: string } => {
    let node: unknown = root;
    for (const t of path.slice(0, -1)) {
      node = Array.isArray(node) ? node[Number(t)] : isPlainObject(node) ? node[t] : undefined;
      if (node === undefined) throw new ApiError(422, `JSON patch path not found: /${path.join('/')}`);
    }
    if (!Array.isArray(node) && !isPlainObject(node)) {
      throw new ApiError(422, `JSON patch path not found: /${path.join('/')}`);
    }
    return { parent: node, key: path[path.length - 1]! };
  };
  const read = (path: string[]): unknown => {
    if (path.length === 0) return root;
    const { parent, key } = parentOf(path);
    const value = Array.isArray(parent) ? parent[Number(key)] : parent[key];
    if (value === undefined) throw new ApiError(422, `JSON patch path not found: /${path.join('/')}`);
    return value;
  };
  const add = (path: string[], value: unknown) => {
    if (path.length === 0) {
      root = value;
      return;
    }
    const { parent, key } = parentOf(path);
    if (Array.isArray(parent)) parent.splice(key === '-' ? parent.length : Number(key), 0, value);
    else parent[key] = value;
  };
  const remove = (path: string[]) => {
    read(path);
    const { parent, key } = parentOf(path);
    if (Array.isArray(parent)) parent.splice(Number(key), 1);
    else delete parent[key];
  };
  for (const op of ops as KubeObject[]) {
    const path = tokens(op.path);
    switch (op.op) {
      case 'add':
        add(path, structuredClone(op.value));
        break;
      case 'remove':
        remove(path);
        break;
      case 'replace':
        read(path);
        if (path.length > 0) remove(path);
        add(path, structuredClone(op.value));
        break;
      case 'move': {
        const from = tokens(op.from);
        const value = read(from);
        remove(from);
        add(path, value);
        break;
      }
      case 'copy':
        add(path, structuredClone(read(tokens(op.from))));
        break;
      case 'test':
        if (!isDeepStrictEqual(read(path), op.value)) {
          throw new ApiError(422, `JSON patch test operation failed at ${op.path}`);
        }
        break;
      default:
        throw new ApiError(400, `unknown JSON patch operation: ${String(op.op)}`);
    }
  }
  return root;
}

// ---------------------------------------------------------------------------------------------
// kubectl asks for server-side printing (meta.k8s.io Table); these are the columns of the real server.

interface Column {
  name: string;
  type: 'string' | 'integer';
  format?: string;
  priority?: number;
  description: string;
  cell: (obj: KubeObject, now: number) => string | number;
}

function age(obj: KubeObject, now: number): string {
  const created = Date.parse(obj.metadata?.creationTimestamp ?? '');
  if (Number.isNaN(created)) return '<unknown>';
  const s = Math.max(0, Math.floor((now - created) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 48 * 3600) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

const NAME_COLUMN: Column = {
  name: 'Name',
  type: 'string',
  format: 'name',
  description: 'Name of the object',
  cell: (o) => o.metadata?.name ?? '',
};
const AGE_COLUMN: Column = {
  name: 'Age',
  type: 'string',
  description: 'Time since creation',
  cell: age,
};

function serviceExternalIPs(svc: KubeObject): string {
  const ips: string[] = [...(svc.spec?.externalIPs ?? [])];
  if (svc.spec?.type === 'LoadBalancer') {
    for (const ingress of svc.status?.loadBalancer?.ingress ?? []) {
      if (ingress.ip) ips.push(ingress.ip);
      else if (ingress.hostname) ips.push(ingress.hostname);
    }
    if (ips.length === 0) return '<pending>';
  }
  if (svc.spec?.type === 'ExternalName') return svc.spec.externalName ?? '<none>';
  return ips.length > 0 ? ips.join(',') : '<none>';
}

function nodeStatus(node: KubeObject): string {
  const ready = (node.status?.conditions ?? []).find((c: KubeObject) => c.type === 'Ready');
  const status = !ready ? 'Unknown' : ready.status === 'True' ? 'Ready' : 'NotReady';
  return node.spec?.unschedulable ? `${status},SchedulingDisabled` : status;
}

function nodeAddress(node: KubeObject, type: string): string {
  return (node.status?.addresses ?? []).find((a: KubeObject) => a.type === type)?.address ?? '<none>';
}

const TABLE_COLUMNS: Record<StoredKind, Column[]> = {
  Service: [
    NAME_COLUMN,
    { name: 'Type', type: 'string', description: 'Service type', cell: (s) => s.spec?.type ?? 'ClusterIP' },
    {
      name: 'Cluster-IP',
      type: 'string',
      description: 'Cluster IP',
      cell: (s) => (s.spec?.type === 'ExternalName' ? '<none>' : s.spec?.clusterIP || '<none>'),
    },
    { name: 'External-IP', type: 'string', description: 'External IPs', cell: serviceExternalIPs },
    {
      name: 'Port(s)',
      type: 'string',
      description: 'Service ports',
      cell: (s) =>
        (s.spec?.ports ?? [])
          .map((p: KubeObject) => `${p.port}${p.nodePort ? `:${p.nodePort}` : ''}/${p.protocol ?? 'TCP'}`)
          .join(',') || '<none>',
    },
    AGE_COLUMN,
    {
      name: 'Selector',
      type: 'string',
      priority: 1,
      description: 'Pod selector',
      cell: (s) =>
        Object.entries(s.spec?.selector ?? {})
          .map(([k, v]) => `${k}=${String(v)}`)
          .join(',') || '<none>',
    },
  ],
  Node: [
    NAME_COLUMN,
    { name: 'Status', type: 'string', description: 'Readiness', cell: nodeStatus },
    {
      name: 'Roles',
      type: 'string',
      description: 'Node roles',
      cell: (n) =>
        Object.keys(n.metadata?.labels ?? {})
          .filter((l) => l.startsWith('node-role.kubernetes.io/'))
          .map((l) => l.slice('node-role.kubernetes.io/'.length))
          .join(',') || '<none>',
    },
    AGE_COLUMN,
    {
      name: 'Version',
      type: 'string',
      description: 'Kubelet version',
      cell: (n) => n.status?.nodeInfo?.kubeletVersion ?? '',
    },
    {
      name: 'Internal-IP',
      type: 'string',
      priority: 1,
      description: 'Internal address',
      cell: (n) => nodeAddress(n, 'InternalIP'),
    },
    {
      name: 'External-IP',
      type: 'string',
      priority: 1,
      description: 'External address',
      cell: (n) => nodeAddress(n, 'ExternalIP'),
    },
  ],
  Event: [
    NAME_COLUMN,
    { name: 'Type', type: 'string', description: 'Event type', cell: (e) => e.type ?? '' },
    { name: 'Reason', type: 'string', description: 'Reason', cell: (e) => e.reason ?? '' },
    {
      name: 'Object',
      type: 'string',
      description: 'Involved object',
      cell: (e) => `${(e.involvedObject?.kind ?? '').toLowerCase()}/${e.involvedObject?.name ?? ''}`,
    },
    { name: 'Message', type: 'string', description: 'Message', cell: (e) => e.message ?? '' },
  ],
  Namespace: [
    NAME_COLUMN,
    { name: 'Status', type: 'string', description: 'Phase', cell: (n) => n.status?.phase ?? 'Active' },
    AGE_COLUMN,
  ],
};

function toTable(resource: Resource, items: KubeObject[], listMeta: KubeObject, includeObject: string): KubeObject {
  const columns = TABLE_COLUMNS[resource.kind];
  const now = Date.now();
  return {
    kind: 'Table',
    apiVersion: 'meta.k8s.io/v1',
    metadata: listMeta,
    columnDefinitions: columns.map((c) => ({
      name: c.name,
      type: c.type,
      format: c.format ?? '',
      description: c.description,
      priority: c.priority ?? 0,
    })),
    rows: items.map((obj) => ({
      cells: columns.map((c) => c.cell(obj, now)),
      object:
        includeObject === 'None'
          ? undefined
          : includeObject === 'Object'
            ? withTypeMeta(resource, obj)
            : { kind: 'PartialObjectMetadata', apiVersion: 'meta.k8s.io/v1', metadata: obj.metadata },
    })),
  };
}

function wantsTable(req: IncomingMessage): boolean {
  return /as=Table/.test(req.headers.accept ?? '');
}

// ---------------------------------------------------------------------------------------------
// The store: objects by resource, a global resourceVersion, and the change history that
// watches replay.

type ChangeType = 'ADDED' | 'MODIFIED' | 'DELETED';

interface Change {
  rv: number;
  resource: Resource;
  type: ChangeType;
  object: KubeObject;
  /** The object before a MODIFIED change, so filtered watches see objects enter and leave. */
  previous?: KubeObject;
}

interface Watcher {
  resource: Resource;
  namespace: string | undefined;
  selection: Selection;
  send(type: ChangeType, object: KubeObject): void;
}

function objectKey(namespace: string | undefined, name: string): string {
  return `${namespace ?? ''}/${name}`;
}

function withTypeMeta(resource: Resource, obj: KubeObject): KubeObject {
  const { kind: _kind, apiVersion: _apiVersion, ...rest } = obj;
  return { kind: resource.kind, apiVersion: 'v1', ...rest };
}

function rfc3339(date: Date): string {
  return date.toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/** What a watch sees of a change through its namespace and selectors; undefined when nothing. */
function visibleChange(change: Change, watcher: Watcher): ChangeType | undefined {
  if (change.resource !== watcher.resource) return undefined;
  const inScope = (o: KubeObject | undefined) =>
    o !== undefined &&
    (watcher.namespace === undefined || o.metadata?.namespace === watcher.namespace) &&
    selects(watcher.selection, o);
  const now = change.type !== 'DELETED' && inScope(change.object);
  const before = change.type === 'DELETED' ? inScope(change.object) : inScope(change.previous);
  if (now && before) return 'MODIFIED';
  if (now) return 'ADDED';
  if (before) return 'DELETED';
  return undefined;
}

class ObjectStore {
  private rv = 0;
  /** Watches from a resourceVersion below this one cannot be replayed: 410 Gone. */
  private oldestResumableRv = 0;
  private history: Change[] = [];
  private readonly objects = new Map(RESOURCES.map((r) => [r, new Map<string, KubeObject>()] as const));
  private readonly watchers = new Set<Watcher>();

  constructor(private readonly historyLimit: number) {}

  get resourceVersion(): number {
    return this.rv;
  }

  get(resource: Resource, namespace: string | undefined, name: string): KubeObject | undefined {
    return this.objects.get(resource)!.get(objectKey(resource.namespaced ? namespace : undefined, name));
  }

  /** Objects sorted by namespace/name, as etcd returns them. */
  list(resource: Resource): KubeObject[] {
    return [...this.objects.get(resource)!.entries()]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([, o]) => o);
  }

  /** Stores obj (metadata complete but resourceVersion) as new or replacing the current one. */
  put(resource: Resource, obj: KubeObject): KubeObject {
    const key = objectKey(obj.metadata.namespace, obj.metadata.name);
    const previous = this.objects.get(resource)!.get(key);
    const stored = structuredClone(obj);
    stored.metadata.resourceVersion = String(++this.rv);
    this.objects.get(resource)!.set(key, stored);
    this.record({ rv: this.rv, resource, type: previous ? 'MODIFIED' : 'ADDED', object: stored, previous });
    return stored;
  }

  delete(resource: Resource, namespace: string | undefined, name: string): KubeObject | undefined {
    const key = objectKey(resource.namespaced ? namespace : undefined, name);
    const current = this.objects.get(resource)!.get(key);
    if (!current) return undefined;
    this.objects.get(resource)!.delete(key);
    // The DELETED event carries the object at the resourceVersion of its deletion.
    const last = structuredClone(current);
    last.metadata.resourceVersion = String(++this.rv);
    this.record({ rv: this.rv, resource, type: 'DELETED', object: last });
    return last;
  }

  /** Changes of resource after rv, or undefined when history no longer reaches back that far. */
  changesSince(resource: Resource, rv: number): Change[] | undefined {
    if (rv < this.oldestResumableRv) return undefined;
    return this.history.filter((c) => c.rv > rv && c.resource === resource);
  }

  get oldestResumable(): number {
    return this.oldestResumableRv;
  }

  /**
   * Forgets all history, as after an etcd compaction. The resourceVersion moves on by one,
   * as it would through writes to other resources, so every version a client has seen so far
   * is now too old to resume from.
   */
  expireHistory(): void {
    this.rv++;
    this.history = [];
    this.oldestResumableRv = this.rv;
  }

  subscribe(watcher: Watcher): () => void {
    this.watchers.add(watcher);
    return () => this.watchers.delete(watcher);
  }

  private record(change: Change): void {
    this.history.push(change);
    while (this.history.length > this.historyLimit) {
      this.oldestResumableRv = this.history.shift()!.rv;
    }
    for (const watcher of this.watchers) {
      const type = visibleChange(change, watcher);
      if (type) watcher.send(type, withTypeMeta(change.resource, change.object));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The server.

interface Route {
  resource: Resource;
  /** undefined: all namespaces (namespaced resource) or a cluster-scoped resource. */
  namespace?: string;
  name?: string;
  subresource?: 'status';
  /** Reached through the legacy /api/v1/watch/ prefix. */
  watchPath: boolean;
}

interface ListSnapshot {
  rv: number;
  items: KubeObject[];
}

interface OpenWatch {
  res: ServerResponse;
  resource: Resource;
  close(): void;
  /** Writes one line as it is, newline added. */
  writeLine(line: string): void;
  /** Delivers nothing more (events, bookmarks, the end at its timeout) and stays open. */
  silence(): void;
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
  private readonly sockets = new Set<Socket>();
  private readonly openWatches = new Set<OpenWatch>();
  private readonly snapshots = new Map<string, ListSnapshot>();
  private readonly token = 'stand-in-' + randomBytes(8).toString('hex');
  private unavailable = false;
  private nextClusterIp = 10;
  private readonly reads = new Map<string, ClientReads>();
  /**
   * The next WatchList stream ends after so many of its initial events: with an ERROR of this
   * code, or cleanly ('end').
   */
  private watchListBreak: { afterEvents: number; code: number | 'end' } | undefined;
  /** The next list response is cut (its connection reset) after so many of its items. */
  private listBreak: { afterItems: number } | undefined;
  /**
   * The watch cache that new requests reach is behind, at `rv` (lagWatchCache()): the objects
   * it holds, and the watches it parked until it catches up.
   */
  private lag: { rv: number; objects: Map<Resource, KubeObject[]>; parked: Array<() => void> } | undefined;

  private constructor(
    private readonly server: https.Server,
    cert: ServingCertificate,
    url: string,
    private readonly bookmarkIntervalMs: number,
    historyLimit: number,
    private readonly features: ReadPathFeatures,
  ) {
    this.url = url;
    this.caPem = cert.caPem;
    this.store = new ObjectStore(historyLimit);
    for (const name of ['default', 'kube-system']) this.ensureNamespace(name);
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
    const standIn = new ApiStandIn(
      server,
      cert,
      url,
      opts.bookmarkIntervalMs ?? 1000,
      opts.historyLimit ?? 1000,
      readPathFeatures(opts),
    );
    standIn.listen();
    return standIn;
  }

  /**
   * A kubeconfig for this server. `client` names the client in readsByClient() (its bearer
   * token carries the name); default 'default'.
   */
  kubeconfig(client?: string): string {
    const token = client === undefined ? this.token : `${this.token}.${client}`;
    return YAML.stringify({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [
        {
          name: 'stand-in',
          cluster: { server: this.url, 'certificate-authority-data': Buffer.from(this.caPem).toString('base64') },
        },
      ],
      users: [{ name: 'stand-in', user: { token } }],
      contexts: [{ name: 'stand-in', context: { cluster: 'stand-in', user: 'stand-in', namespace: 'default' } }],
      'current-context': 'stand-in',
    });
  }

  async writeKubeconfig(path: string, client?: string): Promise<void> {
    await writeFile(path, this.kubeconfig(client), { mode: 0o600 });
  }

  /** What each client has cost so far (a copy), by client name (see kubeconfig()). */
  readsByClient(): Record<string, ClientReads> {
    return Object.fromEntries([...this.reads].map(([client, reads]) => [client, { ...reads }]));
  }

  /** Forgets the counts of readsByClient(). */
  resetReads(): void {
    this.reads.clear();
  }

  /**
   * The next WatchList stream (a watch with sendInitialEvents=true) sends `afterEvents` of its
   * initial events, then an ERROR event with `code` (410: as if its resourceVersion had been
   * compacted meanwhile), and ends.
   */
  breakNextWatchList(afterEvents: number, code: number | 'end' = 410): void {
    this.watchListBreak = { afterEvents, code };
  }

  /**
   * The next list response (a page, for a paginated list) sends `afterItems` of its items, then
   * its connection is reset in the middle of the body, as when the API server or a proxy in
   * front of it goes away while a list is being read.
   */
  breakNextList(afterItems: number): void {
    this.listBreak = { afterItems };
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
    if (this.lag) return;
    const objects = new Map(RESOURCES.map((r) => [r, this.store.list(r).map((o) => structuredClone(o))] as const));
    this.lag = { rv: this.store.resourceVersion, objects, parked: [] };
  }

  /** The watch cache is up to date again: the watches it parked get what they missed and go on. */
  catchUpWatchCache(): void {
    const lag = this.lag;
    this.lag = undefined;
    for (const resume of lag?.parked ?? []) resume();
  }

  private readsOf(req: IncomingMessage): ClientReads {
    const token = /^Bearer\s+(.*)$/i.exec(req.headers.authorization ?? '')?.[1] ?? '';
    const client = token.startsWith(`${this.token}.`) ? token.slice(this.token.length + 1) : 'default';
    let reads = this.reads.get(client);
    if (!reads) this.reads.set(client, (reads = newClientReads()));
    return reads;
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
    if (existing) return structuredClone(this.update(resource, existing, incoming, { keepCreation: false }));
    return structuredClone(this.create(resource, incoming, { defaults: false }));
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
    const resource = resourceOfKind(kind);
    let n = 0;
    for (const watch of this.openWatches) {
      if (watch.resource !== resource) continue;
      watch.writeLine(line);
      n++;
    }
    return n;
  }

  /**
   * Makes every watch of `kind` open now a half-open connection, as a NAT or load balancer that
   * dropped its state leaves it: it stays open but delivers nothing more (no event, no bookmark,
   * not even its end at timeoutSeconds). Watches started afterwards work. Returns their number.
   */
  silenceOpenWatches(kind: StoredKind): number {
    const resource = resourceOfKind(kind);
    let n = 0;
    for (const watch of this.openWatches) {
      if (watch.resource !== resource) continue;
      watch.silence();
      n++;
    }
    return n;
  }

  /** Open watch streams of `kind`. */
  openWatchCount(kind: StoredKind): number {
    const resource = resourceOfKind(kind);
    return [...this.openWatches].filter((w) => w.resource === resource).length;
  }

  /**
   * Forgets the watch history (and open list snapshots): resuming a watch from any
   * resourceVersion seen so far gets 410 Gone; a new list works and can be watched from.
   */
  expireHistory(): void {
    this.store.expireHistory();
    this.snapshots.clear();
  }

  async stop(): Promise<void> {
    for (const watch of this.openWatches) watch.close();
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const socket of this.sockets) socket.destroy();
    this.server.closeAllConnections();
    await closed;
  }

  // --- writes shared by apply() and the HTTP verbs ---------------------------------------------

  private create(resource: Resource, incoming: KubeObject, opts: { defaults: boolean }): KubeObject {
    if (resource.namespaced) this.ensureNamespace(incoming.metadata.namespace);
    const obj = structuredClone(incoming);
    const meta = obj.metadata;
    meta.uid ??= randomUUID();
    meta.creationTimestamp ??= rfc3339(new Date());
    meta.generation = 1;
    delete meta.resourceVersion;
    delete meta.deletionTimestamp;
    if (opts.defaults && resource.kind === 'Service') this.defaultService(obj, undefined);
    if (opts.defaults && resource.kind === 'Namespace') defaultNamespace(obj);
    return this.store.put(resource, obj);
  }

  /** keepCreation: uid and creationTimestamp stay those of the stored object (HTTP writes). */
  private update(
    resource: Resource,
    existing: KubeObject,
    incoming: KubeObject,
    opts: { keepCreation: boolean },
  ): KubeObject {
    const obj = structuredClone(incoming);
    const meta = obj.metadata;
    meta.uid = existing.metadata.uid;
    if (opts.keepCreation || !meta.creationTimestamp) meta.creationTimestamp = existing.metadata.creationTimestamp;
    const specChanged = !isDeepStrictEqual(obj.spec, existing.spec);
    meta.generation = (existing.metadata.generation ?? 1) + (specChanged ? 1 : 0);
    meta.resourceVersion = existing.metadata.resourceVersion;
    if (isDeepStrictEqual(obj, existing)) return existing;
    return this.store.put(resource, obj);
  }

  private ensureNamespace(name: string): void {
    const namespaces = resourceOfKind('Namespace');
    if (this.store.get(namespaces, undefined, name)) return;
    this.create(namespaces, { apiVersion: 'v1', kind: 'Namespace', metadata: { name } }, { defaults: true });
  }

  /** What the real server fills in on a new Service; a replace keeps the allocated ClusterIP. */
  private defaultService(svc: KubeObject, existing: KubeObject | undefined): void {
    const spec = (svc.spec ??= {});
    spec.type ??= 'ClusterIP';
    if (spec.type !== 'ExternalName') {
      if (!spec.clusterIP && existing?.spec?.clusterIP) {
        spec.clusterIP = existing.spec.clusterIP;
        spec.clusterIPs ??= existing.spec.clusterIPs;
      }
      if (!spec.clusterIP) spec.clusterIP = this.allocateClusterIp();
      spec.clusterIPs ??= [spec.clusterIP];
      if (spec.clusterIP !== 'None') {
        spec.ipFamilies ??= spec.clusterIPs.map((ip: string) => (isIP(ip) === 6 ? 'IPv6' : 'IPv4'));
      }
      spec.ipFamilyPolicy ??= spec.clusterIPs.length > 1 ? 'PreferDualStack' : 'SingleStack';
      spec.sessionAffinity ??= 'None';
      spec.internalTrafficPolicy ??= 'Cluster';
    }
    for (const port of spec.ports ?? []) {
      port.protocol ??= 'TCP';
      port.targetPort ??= port.port;
    }
    svc.status ??= { loadBalancer: {} };
  }

  private allocateClusterIp(): string {
    const inUse = new Set(this.store.list(resourceOfKind('Service')).map((s) => s.spec?.clusterIP));
    for (;;) {
      const n = this.nextClusterIp++;
      const ip = `10.96.${(n >> 8) & 255}.${n & 255}`;
      if (!inUse.has(ip)) return ip;
    }
  }

  // --- connections ------------------------------------------------------------------------------

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

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    this.stats.requests++;
    if (!req.headers.authorization) throw new ApiError(401, 'Unauthorized');
    const reads = this.readsOf(req);
    reads.requests++;
    RESPONSE_READS.set(res, reads);
    const url = new URL(req.url ?? '/', 'https://stand-in');
    const method = req.method ?? 'GET';
    if (url.pathname === '/debug/reads' && method === 'GET') {
      sendJson(res, 200, this.readsByClient());
      return;
    }
    const discovery = this.discovery(url.pathname);
    if (discovery !== undefined) {
      if (method !== 'GET') throw methodNotAllowed();
      sendJson(res, 200, discovery);
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
      const selection = parseSelection(resource, query);
      if (name !== undefined) selection.fields.push({ field: 'metadata.name', equal: true, value: name });
      if (watch) this.serveWatch(req, res, route, selection, query);
      else this.serveList(req, res, route, selection, query);
      return;
    }
    if (name === undefined) {
      if (method !== 'POST') throw methodNotAllowed();
      verbAllowed('create');
      if (resource.namespaced && route.namespace === undefined) throw methodNotAllowed();
      await this.serveCreate(req, res, route, query);
      return;
    }
    switch (method) {
      case 'GET': {
        verbAllowed('get');
        const obj = this.mustGet(route);
        if (wantsTable(req)) {
          sendJson(res, 200, toTable(resource, [obj], {}, query.get('includeObject') ?? 'Metadata'));
        } else {
          sendJson(res, 200, withTypeMeta(resource, obj));
        }
        return;
      }
      case 'PUT':
        verbAllowed('update');
        await this.serveReplace(req, res, route, query);
        return;
      case 'PATCH':
        verbAllowed('patch');
        await this.servePatch(req, res, route, query);
        return;
      case 'DELETE':
        verbAllowed('delete');
        if (subresource) throw methodNotAllowed();
        await this.serveDelete(req, res, route, query);
        return;
      default:
        throw methodNotAllowed();
    }
  }

  private discovery(path: string): KubeObject | undefined {
    const trimmed = path.replace(/\/+$/, '') || '/';
    switch (trimmed) {
      case '/api':
        return {
          kind: 'APIVersions',
          versions: ['v1'],
          serverAddressByClientCIDRs: [{ clientCIDR: '0.0.0.0/0', serverAddress: new URL(this.url).host }],
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
      case '/version': {
        const minor = String(this.features.minor);
        return { ...SERVER_VERSION, minor, gitVersion: `v1.${minor}.0-stand-in` };
      }
      default:
        return undefined;
    }
  }

  private mustGet(route: Route): KubeObject {
    const obj = this.store.get(route.resource, route.namespace, route.name!);
    if (!obj) throw notFound(route.resource, route.name!);
    return obj;
  }

  private serveList(
    req: IncomingMessage,
    res: ServerResponse,
    route: Route,
    selection: Selection,
    query: URLSearchParams,
  ): void {
    const { resource } = route;
    this.stats.lists[resource.plural] = (this.stats.lists[resource.plural] ?? 0) + 1;
    const reads = RESPONSE_READS.get(res)!;
    reads.lists++;
    const limit = Number(query.get('limit') ?? 0);
    if (!Number.isInteger(limit) || limit < 0) throw new ApiError(400, `invalid limit: ${query.get('limit')}`);
    const cont = query.get('continue') ?? '';
    const rv = query.get('resourceVersion') ?? '';
    const match = query.get('resourceVersionMatch') ?? '';
    if (rv !== '' && !/^\d+$/.test(rv)) {
      throw new ApiError(400, `resourceVersion: Invalid value: "${rv}": must be a non-negative integer`);
    }
    if (match !== '') {
      const errors: string[] = [];
      if (match !== 'Exact' && match !== 'NotOlderThan') {
        errors.push(
          `resourceVersionMatch: Unsupported value: "${match}": supported values: "Exact", "NotOlderThan", ""`,
        );
      }
      if (rv === '')
        errors.push(
          'resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided',
        );
      if (cont !== '')
        errors.push('resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided');
      if (match === 'Exact' && rv === '0') {
        errors.push(
          'resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
        );
      }
      if (errors.length > 0) throw invalidListOptions(errors);
    }
    if (cont !== '' && rv !== '' && rv !== '0') {
      throw new ApiError(400, 'specifying resource version is not allowed when using continue');
    }
    const lag = this.lag;
    const cacheVersion = lag?.rv ?? this.store.resourceVersion;
    if (rv !== '' && rv !== '0' && match !== 'Exact' && Number(rv) > cacheVersion) {
      throw tooLargeResourceVersion(rv, cacheVersion);
    }
    let path = this.listReadPath(rv, match, limit, cont !== '');
    // A consistent read that a lagging cache cannot serve falls back to etcd.
    if (lag && rv === '' && path.fromCache) path = { fromCache: false, revisionProbe: true };
    const fromLaggingCache = lag !== undefined && path.fromCache && cont === '';
    // The watch cache ignores limit for resourceVersion=0 (cacher's computeListLimit): the whole list.
    const pageLimit = path.fromCache && rv === '0' ? 0 : limit;
    let snapshot: ListSnapshot;
    let offset = 0;
    if (cont) {
      ({ snapshot, offset } = this.resolveContinue(cont));
    } else {
      snapshot = {
        rv: fromLaggingCache ? lag.rv : this.store.resourceVersion,
        items: (fromLaggingCache ? lag.objects.get(resource)! : this.store.list(resource))
          .filter((o) => route.namespace === undefined || o.metadata.namespace === route.namespace)
          .filter((o) => selects(selection, o)),
      };
    }
    const end = pageLimit > 0 ? Math.min(offset + pageLimit, snapshot.items.length) : snapshot.items.length;
    const page = snapshot.items.slice(offset, end);
    reads.objects += page.length;
    if (path.revisionProbe) reads.etcdRevisionReads++;
    if (!path.fromCache) {
      reads.etcdListReads++;
      reads.etcdObjects += page.length;
    }
    const listMeta: KubeObject = { resourceVersion: String(snapshot.rv) };
    if (end < snapshot.items.length) {
      listMeta.continue = this.continueToken(snapshot, end);
      listMeta.remainingItemCount = snapshot.items.length - end;
    }
    if (wantsTable(req)) {
      sendJson(res, 200, toTable(resource, page, listMeta, query.get('includeObject') ?? 'Metadata'));
      return;
    }
    // The real server leaves kind and apiVersion out of list items.
    const items = page.map((o) => {
      const { kind: _kind, apiVersion: _apiVersion, ...rest } = o;
      return rest;
    });
    const cut = this.listBreak;
    if (cut) {
      this.listBreak = undefined;
      // The beginning of the body, as far as the cut, then the connection goes away.
      const head = JSON.stringify({ kind: `${resource.kind}List`, apiVersion: 'v1', metadata: listMeta, items: [] });
      const sent = items.slice(0, cut.afterItems).map((o) => JSON.stringify(o) + ',');
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.write(head.slice(0, -2) + sent.join(''), () => res.socket?.destroy());
      return;
    }
    sendJson(res, 200, { kind: `${resource.kind}List`, apiVersion: 'v1', metadata: listMeta, items });
  }

  /**
   * Where the modelled server reads a list from: its watch cache, or etcd (the cacher's
   * shouldDelegateList of the release). A consistent read served from the cache first reads
   * etcd's current revision (revisionProbe).
   */
  private listReadPath(
    rv: string,
    match: string,
    limit: number,
    continued: boolean,
  ): { fromCache: boolean; revisionProbe: boolean } {
    const f = this.features;
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
  private initialEventsOf(query: URLSearchParams, rv: string): boolean | undefined {
    const f = this.features;
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

  private continueToken(snapshot: ListSnapshot, offset: number): string {
    let id = [...this.snapshots.entries()].find(([, s]) => s === snapshot)?.[0];
    if (!id) {
      id = randomBytes(6).toString('hex');
      this.snapshots.set(id, snapshot);
      while (this.snapshots.size > CONTINUE_SNAPSHOTS_KEPT) this.snapshots.delete(this.snapshots.keys().next().value!);
    }
    return Buffer.from(JSON.stringify({ v: 'meta.k8s.io/v1', rv: snapshot.rv, id, offset })).toString('base64url');
  }

  private resolveContinue(token: string): { snapshot: ListSnapshot; offset: number } {
    let parsed: KubeObject;
    try {
      parsed = JSON.parse(Buffer.from(token, 'base64url').toString('utf8'));
    } catch {
      throw new ApiError(400, 'continue key is not valid: illegal base64 data or JSON');
    }
    const snapshot = this.snapshots.get(String(parsed.id));
    if (!snapshot || !Number.isInteger(parsed.offset)) {
      throw new ApiError(
        410,
        'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.',
        'Expired',
      );
    }
    return { snapshot, offset: parsed.offset };
  }

  private serveWatch(
    req: IncomingMessage,
    res: ServerResponse,
    route: Route,
    selection: Selection,
    query: URLSearchParams,
  ): void {
    const { resource } = route;
    this.stats.watches[resource.plural] = (this.stats.watches[resource.plural] ?? 0) + 1;
    const reads = RESPONSE_READS.get(res)!;
    reads.watches++;
    const from = query.get('resourceVersion') ?? '';
    if (from !== '' && !/^\d+$/.test(from)) {
      throw new ApiError(400, `resourceVersion: Invalid value: "${from}": must be a non-negative integer`);
    }
    const initialEvents = this.initialEventsOf(query, from);
    const lag = this.lag;
    const cacheVersion = lag?.rv ?? this.store.resourceVersion;
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
    let silent = false;
    // While the replay (the initial state, or the changes since a version) is being streamed,
    // what else would be written (live events, bookmarks, lines a test injects) waits behind it.
    let held: string[] | undefined;
    const put = (line: string) => {
      // A reset connection closes the response a moment later; nothing more is written to it.
      if (!silent && !res.destroyed && !res.writableEnded) {
        reads.responseBytes += Buffer.byteLength(line) + 1;
        res.write(line + '\n');
      }
    };
    const writeLine = (line: string) => {
      if (held) held.push(line);
      else put(line);
    };
    const write = (event: KubeObject) => writeLine(JSON.stringify(event));
    // kubectl get -w asks for Table rows; the column definitions come with the first one only.
    const asTable = wantsTable(req);
    let columnsSent = false;
    /** One event as its line (a Table row for kubectl get -w). */
    const eventLine = (type: ChangeType, object: KubeObject): string => {
      reads.objects++;
      if (!asTable) return JSON.stringify({ type, object });
      const table = toTable(
        resource,
        [object],
        { resourceVersion: object.metadata.resourceVersion },
        query.get('includeObject') ?? 'Metadata',
      );
      if (columnsSent) table.columnDefinitions = [];
      columnsSent = true;
      return JSON.stringify({ type, object: table });
    };
    const send = (type: ChangeType, object: KubeObject) => writeLine(eventLine(type, object));
    const watcher: Watcher = { resource, namespace: route.namespace, selection, send };

    res.writeHead(200, { 'Content-Type': 'application/json', 'Cache-Control': 'no-cache, private' });
    res.flushHeaders();
    res.socket?.setNoDelay(true);
    res.on('error', () => undefined);

    if (lag && from !== '' && from !== '0' && Number(from) > lag.rv) {
      const status = tooLargeResourceVersion(from, lag.rv).toStatus();
      write({ type: 'ERROR', object: status });
      res.end();
      return;
    }
    // Unset or 0: start with the current state as synthetic ADDED events, as the real server does.
    let replay: Array<{ type: ChangeType; object: KubeObject }>;
    if (initialEvents === false) {
      replay = [];
    } else if (initialEvents === true || from === '' || from === '0') {
      replay = (lag ? lag.objects.get(resource)! : this.store.list(resource))
        .filter(
          (o) => (route.namespace === undefined || o.metadata.namespace === route.namespace) && selects(selection, o),
        )
        .map((o) => ({ type: 'ADDED', object: withTypeMeta(resource, o) }));
    } else {
      const changes = this.store.changesSince(resource, Number(from));
      if (!changes) {
        const message = `too old resource version: ${from} (${this.store.oldestResumable})`;
        write({ type: 'ERROR', object: failureStatus(410, 'Expired', message) });
        res.end();
        return;
      }
      replay = changes.flatMap((c) => {
        if (lag && c.rv > lag.rv) return [];
        const type = visibleChange(c, watcher);
        return type ? [{ type, object: withTypeMeta(resource, c.object) }] : [];
      });
    }
    const breakAt = initialEvents === true ? this.watchListBreak : undefined;
    if (initialEvents === true) {
      this.watchListBreak = undefined;
      reads.watchLists++;
    }
    if (breakAt) {
      for (const event of replay.slice(0, breakAt.afterEvents)) send(event.type, event.object);
      if (breakAt.code !== 'end') {
        const message = `too old resource version: ${from || this.store.resourceVersion}`;
        write({ type: 'ERROR', object: failureStatus(breakAt.code, REASONS[breakAt.code] ?? 'Unknown', message) });
      }
      res.end();
      return;
    }
    // The replay is streamed as the client reads it, as the real server writes a watch: a slice
    // of events, then a wait for the connection to drain, so that the client decodes the first
    // events while the server is still encoding the rest, and a slow client holds one slice, not
    // the whole state, in the server's memory. Changes meanwhile follow the replay in order.
    const replayVersion = cacheVersion;
    const endOfReplay = (): void => {
      if (initialEvents === true && bookmarks) {
        // The end of the initial state: the resourceVersion it is at, marked for WatchList clients.
        reads.bookmarks++;
        put(
          JSON.stringify({
            type: 'BOOKMARK',
            object: {
              kind: resource.kind,
              apiVersion: 'v1',
              metadata: {
                resourceVersion: String(replayVersion),
                annotations: { [INITIAL_EVENTS_END_ANNOTATION]: 'true' },
              },
            },
          }),
        );
      }
      const waiting = held ?? [];
      held = undefined;
      for (const line of waiting) put(line);
    };
    held = [];
    let next = 0;
    const pump = (): void => {
      while (next < replay.length) {
        if (silent || res.destroyed || res.writableEnded) return;
        const { type, object } = replay[next++]!;
        put(eventLine(type, object));
        if (res.writableLength >= REPLAY_SLICE_BYTES) {
          res.once('drain', pump);
          return;
        }
      }
      endOfReplay();
    };
    pump();

    // A watch opened on a lagging cache gets nothing newer than it until the cache catches up.
    let unsubscribe = () => undefined as unknown;
    let parked = lag !== undefined;
    let closed = false;
    if (lag) {
      lag.parked.push(() => {
        parked = false;
        if (closed || silent) return;
        for (const c of this.store.changesSince(resource, lag.rv) ?? []) {
          const type = visibleChange(c, watcher);
          if (type) send(type, withTypeMeta(resource, c.object));
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
          write({
            type: 'BOOKMARK',
            object: {
              kind: resource.kind,
              apiVersion: 'v1',
              metadata: { resourceVersion: String(parked && lag ? lag.rv : this.store.resourceVersion) },
            },
          });
        }, this.bookmarkIntervalMs),
      );
    }
    const open: OpenWatch = {
      res,
      resource,
      close: () => res.end(),
      writeLine,
      silence: () => {
        silent = true;
        unsubscribe();
        for (const t of timers) clearTimeout(t);
      },
    };
    // As the real server: the stream ends at the timeout the client asked for.
    if (timeoutSeconds > 0) timers.push(setTimeout(() => !silent && open.close(), timeoutSeconds * 1000));
    this.openWatches.add(open);
    res.on('close', () => {
      closed = true;
      unsubscribe();
      for (const t of timers) clearTimeout(t);
      this.openWatches.delete(open);
    });
  }

  private async serveCreate(
    req: IncomingMessage,
    res: ServerResponse,
    route: Route,
    query: URLSearchParams,
  ): Promise<void> {
    const { resource } = route;
    const body = await readJsonBody(req);
    checkBody(resource, body);
    if (!body.metadata?.name && body.metadata?.generateName) {
      body.metadata.name = body.metadata.generateName + randomBytes(3).toString('hex').slice(0, 5);
    }
    if (!body.metadata?.name) {
      throw new ApiError(
        422,
        `${resource.kind} "" is invalid: metadata.name: Required value: name or generateName is required`,
      );
    }
    if (resource.namespaced) {
      const ns = body.metadata.namespace;
      if (ns !== undefined && ns !== '' && ns !== route.namespace) {
        throw new ApiError(
          400,
          'the namespace of the provided object does not match the namespace sent on the request',
        );
      }
    }
    const incoming = normalize(resource, { ...body, metadata: { ...body.metadata, namespace: route.namespace } });
    if (this.store.get(resource, incoming.metadata.namespace, incoming.metadata.name)) {
      throw new ApiError(409, `${resource.plural} "${incoming.metadata.name}" already exists`, 'AlreadyExists', {
        name: incoming.metadata.name,
        kind: resource.plural,
      });
    }
    if (isDryRun(query)) {
      sendJson(res, 201, withTypeMeta(resource, incoming));
      return;
    }
    // Clients cannot set these on create.
    delete incoming.metadata.uid;
    delete incoming.metadata.creationTimestamp;
    sendJson(res, 201, withTypeMeta(resource, this.create(resource, incoming, { defaults: true })));
  }

  private async serveReplace(
    req: IncomingMessage,
    res: ServerResponse,
    route: Route,
    query: URLSearchParams,
  ): Promise<void> {
    const { resource } = route;
    const body = await readJsonBody(req);
    checkBody(resource, body);
    const existing = this.mustGet(route);
    if (body.metadata?.name !== undefined && body.metadata.name !== route.name) {
      throw new ApiError(
        400,
        `the name of the object (${body.metadata.name}) does not match the name on the URL (${route.name})`,
      );
    }
    const rv = body.metadata?.resourceVersion;
    if (rv !== undefined && rv !== '' && rv !== existing.metadata.resourceVersion) {
      throw conflict(
        resource,
        route.name!,
        'the object has been modified; please apply your changes to the latest version and try again',
      );
    }
    const merged = {
      ...body,
      metadata: { ...body.metadata, name: route.name, namespace: existing.metadata.namespace },
    };
    this.finishUpdate(res, route, existing, merged, query);
  }

  private async servePatch(
    req: IncomingMessage,
    res: ServerResponse,
    route: Route,
    query: URLSearchParams,
  ): Promise<void> {
    const { resource } = route;
    const type = (req.headers['content-type'] ?? '').split(';')[0]!.trim();
    const apply =
      type === 'application/merge-patch+json'
        ? mergePatch
        : type === 'application/strategic-merge-patch+json'
          ? strategicMergePatch
          : type === 'application/json-patch+json'
            ? jsonPatch
            : undefined;
    if (!apply) {
      throw new ApiError(
        415,
        `the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json`,
      );
    }
    const patch = await readJsonBody(req, true);
    const existing = this.mustGet(route);
    const patched = apply(withTypeMeta(resource, existing), patch);
    if (!isPlainObject(patched)) throw new ApiError(422, 'the patch did not produce an object');
    checkBody(resource, patched);
    if (
      patched.metadata?.name !== route.name ||
      (patched.metadata?.namespace ?? undefined) !== existing.metadata.namespace
    ) {
      throw new ApiError(400, 'a patch cannot change the name or namespace of an object');
    }
    const rv = patched.metadata?.resourceVersion;
    if (rv !== undefined && rv !== existing.metadata.resourceVersion) {
      throw conflict(
        resource,
        route.name!,
        'the object has been modified; please apply your changes to the latest version and try again',
      );
    }
    this.finishUpdate(res, route, existing, patched, query);
  }

  /** The common tail of PUT and PATCH: main resource writes keep the status, status writes keep the rest. */
  private finishUpdate(
    res: ServerResponse,
    route: Route,
    existing: KubeObject,
    incoming: KubeObject,
    query: URLSearchParams,
  ): void {
    const { resource } = route;
    let candidate: KubeObject;
    if (route.subresource === 'status') {
      candidate = { ...structuredClone(existing), status: incoming.status };
      if (candidate.status === undefined) delete candidate.status;
    } else {
      candidate = normalize(resource, incoming);
      if (resource.hasStatus) {
        if (existing.status === undefined) delete candidate.status;
        else candidate.status = existing.status;
      }
      if (resource.kind === 'Service') this.defaultService(candidate, existing);
    }
    candidate.metadata.resourceVersion = existing.metadata.resourceVersion;
    if (isDryRun(query)) {
      sendJson(res, 200, withTypeMeta(resource, candidate));
      return;
    }
    sendJson(res, 200, withTypeMeta(resource, this.update(resource, existing, candidate, { keepCreation: true })));
  }

  private async serveDelete(
    req: IncomingMessage,
    res: ServerResponse,
    route: Route,
    query: URLSearchParams,
  ): Promise<void> {
    const { resource } = route;
    const options = await readJsonBody(req, false, true);
    const existing = this.mustGet(route);
    const pre = options?.preconditions ?? {};
    if (
      (pre.uid && pre.uid !== existing.metadata.uid) ||
      (pre.resourceVersion && pre.resourceVersion !== existing.metadata.resourceVersion)
    ) {
      throw conflict(resource, route.name!, 'the precondition does not match the current object');
    }
    const dryRun = isDryRun(query) || (Array.isArray(options?.dryRun) && options.dryRun.includes('All'));
    const deleted = dryRun ? existing : this.store.delete(resource, route.namespace, route.name!)!;
    if (resource.deleteReturnsObject) {
      sendJson(res, 200, withTypeMeta(resource, deleted));
    } else {
      sendJson(res, 200, {
        kind: 'Status',
        apiVersion: 'v1',
        metadata: {},
        status: 'Success',
        details: { name: route.name, kind: resource.plural, uid: existing.metadata.uid },
      });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Request plumbing.

function resourceOfKind(kind: unknown): Resource {
  const resource = BY_KIND.get(String(kind));
  if (!resource) throw new Error(`the API stand-in stores ${[...BY_KIND.keys()].join(', ')}; not kind ${String(kind)}`);
  return resource;
}

/** Puts kind, apiVersion and the scope-appropriate namespace on a client-supplied object. */
function normalize(resource: Resource, obj: KubeObject): KubeObject {
  const copy = structuredClone(obj);
  copy.kind = resource.kind;
  copy.apiVersion = 'v1';
  const meta = (copy.metadata ??= {});
  if (typeof meta.name !== 'string' || meta.name === '') {
    throw new ApiError(422, `${resource.kind} "" is invalid: metadata.name: Required value`);
  }
  if (resource.namespaced) meta.namespace ||= 'default';
  else delete meta.namespace;
  return copy;
}

function defaultNamespace(ns: KubeObject): void {
  ns.metadata.labels = { ...ns.metadata.labels, 'kubernetes.io/metadata.name': ns.metadata.name };
  ns.spec ??= { finalizers: ['kubernetes'] };
  ns.status ??= { phase: 'Active' };
}

function checkBody(resource: Resource, body: KubeObject): void {
  if (body.kind !== undefined && body.kind !== resource.kind) {
    throw new ApiError(
      400,
      `the kind of the object (${String(body.kind)}) does not match the resource (${resource.kind})`,
    );
  }
  if (body.apiVersion !== undefined && body.apiVersion !== 'v1') {
    throw new ApiError(400, `the API version of the object (${String(body.apiVersion)}) is not v1`);
  }
}

function isDryRun(query: URLSearchParams): boolean {
  return query.getAll('dryRun').includes('All');
}

function parseRoute(path: string): Route | undefined {
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
  const resource = plural === undefined ? undefined : BY_PLURAL.get(plural);
  if (!resource || extra.length > 0) return undefined;
  if (namespace !== undefined && !resource.namespaced) return undefined;
  if (subresource !== undefined && !(subresource === 'status' && resource.hasStatus)) return undefined;
  return { resource, namespace, name, subresource: subresource as 'status' | undefined, watchPath };
}

async function readJsonBody(req: IncomingMessage, anyJson = false, optional = false): Promise<KubeObject> {
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

function sendJson(res: ServerResponse, code: number, body: unknown): void {
  const text = JSON.stringify(body);
  const bytes = Buffer.byteLength(text);
  const reads = RESPONSE_READS.get(res);
  if (reads) reads.responseBytes += bytes;
  res.writeHead(code, { 'Content-Type': 'application/json', 'Content-Length': bytes });
  res.end(text);
}
