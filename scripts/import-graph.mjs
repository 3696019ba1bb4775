// The import graph of src/ and its loops, from dependency-cruiser's resolution of the imports
// (type-only imports included: they tie folders together as much as values do).
//
//   node scripts/import-graph.mjs           the graph between the parts of src/, one line each
//   node scripts/import-graph.mjs --check   no output when there is no loop; else each loop, exit 1
//
// npm run lint runs --check. The parts are the folders of src/ and the files directly in it, each
// on its own: a file of src/ that imports a folder (main.ts once did) is a part above that folder,
// and a folder that imports it back closes a loop. dependency-cruiser's own rules
// (.dependency-cruiser.mjs) reject loops between modules and between folders nested deeper, and
// are applied in the same run.

import { cruise, format } from 'dependency-cruiser';
import extractTSConfig from 'dependency-cruiser/config-utl/extract-ts-config';
import rules from '../.dependency-cruiser.mjs';

/** The part of src/ a module belongs to: `kube/` for src/kube/watch.ts, `log.ts` for src/log.ts. */
export function partOf(path) {
  const rest = path.replace(/^src\//, '');
  const slash = rest.indexOf('/');
  return slash < 0 ? rest : rest.slice(0, slash + 1);
}

/** part -> the set of parts it imports, from [from, to] module paths. */
export function partGraph(edges) {
  const graph = new Map();
  for (const [from, to] of edges) {
    const a = partOf(from);
    const b = partOf(to);
    if (!graph.has(a)) graph.set(a, new Set());
    if (!graph.has(b)) graph.set(b, new Set());
    if (a !== b) graph.get(a).add(b);
  }
  return graph;
}

/** The loops of a graph: its strongly connected components of more than one node (Tarjan). */
export function loopsOf(graph) {
  const index = new Map();
  const low = new Map();
  const stack = [];
  const onStack = new Set();
  const loops = [];
  let next = 0;
  const visit = (v) => {
    index.set(v, next);
    low.set(v, next);
    next++;
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v), low.get(w)));
      } else if (onStack.has(w)) {
        low.set(v, Math.min(low.get(v), index.get(w)));
      }
    }
    if (low.get(v) !== index.get(v)) return;
    const component = [];
    let w;
    do {
      w = stack.pop();
      onStack.delete(w);
      component.push(w);
    } while (w !== v);
    if (component.length > 1) loops.push(component.sort());
  };
  for (const v of [...graph.keys()].sort()) if (!index.has(v)) visit(v);
  return loops;
}

async function main(argv) {
  const check = argv.includes('--check');
  const { options } = rules;
  const result = await cruise(
    ['src'],
    { ...options, validate: true, ruleSet: { forbidden: rules.forbidden } },
    options.enhancedResolveOptions,
    { tsConfig: extractTSConfig(options.tsConfig.fileName) },
  );
  const { modules, summary } = result.output;
  const edges = modules.flatMap((m) =>
    m.dependencies.filter((d) => d.resolved.startsWith('src/')).map((d) => [m.source, d.resolved]),
  );
  const graph = partGraph(edges);
  const loops = loopsOf(graph);
  if (!check) {
    for (const part of [...graph.keys()].sort()) {
      console.log(`${part} -> ${[...graph.get(part)].sort().join(' ') || '(nothing)'}`);
    }
    console.log(`\n${modules.length} modules, ${edges.length} imports; loops between parts: ${loops.length}`);
  }
  for (const loop of loops) {
    console.error(`error import loop between parts of src/: ${loop.join(' ')}`);
    // One import for each arrow inside the loop: where to start cutting.
    const shown = new Set();
    for (const [from, to] of edges) {
      const arrow = `${partOf(from)} -> ${partOf(to)}`;
      if (partOf(from) === partOf(to) || !loop.includes(partOf(from)) || !loop.includes(partOf(to))) continue;
      if (shown.has(arrow)) continue;
      shown.add(arrow);
      console.error(`  ${arrow}: ${from} imports ${to}`);
    }
  }
  if (summary.violations.length > 0) console.error((await format(result.output, { outputType: 'err' })).output);
  return loops.length > 0 || summary.error > 0 ? 1 : 0;
}

if (import.meta.url === `file://${process.argv[1]}`) process.exitCode = await main(process.argv.slice(2));
