// A V8 heap snapshot (.heapsnapshot) as the heap profile (bench/heap-profile.ts) reads it: the
// snapshot's graph in flat typed arrays, and its dominator tree with each node's retained size.
// bench/heap-summary.ts groups the bytes.

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
