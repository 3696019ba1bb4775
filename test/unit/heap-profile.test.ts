import { expect } from 'chai';
import { computeDominators, parseHeapSnapshot, type HeapGraph } from '../../bench/heap-snapshot.js';
import { retainerGrowth, summarizeHeap } from '../../bench/heap-summary.js';

// The layout V8 writes (Node 20): seven node fields, three edge fields.
const NODE_TYPES = [
  'hidden',
  'array',
  'string',
  'object',
  'code',
  'closure',
  'regexp',
  'number',
  'native',
  'synthetic',
  'concatenated string',
  'sliced string',
  'symbol',
  'bigint',
  'object shape',
];
const EDGE_TYPES = ['context', 'element', 'property', 'internal', 'hidden', 'shortcut', 'weak'];
const NODE_FIELDS = ['type', 'name', 'id', 'self_size', 'edge_count', 'trace_node_id', 'detachedness'];

interface TestNode {
  type: string;
  name: string;
  size: number;
  edges?: TestEdge[];
}

type TestEdge = [type: string, nameOrIndex: string | number, to: number];

/** A node of `type`, `name` and self size `size`, with `edges` to other nodes (by index). */
function node(type: string, name: string, size: number, ...edges: TestEdge[]): TestNode {
  return { type, name, size, edges };
}

/** A .heapsnapshot document as V8 lays it out, from a list of nodes (node 0 is the root). */
function snapshot(nodes: TestNode[]) {
  const strings: string[] = [''];
  const str = (s: string) => {
    const i = strings.indexOf(s);
    return i >= 0 ? i : strings.push(s) - 1;
  };
  const flatNodes: number[] = [];
  const flatEdges: number[] = [];
  nodes.forEach((n, id) => {
    const edges = n.edges ?? [];
    flatNodes.push(NODE_TYPES.indexOf(n.type), str(n.name), id * 2 + 1, n.size, edges.length, 0, 0);
    for (const [type, name, to] of edges)
      flatEdges.push(EDGE_TYPES.indexOf(type), typeof name === 'number' ? name : str(name), to * NODE_FIELDS.length);
  });
  return {
    snapshot: {
      meta: {
        node_fields: NODE_FIELDS,
        node_types: [NODE_TYPES, 'string', 'number', 'number', 'number', 'number', 'number'] as [
          string[],
          ...unknown[],
        ],
        edge_fields: ['type', 'name_or_index', 'to_node'],
        edge_types: [EDGE_TYPES, 'string_or_number', 'node'] as [string[], ...unknown[]],
      },
      node_count: nodes.length,
    },
    nodes: flatNodes,
    edges: flatEdges,
    strings,
  };
}

/** Graph of plain nodes from adjacency lists (property edges), every node 10 bytes. */
function plainGraph(adjacency: number[][]): HeapGraph {
  return parseHeapSnapshot(
    snapshot(
      adjacency.map((to, i) => ({
        type: i === 0 ? 'synthetic' : 'object',
        name: i === 0 ? '' : `N${i}`,
        size: 10,
        edges: to.map((t, k): [string, string, number] => ['property', `e${k}`, t]),
      })),
    ),
  );
}

/** Immediate dominators by definition: d dominates v when v is unreachable from 0 without d. */
function bruteForceIdom(adjacency: number[][]): number[] {
  const n = adjacency.length;
  const reachable = (without: number) => {
    const seen = new Array<boolean>(n).fill(false);
    if (without === 0) return seen;
    const stack = [0];
    seen[0] = true;
    while (stack.length > 0) {
      const v = stack.pop()!;
      for (const w of adjacency[v]!)
        if (w !== without && !seen[w]) {
          seen[w] = true;
          stack.push(w);
        }
    }
    return seen;
  };
  const all = reachable(-1);
  const dominators: number[][] = Array.from({ length: n }, () => []);
  for (let d = 0; d < n; d++) {
    const seen = reachable(d);
    for (let v = 0; v < n; v++) if (v !== d && all[v] && !seen[v]) dominators[v]!.push(d);
  }
  // The immediate dominator is the strict dominator that all the others dominate too.
  return dominators.map((ds, v) => {
    if (v === 0) return 0;
    if (!all[v]) return -1;
    return ds.reduce((best, d) => (dominators[d]!.length > dominators[best]!.length ? d : best), ds[0]!);
  });
}

function seeded(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

describe('heap profile: snapshot parser', () => {
  it('reads nodes, sizes, names and edges from the flat arrays', () => {
    const g = parseHeapSnapshot(
      JSON.stringify(
        snapshot([
          { type: 'synthetic', name: '', size: 0, edges: [['element', 1, 1]] },
          { type: 'object', name: 'Informer', size: 40, edges: [['property', 'objects', 2]] },
          { type: 'string', name: 'svc-1', size: 24 },
        ]),
      ),
    );
    expect(g.nodeCount).to.equal(3);
    expect([...g.selfSize]).to.deep.equal([0, 40, 24]);
    expect(g.nodeTypes[g.nodeType[1]!]).to.equal('object');
    expect(g.strings[g.nodeName[1]!]).to.equal('Informer');
    expect([...g.firstEdge]).to.deep.equal([0, 1, 2, 2]);
    expect([...g.edgeTo]).to.deep.equal([1, 2]);
    expect(g.edgeTypes[g.edgeType[1]!]).to.equal('property');
    expect(g.strings[g.edgeNameOrIndex[1]!]).to.equal('objects');
    expect(g.edgeNameOrIndex[0]).to.equal(1);
  });

  it('rejects an edge that points inside a node, and edge counts that do not add up', () => {
    const bad = snapshot([
      { type: 'synthetic', name: '', size: 0, edges: [['property', 'a', 1]] },
      { type: 'object', name: 'A', size: 8 },
    ]);
    bad.edges[2] = 3;
    expect(() => parseHeapSnapshot(bad)).to.throw(/edge 0 points at 3/);
    const short = snapshot([{ type: 'synthetic', name: '', size: 0, edges: [['property', 'a', 0]] }]);
    short.edges.length = 0;
    expect(() => parseHeapSnapshot(short)).to.throw(/count 1 edges/);
    expect(() => parseHeapSnapshot('{"nodes":[]}')).to.throw(/missing snapshot.meta/);
  });
});

describe('heap profile: dominators and retained sizes', () => {
  // 0 root -> 1 Informer, 2 Model; both hold 3 Map (shared); 1 holds 4 Object {x} which holds
  // 5 a string; 2 reaches 4 only weakly, and 1 reaches 5 by a shortcut: neither keeps them.
  // 3 and 6 form a cycle; 7 is unreachable.
  const nodes: TestNode[] = [
    node('synthetic', '', 0, ['element', 1, 1], ['element', 2, 2]),
    node('object', 'Informer', 100, ['property', 'objects', 3], ['property', 'record', 4], ['shortcut', 'fast', 5]),
    node('object', 'Model', 200, ['property', 'cache', 3], ['weak', 'maybe', 4]),
    node('object', 'Map', 30, ['internal', 'table', 6]),
    node('object', 'Object', 40, ['property', 'x', 5]),
    node('string', 'svc-1', 24),
    node('array', '', 500, ['internal', '0', 3]),
    node('object', 'Lost', 1000, ['property', 'y', 1]),
  ];

  it('finds the immediate dominators, ignoring weak edges and shortcuts off the root', () => {
    const d = computeDominators(parseHeapSnapshot(snapshot(nodes)));
    expect([...d.idom]).to.deep.equal([0, 0, 0, 0, 1, 4, 3, -1]);
  });

  it('sums retained sizes up the dominator tree; the unreachable retain nothing', () => {
    const d = computeDominators(parseHeapSnapshot(snapshot(nodes)));
    expect([...d.retained]).to.deep.equal([894, 164, 200, 530, 64, 24, 500, 0]);
    expect(d.order[0]).to.equal(0);
    expect([...d.order].sort()).to.deep.equal([0, 1, 2, 3, 4, 5, 6]);
  });

  it('agrees with the definition on the irreducible graph of Cooper, Harvey and Kennedy', () => {
    // Their figure 4, root renumbered 0: 0->1,2; 1->3; 2->4,5; 3->4; 4->3,5; 5->4.
    const adjacency = [[1, 2], [3], [4, 5], [4], [3, 5], [4]];
    const d = computeDominators(plainGraph(adjacency));
    expect([...d.idom]).to.deep.equal(bruteForceIdom(adjacency));
    expect([...d.idom]).to.deep.equal([0, 0, 0, 0, 0, 0]);
  });

  it('agrees with the definition on random graphs with cycles and unreachable nodes', () => {
    const random = seeded(7);
    for (let round = 0; round < 200; round++) {
      const n = 2 + Math.floor(random() * 25);
      const adjacency = Array.from({ length: n }, () =>
        Array.from({ length: Math.floor(random() * 4) }, () => Math.floor(random() * n)),
      );
      const d = computeDominators(plainGraph(adjacency));
      const expected = bruteForceIdom(adjacency);
      expect([...d.idom], `graph ${JSON.stringify(adjacency)}`).to.deep.equal(expected);
      // Retained size: the node and every node it dominates, directly or not.
      for (let v = 0; v < n; v++) {
        let dominated = 0;
        for (let w = 0; w < n; w++) {
          let x = w;
          while (expected[x] !== -1 && x !== v && x !== 0) x = expected[x]!;
          if (expected[w] !== -1 && (x === v || v === 0)) dominated++;
        }
        expect(d.retained[v], `retained of ${v} in ${JSON.stringify(adjacency)}`).to.equal(dominated * 10);
      }
    }
  });
});

describe('heap profile: grouping', () => {
  // root -> Informer -> Map -> table -> two records Object {name,ip} -> strings; a nested
  // Object {name,ip} inside the first record is not counted twice in its class's retained size.
  const g = parseHeapSnapshot(
    snapshot([
      node('synthetic', '', 0, ['element', 1, 1]),
      node('object', 'Informer', 40, ['property', 'objects', 2]),
      node('object', 'Map', 32, ['internal', 'table', 3]),
      node('array', '', 100, ['internal', '3', 4], ['internal', '6', 5]),
      node('object', 'Object', 56, ['property', 'name', 6], ['property', 'ip', 7], ['property', '__proto__', 8]),
      node('object', 'Object', 56, ['property', 'name', 6], ['property', 'ip', 7]),
      node('string', 'svc', 20),
      node('string', '10.0.0.1', 24),
      node('object', 'Object', 16, ['property', 'name', 9]),
      node('concatenated string', 'a.b', 32),
    ]),
  );
  const summary = summarizeHeap(g, computeDominators(g), 0.2, 2);

  it('groups plain objects by their property names and strings of every kind together', () => {
    const record = summary.classes.get('Object {name,ip}')!;
    expect(record).to.deep.include({ count: 2, selfBytes: 112 });
    expect(summary.classes.get('(string)')).to.deep.include({ count: 3, selfBytes: 76 });
    expect(summary.classes.get('Informer')).to.deep.include({ count: 1, selfBytes: 40, retainedBytes: 376 });
    expect(summary.totalBytes).to.equal(376);
    expect(summary.reachableBytes).to.equal(376);
  });

  it('counts a class its top-most objects retain, once', () => {
    // The shared strings are dominated by the table: neither record retains them.
    expect(summary.classes.get('Object {name,ip}')!.retainedBytes).to.equal(56 + 16 + 32 + 56);
    expect(summary.classes.get('Object {name}')!.retainedBytes).to.equal(48);
  });

  it('labels large retainers by the edge their dominator holds them by', () => {
    const labels = summary.retainers.map((r) => r.label);
    expect(labels.slice(0, 3)).to.deep.equal([
      'Informer held as (root).[1]',
      'Map held as Informer.objects',
      '(array) held as Map.table',
    ]);
  });

  it('names containers by their holder in the owner table', () => {
    expect([...summary.owners.get('Object {name,ip}')!]).to.deep.equal([['Informer.objects.table.[]', 112]]);
    expect(summary.owners.get('(string)')!.get('(shared under Informer.objects.table)')).to.equal(44);
  });

  it('reports the retainers that grew, per Service', () => {
    const grown = retainerGrowth(
      [{ label: 'Map held as Informer.objects', retainedBytes: 1000 }],
      [
        { label: 'Map held as Informer.objects', retainedBytes: 3000 },
        { label: 'Map held as Informer.objects', retainedBytes: 500 },
        { label: 'Array held as Model.keys', retainedBytes: 1000 },
        { label: 'Code held as (root).[0]', retainedBytes: 0 },
      ],
      100,
    );
    expect(grown).to.deep.equal([
      { label: 'Map held as Informer.objects', retainedBytes: 3000, perService: 20 },
      { label: 'Array held as Model.keys', retainedBytes: 1000, perService: 10 },
    ]);
  });
});
