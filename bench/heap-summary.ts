// The bytes of a heap snapshot grouped as the heap profile (bench/heap-profile.ts) prints them: by
// class, by owner (the dominator that holds a class's objects, and the edge it holds them by) and
// by single large retainer, over the graph and dominator tree of bench/heap-snapshot.ts.

import type { Dominators, HeapGraph } from './heap-snapshot.js';

/** The group a node's bytes are counted in: the class for objects, the kind for the rest. */
export function nodeClass(g: HeapGraph, i: number): string {
  const type = g.nodeTypes[g.nodeType[i]!] ?? 'unknown';
  const name = g.strings[g.nodeName[i]!] ?? '';
  switch (type) {
    case 'object':
      // Plain objects by their own property names, so that records of different shapes part.
      return name === 'Object'
        ? `Object {${propertyNames(g, i)}}`.slice(0, 90)
        : name.slice(0, 60) || '(anonymous object)';
    case 'native':
      return name.slice(0, 60) || '(anonymous object)';
    case 'string':
    case 'concatenated string':
    case 'sliced string':
      return '(string)';
    case 'closure':
      return '(closure)';
    case 'code':
      return '(code)';
    case 'number':
      return '(heap number)';
    case 'regexp':
      return '(regexp)';
    case 'array':
    case 'hidden':
    case 'object shape':
    case 'synthetic':
      // 'system / Map' (hidden classes), '(object properties)', '(object elements)', ...
      return (name ? `(${type}) ${name}` : i === 0 ? '(root)' : `(${type})`).slice(0, 60);
    default:
      return `(${type})`;
  }
}

function propertyNames(g: HeapGraph, i: number, most = 6): string {
  const property = g.edgeTypes.indexOf('property');
  const names: string[] = [];
  let more = false;
  for (let e = g.firstEdge[i]!; e < g.firstEdge[i + 1]!; e++) {
    if (g.edgeType[e] !== property) continue;
    const name = g.strings[g.edgeNameOrIndex[e]!] ?? '';
    if (name === '__proto__' || name === 'map') continue;
    names.push(name);
  }
  // Many names: a dictionary-mode object, whose order is a hash order; sort them to be stable.
  if (names.length > most) {
    names.sort();
    names.length = most;
    more = true;
  }
  return names.join(',') + (more ? ',…' : '');
}

/** nodeClass, with the function's name for closures (retainer labels). */
function nodeLabel(g: HeapGraph, i: number): string {
  const type = g.nodeTypes[g.nodeType[i]!];
  return type === 'closure' ? `${g.strings[g.nodeName[i]!] || 'anonymous'}()` : nodeClass(g, i);
}

export interface ClassFigures {
  name: string;
  count: number;
  selfBytes: number;
  /** Retained by the objects of the class that no other object of the class dominates. */
  retainedBytes: number;
}

export interface Retainer {
  /** 'Map held as Informer.cache' */
  label: string;
  retainedBytes: number;
}

export interface RetainerGrowth extends Retainer {
  /** Retained bytes at the largest size minus at the baseline (largest of each label), per Service. */
  perService: number;
}

export interface HeapSummary {
  nodes: number;
  totalBytes: number;
  reachableBytes: number;
  classes: Map<string, ClassFigures>;
  /** Labelled retainers that dominate ≥ 0.2% of the heap, largest first. */
  retainers: Retainer[];
  /** For classes with ≥ ownerMinCount objects: self bytes by owner (the dominator, and the edge it holds them by). */
  owners: Map<string, Map<string, number>>;
}

function edgeLabel(g: HeapGraph, e: number): string {
  const type = g.edgeTypes[g.edgeType[e]!];
  const v = g.edgeNameOrIndex[e]!;
  if (type === 'element' || type === 'hidden') return `[${v}]`;
  return String(g.strings[v] ?? v);
}

/** Per-class figures and the largest single retainers (with the edge that holds them). */
export function summarizeHeap(g: HeapGraph, d: Dominators, retainerShare = 0.002, ownerMinCount = 1000): HeapSummary {
  const classes = new Map<string, ClassFigures>();
  const idOf = new Map<string, number>();
  const classId = new Int32Array(g.nodeCount);
  const figures: ClassFigures[] = [];
  let totalBytes = 0;
  for (let i = 0; i < g.nodeCount; i++) {
    const name = nodeClass(g, i);
    let id = idOf.get(name);
    if (id === undefined) {
      id = figures.length;
      idOf.set(name, id);
      const f = { name, count: 0, selfBytes: 0, retainedBytes: 0 };
      classes.set(name, f);
      figures.push(f);
    }
    classId[i] = id;
    figures[id]!.count++;
    figures[id]!.selfBytes += g.selfSize[i]!;
    totalBytes += g.selfSize[i]!;
  }

  // Depth-first over the dominator tree: a node adds its retained size to its class unless an
  // ancestor of the same class already did.
  const reached = d.order.length;
  const childCount = new Uint32Array(g.nodeCount + 1);
  for (let k = 1; k < reached; k++) childCount[d.idom[d.order[k]!]! + 1]!++;
  for (let i = 0; i < g.nodeCount; i++) childCount[i + 1]! += childCount[i]!;
  const children = new Uint32Array(Math.max(reached - 1, 0));
  const fill = childCount.slice(0, g.nodeCount);
  for (let k = 1; k < reached; k++) {
    const v = d.order[k]!;
    children[fill[d.idom[v]!]!++] = v;
  }
  const active = new Uint32Array(figures.length);
  const stackNode = new Uint32Array(reached);
  const stackNext = new Uint32Array(reached);
  let depth = 0;
  if (reached > 0) {
    stackNode[0] = 0;
    stackNext[0] = childCount[0]!;
    depth = 1;
    if (active[classId[0]!]!++ === 0) figures[classId[0]!]!.retainedBytes += d.retained[0]!;
  }
  while (depth > 0) {
    const v = stackNode[depth - 1]!;
    const k = stackNext[depth - 1]!;
    if (k < childCount[v + 1]!) {
      stackNext[depth - 1] = k + 1;
      const w = children[k]!;
      stackNode[depth] = w;
      stackNext[depth] = childCount[w]!;
      depth++;
      if (active[classId[w]!]!++ === 0) figures[classId[w]!]!.retainedBytes += d.retained[w]!;
    } else {
      active[classId[v]!]!--;
      depth--;
    }
  }

  // Labels for the single large retainers: the class, and the edge its immediate dominator
  // holds it by (or, when several objects share it, the dominator alone): stable across runs.
  const reachableBytes = reached > 0 ? d.retained[0]! : 0;
  const threshold = reachableBytes * retainerShare;
  const holder = new Map<number, string>();
  for (let k = 1; k < reached; k++) {
    const v = d.order[k]!;
    if (d.retained[v]! < threshold || g.nodeTypes[g.nodeType[v]!] === 'synthetic') continue;
    const dominator = d.idom[v]!;
    let label = `(shared under ${nodeLabel(g, dominator)})`;
    for (let e = g.firstEdge[dominator]!; e < g.firstEdge[dominator + 1]!; e++)
      if (g.edgeTo[e] === v && g.edgeTypes[g.edgeType[e]!] !== 'weak') {
        label = `${nodeLabel(g, dominator)}.${edgeLabel(g, e)}`;
        break;
      }
    holder.set(v, label);
  }
  const big = holder.keys();
  const retainers = [...big]
    .map((v) => ({ label: `${nodeLabel(g, v)} held as ${holder.get(v) ?? '?'}`, retainedBytes: d.retained[v]! }))
    .sort((a, b) => b.retainedBytes - a.retainedBytes);

  // Whose the objects of the populous classes are: self bytes by owner (what shares them, when
  // no single structure dominates them).
  const traced = figures.map((f) => f.count >= ownerMinCount);
  const slot = (label: string) => (/^\d+$/.test(label) ? '[]' : label);
  // A container is named by what holds it: 'Informer.objects.table' rather than '(array)'.
  const containers = new Set(['Map', 'Set', 'WeakMap', 'WeakSet', 'Array', '(array)', '(array) (object elements)']);
  const paths = new Map<number, string>();
  const holderPath = (v: number): string => {
    let path = paths.get(v);
    if (path !== undefined) return path;
    const parts: string[] = [];
    let cur = v;
    for (let hop = 0; hop < 4 && containers.has(nodeClass(g, cur)); hop++) {
      const dom = d.idom[cur]!;
      if (dom <= 0) break;
      let edge = -1;
      for (let e = g.firstEdge[dom]!; e < g.firstEdge[dom + 1]! && edge < 0; e++) if (g.edgeTo[e] === cur) edge = e;
      if (edge < 0) break;
      parts.unshift(slot(edgeLabel(g, edge)));
      cur = dom;
    }
    path = [nodeLabel(g, cur), ...parts].join('.');
    paths.set(v, path);
    return path;
  };
  const weak = g.edgeTypes.indexOf('weak');
  const owners = new Map<string, Map<string, number>>();
  for (let k = 1; k < reached; k++) {
    const v = d.order[k]!;
    if (!traced[classId[v]!]) continue;
    const dominator = d.idom[v]!;
    let key = `(shared under ${holderPath(dominator)})`;
    for (let e = g.firstEdge[dominator]!; e < g.firstEdge[dominator + 1]!; e++)
      if (g.edgeTo[e] === v && g.edgeType[e] !== weak) {
        const type = g.edgeTypes[g.edgeType[e]!];
        key = `${holderPath(dominator)}.${type === 'element' || type === 'hidden' ? '[]' : slot(edgeLabel(g, e))}`;
        break;
      }
    const name = figures[classId[v]!]!.name;
    let m = owners.get(name);
    if (!m) owners.set(name, (m = new Map()));
    m.set(key, (m.get(key) ?? 0) + g.selfSize[v]!);
  }
  return { nodes: g.nodeCount, totalBytes, reachableBytes, classes, retainers, owners };
}

/** The retainers (by label, the largest of each) that grew from the baseline, most first. */
export function retainerGrowth(base: Retainer[], top: Retainer[], services: number): RetainerGrowth[] {
  const largest = (list: Retainer[]) => {
    const m = new Map<string, number>();
    for (const r of list) m.set(r.label, Math.max(m.get(r.label) ?? 0, r.retainedBytes));
    return m;
  };
  const before = largest(base);
  return [...largest(top)]
    .map(([label, retainedBytes]) => ({
      label,
      retainedBytes,
      perService: (retainedBytes - (before.get(label) ?? 0)) / services,
    }))
    .filter((r) => r.perService > 0)
    .sort((a, b) => b.perService - a.perService);
}
