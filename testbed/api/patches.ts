// The three patch formats a PATCH may carry: JSON merge patch (RFC 7386), strategic merge patch
// (as far as kubectl apply needs it on Services and Nodes) and JSON patch (RFC 6902).

import { isDeepStrictEqual } from 'node:util';
import { ApiError, type KubeObject } from './errors.js';
import { isPlainObject } from './resources.js';

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

/** The patch function of a PATCH's content type; 415 for any other type. */
export function patchOf(contentType: string): (target: unknown, patch: unknown) => unknown {
  const type = contentType.split(';')[0]!.trim();
  switch (type) {
    case 'application/merge-patch+json':
      return mergePatch;
    case 'application/strategic-merge-patch+json':
      return strategicMergePatch;
    case 'application/json-patch+json':
      return jsonPatch;
    default:
      throw new ApiError(
        415,
        `the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json`,
      );
  }
}
