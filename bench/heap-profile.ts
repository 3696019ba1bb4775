// What the controller's V8 heap holds per Service: the controller bundle runs against the API
// stand-in with 0 and then N bench Services, writes a heap snapshot after its first sync and a
// few periodic resyncs, and this module parses the snapshot, computes the dominator tree and
// prints, per structure, (bytes at N - bytes at 0) / N beside V8's heap used and the RSS.
// Usage (root): node dist/bench/heap-profile.js [--sizes 0,10000] [--resyncs 2] [--rows 25]
//   [--nft-executor addon|cli]
// Run alone it re-executes itself in a private network and mount namespace (unshare): the
// machine's firewall is never touched. heapProfile() expects its caller to be isolated already.

import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { ApiStandIn } from '../testbed/api-server.js';
import { ControllerProcess } from './controller-process.js';
import { isolatedFromMachine } from './namespace.js';
import { NODE_NAME, benchNode, benchService } from './services.js';

// ---------------------------------------------------------------------------------------------
// The snapshot graph

/** A .heapsnapshot in flat typed arrays: node i's edges are firstEdge[i] .. firstEdge[i+1]-1. */
export interface HeapGraph {
  nodeCount: number;
  nodeType: Uint8Array;
  nodeName: Uint32Array;
  selfSize: Float64Array;
  firstEdge: Uint32Array;
  edgeType: Uint8Array;
  /** A string index for named edges, the element index for element and hidden edges. */
  edgeNameOrIndex: Uint32Array;
  /** Node ordinal (not the offset in the snapshot's nodes array). */
  edgeTo: Uint32Array;
  nodeTypes: string[];
  edgeTypes: string[];
  strings: string[];
}

interface SnapshotJson {
  snapshot: {
    meta: {
      node_fields: string[];
      node_types: [string[], ...unknown[]];
      edge_fields: string[];
      edge_types: [string[], ...unknown[]];
    };
    node_count?: number;
  };
  nodes: number[];
  edges: number[];
  strings: string[];
}

function fieldIndex(fields: string[], name: string): number {
  const i = fields.indexOf(name);
  if (i < 0) throw new Error(`heap snapshot: no '${name}' field in ${JSON.stringify(fields)}`);
  return i;
}

/** Parses the JSON of a .heapsnapshot (text or already parsed) into a HeapGraph. */
export function parseHeapSnapshot(input: string | SnapshotJson): HeapGraph {
  const json = (typeof input === 'string' ? JSON.parse(input) : input) as SnapshotJson;
  const meta = json.snapshot?.meta;
  if (!meta || !Array.isArray(json.nodes) || !Array.isArray(json.edges) || !Array.isArray(json.strings))
    throw new Error('heap snapshot: missing snapshot.meta, nodes, edges or strings');
  const nf = meta.node_fields;
  const ef = meta.edge_fields;
  const nodeWidth = nf.length;
  const edgeWidth = ef.length;
  const nType = fieldIndex(nf, 'type');
  const nName = fieldIndex(nf, 'name');
  const nSelf = fieldIndex(nf, 'self_size');
  const nEdges = fieldIndex(nf, 'edge_count');
  const eType = fieldIndex(ef, 'type');
  const eName = fieldIndex(ef, 'name_or_index');
  const eTo = fieldIndex(ef, 'to_node');
  if (json.nodes.length % nodeWidth !== 0) throw new Error('heap snapshot: nodes array is not whole nodes');
  if (json.edges.length % edgeWidth !== 0) throw new Error('heap snapshot: edges array is not whole edges');
  const nodeCount = json.nodes.length / nodeWidth;
  const edgeCount = json.edges.length / edgeWidth;
  const g: HeapGraph = {
    nodeCount,
    nodeType: new Uint8Array(nodeCount),
    nodeName: new Uint32Array(nodeCount),
    selfSize: new Float64Array(nodeCount),
    firstEdge: new Uint32Array(nodeCount + 1),
    edgeType: new Uint8Array(edgeCount),
    edgeNameOrIndex: new Uint32Array(edgeCount),
    edgeTo: new Uint32Array(edgeCount),
    nodeTypes: meta.node_types[0],
    edgeTypes: meta.edge_types[0],
    strings: json.strings,
  };
  let edge = 0;
  for (let i = 0; i < nodeCount; i++) {
    const o = i * nodeWidth;
    g.nodeType[i] = json.nodes[o + nType]!;
    g.nodeName[i] = json.nodes[o + nName]!;
    g.selfSize[i] = json.nodes[o + nSelf]!;
    g.firstEdge[i] = edge;
    edge += json.nodes[o + nEdges]!;
  }
  g.firstEdge[nodeCount] = edge;
  if (edge !== edgeCount)
    throw new Error(`heap snapshot: nodes count ${edge} edges, the edges array holds ${edgeCount}`);
  for (let e = 0; e < edgeCount; e++) {
    const o = e * edgeWidth;
    g.edgeType[e] = json.edges[o + eType]!;
    g.edgeNameOrIndex[e] = json.edges[o + eName]!;
    const to = json.edges[o + eTo]!;
    if (to % nodeWidth !== 0 || to / nodeWidth >= nodeCount)
      throw new Error(`heap snapshot: edge ${e} points at ${to}, not a node`);
    g.edgeTo[e] = to / nodeWidth;
  }
  return g;
}

// ---------------------------------------------------------------------------------------------
// Dominators and retained sizes

export interface Dominators {
  /** Immediate dominator of each node; the root's is itself; -1 for a node the root cannot reach. */
  idom: Int32Array;
  /** Self size of the node plus everything it alone keeps alive (0 when unreachable). */
  retained: Float64Array;
  /** Reachable nodes, the root first, every node before those it dominates. */
  order: Uint32Array;
}

/**
 * Dominator tree from node 0 (the snapshot's synthetic root) by the iterative algorithm of
 * Cooper, Harvey and Kennedy. As in Chrome's DevTools, weak edges keep nothing alive, and
 * shortcut edges count only from the root (they mark the user's global objects there).
 */
export function computeDominators(g: HeapGraph): Dominators {
  const n = g.nodeCount;
  const weak = g.edgeTypes.indexOf('weak');
  const shortcut = g.edgeTypes.indexOf('shortcut');
  const essential = (from: number, e: number) => {
    const t = g.edgeType[e];
    return t !== weak && (t !== shortcut || from === 0);
  };

  // Postorder numbers by an iterative depth-first search.
  const post = new Int32Array(n).fill(-1);
  const byPost = new Uint32Array(n);
  const visited = new Uint8Array(n);
  const stackNode = new Uint32Array(n);
  const stackEdge = new Uint32Array(n);
  let depth = 0;
  let reached = 0;
  if (n > 0) {
    stackNode[0] = 0;
    stackEdge[0] = g.firstEdge[0]!;
    visited[0] = 1;
    depth = 1;
  }
  while (depth > 0) {
    const v = stackNode[depth - 1]!;
    const e = stackEdge[depth - 1]!;
    if (e < g.firstEdge[v + 1]!) {
      stackEdge[depth - 1] = e + 1;
      const w = g.edgeTo[e]!;
      if (!visited[w] && essential(v, e)) {
        visited[w] = 1;
        stackNode[depth] = w;
        stackEdge[depth] = g.firstEdge[w]!;
        depth++;
      }
    } else {
      post[v] = reached;
      byPost[reached++] = v;
      depth--;
    }
  }

  // Predecessors of each reachable node, in postorder numbers.
  const predCount = new Uint32Array(reached + 1);
  for (let v = 0; v < n; v++) {
    if (post[v]! < 0) continue;
    for (let e = g.firstEdge[v]!; e < g.firstEdge[v + 1]!; e++)
      if (essential(v, e)) predCount[post[g.edgeTo[e]!]! + 1]!++;
  }
  for (let i = 0; i < reached; i++) predCount[i + 1]! += predCount[i]!;
  const preds = new Uint32Array(predCount[reached]!);
  const fill = predCount.slice(0, reached);
  for (let v = 0; v < n; v++) {
    if (post[v]! < 0) continue;
    for (let e = g.firstEdge[v]!; e < g.firstEdge[v + 1]!; e++)
      if (essential(v, e)) preds[fill[post[g.edgeTo[e]!]!]!++] = post[v]!;
  }

  // Fixed point in reverse postorder; the root has the highest number.
  const root = reached - 1;
  const dom = new Int32Array(reached).fill(-1);
  if (reached > 0) dom[root] = root;
  for (let changed = true; changed;) {
    changed = false;
    for (let b = root - 1; b >= 0; b--) {
      let best = -1;
      for (let k = predCount[b]!; k < predCount[b + 1]!; k++) {
        let p = preds[k]!;
        if (dom[p] === -1) continue;
        if (best === -1) {
          best = p;
          continue;
        }
        let q = best;
        while (p !== q) {
          while (p < q) p = dom[p]!;
          while (q < p) q = dom[q]!;
        }
        best = p;
      }
      if (best !== -1 && dom[b] !== best) {
        dom[b] = best;
        changed = true;
      }
    }
  }

  const idom = new Int32Array(n).fill(-1);
  const retained = new Float64Array(n);
  const order = new Uint32Array(reached);
  for (let b = 0; b < reached; b++) {
    const v = byPost[b]!;
    idom[v] = byPost[dom[b]!]!;
    retained[v] = retained[v]! + g.selfSize[v]!;
    if (b !== root) retained[idom[v]!] = retained[idom[v]!]! + retained[v]!;
    order[root - b] = v;
  }
  return { idom, retained, order };
}

// ---------------------------------------------------------------------------------------------
// Grouping

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
  /** For classes with ≥ referrerMinCount objects: references to them by 'HolderClass.edge'. */
  referrers: Map<string, Map<string, number>>;
  /** For the same classes: self bytes by owner (the dominator, and the edge it holds them by). */
  owners: Map<string, Map<string, number>>;
}

function edgeLabel(g: HeapGraph, e: number): string {
  const type = g.edgeTypes[g.edgeType[e]!];
  const v = g.edgeNameOrIndex[e]!;
  if (type === 'element' || type === 'hidden') return `[${v}]`;
  return String(g.strings[v] ?? v);
}

/** Per-class figures and the largest single retainers (with the edge that holds them). */
export function summarizeHeap(
  g: HeapGraph,
  d: Dominators,
  retainerShare = 0.002,
  referrerMinCount = 1000,
): HeapSummary {
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

  // Who references the objects of the populous classes (what shares them, when no single
  // structure dominates them).
  const referrers = new Map<string, Map<string, number>>();
  const traced = figures.map((f) => f.count >= referrerMinCount);
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
  const arrayId = idOf.get('Array');
  const isArray = (v: number) => classId[v] === arrayId;
  for (let v = 0; v < g.nodeCount; v++) {
    for (let e = g.firstEdge[v]!; e < g.firstEdge[v + 1]!; e++) {
      const w = g.edgeTo[e]!;
      if (!traced[classId[w]!] || g.edgeType[e] === weak) continue;
      const type = g.edgeTypes[g.edgeType[e]!];
      // A JS array's items are counted once, from its backing store ('Array.elements.[]').
      if (type === 'element' && isArray(v)) continue;
      if (type === 'property' && g.strings[g.edgeNameOrIndex[e]!] === '__proto__') continue;
      // Slots of arrays and hash tables (internal edges named by number) count as one.
      const edge = type === 'element' || type === 'hidden' ? '[]' : slot(edgeLabel(g, e));
      const key = `${holderPath(v)}.${edge}`;
      const name = figures[classId[w]!]!.name;
      let m = referrers.get(name);
      if (!m) referrers.set(name, (m = new Map()));
      m.set(key, (m.get(key) ?? 0) + 1);
    }
  }
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
  return { nodes: g.nodeCount, totalBytes, reachableBytes, classes, retainers, referrers, owners };
}

// ---------------------------------------------------------------------------------------------
// The measure

export interface HeapProfileOptions {
  /** Numbers of Services; the smallest is the baseline. Default [0, 10000]. */
  sizes?: number[];
  /** Periodic full resyncs to wait for after the first sync. Default 2. */
  resyncs?: number;
  /** Rows in each table. Default 25. */
  rows?: number;
  /** How the controller programs nftables: in process (addon, the default) or by the nft command. */
  nftExecutor?: 'addon' | 'cli';
}

export interface HeapProfileRun {
  services: number;
  /** Before the snapshot's full GC, then after it. */
  rssBytes: number;
  rssAfterGcBytes: number;
  heapUsedBytes: number;
  heapTotalBytes: number;
  externalBytes: number;
  snapshotBytes: number;
  summary: HeapSummary;
}

export interface HeapProfileRow {
  name: string;
  count: number;
  selfBytes: number;
  retainedBytes: number;
  /** Differences to the baseline, per Service. */
  countPerService: number;
  selfPerService: number;
  retainedPerService: number;
  /** References to objects of the class, per Service, by 'HolderClass.edge', most first. */
  referrersPerService: [string, number][];
  /** Self bytes of the class per Service by owner (dominator and edge), most first. */
  ownersPerService: [string, number][];
}

export interface HeapProfileResult {
  runs: HeapProfileRun[];
  /** The largest size against the baseline, by class, largest self bytes per Service first. */
  perService: { services: number; baseline: number; rows: HeapProfileRow[]; retainers: RetainerGrowth[] };
  rows: number;
}

// Loaded into the controller (node --import): on SIGWINCH (ignored by default and by the
// controller) a full GC, the memory figures, then a heap snapshot, renamed when complete.
function hookSource(dir: string): string {
  return `import { writeHeapSnapshot } from 'node:v8';
import { renameSync, writeFileSync } from 'node:fs';
let k = 0;
process.on('SIGWINCH', () => {
  globalThis.gc?.();
  const base = ${JSON.stringify(dir)} + '/heap-' + process.pid + '-' + k++;
  writeFileSync(base + '.memory.json', JSON.stringify(process.memoryUsage()));
  writeHeapSnapshot(base + '.partial');
  renameSync(base + '.partial', base + '.heapsnapshot');
});
`;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function waitForFile(dir: string, suffix: string, timeoutMs: number, alive: () => boolean): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const found = readdirSync(dir).find((f) => f.endsWith(suffix));
    if (found) return join(dir, found);
    if (Date.now() > deadline) throw new Error(`no heap snapshot after ${timeoutMs} ms`);
    if (!alive()) throw new Error('the controller exited before writing its heap snapshot');
    await sleep(200);
  }
}

async function profileOnce(
  kubeconfig: string,
  services: number,
  resyncs: number,
  workDir: string,
  nftExecutor: 'addon' | 'cli',
): Promise<HeapProfileRun> {
  const dir = mkdtempSync(join(workDir, `run-${services}-`));
  const hook = join(dir, 'hook.mjs');
  writeFileSync(hook, hookSource(dir));
  const c = ControllerProcess.start({
    kubeconfig,
    nodeName: NODE_NAME,
    nftExecutor,
    minSyncPeriod: '1s',
    syncPeriod: '2s',
    nodeFlags: ['--import', pathToFileURL(hook).href],
  });
  try {
    await c.waitForSyncs('full', 1 + resyncs, 60_000 + services * 4 + resyncs * (10_000 + services));
    const rss = c.residentMemory().rssBytes;
    let alive = true;
    void c.waitFor('exit', () => false, 24 * 3600_000).catch(() => (alive = false));
    process.kill(c.pid, 'SIGWINCH');
    const file = await waitForFile(dir, '.heapsnapshot', 300_000, () => alive);
    const memory = JSON.parse(readFileSync(file.replace(/\.heapsnapshot$/, '.memory.json'), 'utf8')) as {
      rss: number;
      heapUsed: number;
      heapTotal: number;
      external: number;
    };
    await c.stop();
    const text = readFileSync(file, 'utf8');
    rmSync(dir, { recursive: true, force: true });
    const graph = parseHeapSnapshot(text);
    const summary = summarizeHeap(graph, computeDominators(graph));
    return {
      services,
      rssBytes: rss,
      rssAfterGcBytes: memory.rss,
      heapUsedBytes: memory.heapUsed,
      heapTotalBytes: memory.heapTotal,
      externalBytes: memory.external,
      snapshotBytes: text.length,
      summary,
    };
  } finally {
    await c.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Profiles the controller's heap at each size. The caller must run in namespaces of its own. */
export async function heapProfile(options: HeapProfileOptions = {}): Promise<HeapProfileResult> {
  const sizes = [...new Set(options.sizes ?? [0, 10_000])].sort((a, b) => a - b);
  if (sizes.length < 2) throw new Error('heap profile: give at least two sizes (the smallest is the baseline)');
  const resyncs = options.resyncs ?? 2;
  const workDir = mkdtempSync(join(tmpdir(), 'bench-heap-'));
  const api = await ApiStandIn.start();
  const runs: HeapProfileRun[] = [];
  try {
    const kubeconfig = join(workDir, 'kubeconfig');
    await api.writeKubeconfig(kubeconfig);
    api.apply(benchNode());
    let served = 0;
    for (const n of sizes) {
      for (; served < n; served++) api.apply(benchService(served));
      runs.push(await profileOnce(kubeconfig, n, resyncs, workDir, options.nftExecutor ?? 'addon'));
    }
  } finally {
    await api.stop();
    rmSync(workDir, { recursive: true, force: true });
  }
  const base = runs[0]!;
  const top = runs[runs.length - 1]!;
  const n = top.services - base.services;
  const rows: HeapProfileRow[] = [...top.summary.classes.values()].map((f) => {
    const b = base.summary.classes.get(f.name) ?? { count: 0, selfBytes: 0, retainedBytes: 0 };
    return {
      name: f.name,
      count: f.count,
      selfBytes: f.selfBytes,
      retainedBytes: f.retainedBytes,
      countPerService: (f.count - b.count) / n,
      selfPerService: (f.selfBytes - b.selfBytes) / n,
      retainedPerService: (f.retainedBytes - b.retainedBytes) / n,
      referrersPerService: [...(top.summary.referrers.get(f.name) ?? [])]
        .map(([holder, count]): [string, number] => [
          holder,
          (count - (base.summary.referrers.get(f.name)?.get(holder) ?? 0)) / n,
        ])
        .filter(([, perService]) => perService >= 0.01)
        .sort((x, y) => y[1] - x[1]),
      ownersPerService: [...(top.summary.owners.get(f.name) ?? [])]
        .map(([owner, bytes]): [string, number] => [
          owner,
          (bytes - (base.summary.owners.get(f.name)?.get(owner) ?? 0)) / n,
        ])
        .filter(([, perService]) => perService >= 0.5)
        .sort((x, y) => y[1] - x[1]),
    };
  });
  return {
    runs,
    perService: {
      services: top.services,
      baseline: base.services,
      rows,
      retainers: retainerGrowth(base.summary.retainers, top.summary.retainers, n),
    },
    rows: options.rows ?? 25,
  };
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

const MiB = 1024 * 1024;
const fmt = (x: number, digits = 0) =>
  x.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });

const cell = (text: string) => text.replace(/\|/g, '\\|');

/** Markdown tables: memory per run, then bytes per Service by class (self and retained). */
export function formatHeapProfile(r: HeapProfileResult): string {
  const out: string[] = [];
  const { services, baseline, rows } = r.perService;
  const n = services - baseline;
  out.push('### Controller heap (snapshot after the first sync and periodic resyncs, after a full GC)', '');
  out.push(
    '| Services | RSS (MiB) | RSS after GC (MiB) | V8 heap used (MiB) | heap total (MiB) | external (MiB) | snapshot nodes | snapshot self sizes (MiB) | reachable (MiB) |',
  );
  out.push('| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |');
  for (const run of r.runs)
    out.push(
      `| ${fmt(run.services)} | ${fmt(run.rssBytes / MiB, 1)} | ${fmt(run.rssAfterGcBytes / MiB, 1)} | ${fmt(run.heapUsedBytes / MiB, 1)} | ${fmt(run.heapTotalBytes / MiB, 1)} | ${fmt(run.externalBytes / MiB, 1)} | ${fmt(run.summary.nodes)} | ${fmt(run.summary.totalBytes / MiB, 1)} | ${fmt(run.summary.reachableBytes / MiB, 1)} |`,
    );
  const first = r.runs[0]!;
  const last = r.runs[r.runs.length - 1]!;
  const per = (a: number, b: number) => fmt((a - b) / n);
  out.push(
    '',
    `Per Service (${fmt(services)} minus ${fmt(baseline)}, divided by ${fmt(n)}): RSS ${per(last.rssBytes, first.rssBytes)} B (after GC ${per(last.rssAfterGcBytes, first.rssAfterGcBytes)} B), V8 heap total ${per(last.heapTotalBytes, first.heapTotalBytes)} B, V8 heap used ${per(last.heapUsedBytes, first.heapUsedBytes)} B, reachable in the snapshot ${per(last.summary.reachableBytes, first.summary.reachableBytes)} B, external ${per(last.externalBytes, first.externalBytes)} B.`,
    '',
  );
  out.push(`#### Self bytes per Service by class (${fmt(services)} minus ${fmt(baseline)})`, '');
  out.push('| class | objects per Service | self B per Service | share | retained B per Service |');
  out.push('| --- | ---: | ---: | ---: | ---: |');
  const selfTotal = rows.reduce((s, x) => s + Math.max(x.selfPerService, 0), 0);
  for (const x of [...rows].sort((a, b) => b.selfPerService - a.selfPerService).slice(0, r.rows))
    out.push(
      `| ${x.name.replace(/\|/g, '\\|')} | ${fmt(x.countPerService, 2)} | ${fmt(x.selfPerService, 1)} | ${fmt((100 * x.selfPerService) / selfTotal, 1)}% | ${fmt(x.retainedPerService, 1)} |`,
    );
  const growing = [...rows].sort((a, b) => b.selfPerService - a.selfPerService).slice(0, Math.min(r.rows, 15));
  out.push('', '#### Whose they are (self bytes per Service by owner: dominator.edge)', '');
  out.push('| class | owner: self B per Service |');
  out.push('| --- | --- |');
  for (const x of growing)
    if (x.ownersPerService.length > 0)
      out.push(
        `| ${cell(x.name)} | ${x.ownersPerService
          .slice(0, 8)
          .map(([owner, b]) => `${cell(owner)}: ${fmt(b, 1)}`)
          .join('<br>')} |`,
      );
  out.push('', '#### Who references them (references per Service by holder.edge)', '');
  out.push('| class | referenced from (per Service) |');
  out.push('| --- | --- |');
  for (const x of growing)
    if (x.referrersPerService.length > 0)
      out.push(
        `| ${cell(x.name)} | ${x.referrersPerService
          .slice(0, 5)
          .map(([holder, k]) => `${cell(holder)} ×${fmt(k, 2)}`)
          .join('<br>')} |`,
      );
  out.push('', `#### Retained bytes per Service by class (dominator tree; top-most object of each class)`, '');
  out.push('| class | retained B per Service | self B per Service |');
  out.push('| --- | ---: | ---: |');
  for (const x of [...rows].sort((a, b) => b.retainedPerService - a.retainedPerService).slice(0, r.rows))
    out.push(`| ${x.name.replace(/\|/g, '\\|')} | ${fmt(x.retainedPerService, 1)} | ${fmt(x.selfPerService, 1)} |`);
  out.push(
    '',
    `#### Single retainers that grow with Services (dominator tree, by class and the edge holding them)`,
    '',
  );
  out.push(`| object | retained at ${fmt(services)} (MiB) | growth B per Service |`);
  out.push('| --- | ---: | ---: |');
  for (const x of r.perService.retainers.slice(0, r.rows))
    out.push(`| ${x.label.replace(/\|/g, '\\|')} | ${fmt(x.retainedBytes / MiB, 2)} | ${fmt(x.perService, 1)} |`);
  return out.join('\n') + '\n';
}

// ---------------------------------------------------------------------------------------------
// Run alone

const SELF = fileURLToPath(import.meta.url);

function parseArgs(argv: string[]): HeapProfileOptions {
  const options: HeapProfileOptions = {};
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i]!.split('=', 2);
    const value = () => inline ?? argv[++i] ?? '';
    if (flag === '--sizes') {
      options.sizes = value()
        .split(',')
        .map((s) => Number(s.trim()));
      if (options.sizes.some((s) => !Number.isInteger(s) || s < 0 || s > 131_000))
        throw new Error(`--sizes: whole numbers from 0 to 131000, comma-separated, not '${argv[i]}'`);
    } else if (flag === '--resyncs') options.resyncs = Number(value());
    else if (flag === '--rows') options.rows = Number(value());
    else if (flag === '--nft-executor') {
      const executor = value();
      if (executor !== 'addon' && executor !== 'cli')
        throw new Error(`--nft-executor: addon or cli, not '${executor}'`);
      options.nftExecutor = executor;
    } else
      throw new Error(
        `unknown argument '${argv[i]}' (use --sizes 0,10000 --resyncs 2 --rows 25 --nft-executor addon|cli)`,
      );
  }
  return options;
}

if (process.argv[1] && fileURLToPath(pathToFileURL(process.argv[1])) === SELF) {
  const argv = process.argv.slice(2);
  if (process.getuid?.() !== 0) {
    console.error('heap-profile: run as root (the controller programs nftables in a namespace of its own)');
    process.exit(2);
  } else if (isolatedFromMachine()) {
    spawnSync('ip', ['link', 'set', 'lo', 'up']);
    (async () => {
      const result = await heapProfile(parseArgs(argv));
      process.stdout.write(formatHeapProfile(result));
    })().catch((err: unknown) => {
      console.error(`heap-profile: ${(err as Error).message}`);
      process.exit(1);
    });
  } else {
    const r = spawnSync(
      'unshare',
      ['--net', '--mount', '--propagation', 'private', '--', process.execPath, SELF, ...argv],
      { stdio: 'inherit' },
    );
    if (r.error) console.error(`heap-profile: cannot create a network namespace (unshare): ${r.error.message}`);
    process.exit(r.status ?? 1);
  }
}
