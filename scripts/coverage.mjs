// Line, branch and function coverage of a folder of src/, from the V8 coverage the tests wrote
// (NODE_V8_COVERAGE), counted as c8 counts it: every block range V8 reports inside a function is
// a branch, a function's own range is the function, and a line is covered when the innermost
// range holding its first character ran. What did not run is shown at its TypeScript line
// (the source maps tsc writes beside dist/).
//
//   npm run build
//   NODE_V8_COVERAGE=/tmp/v8 node node_modules/mocha/bin/mocha.js 'dist/test/unit/**/*.test.js'
//   node scripts/coverage.mjs /tmp/v8 reconciler

import { readFileSync, readdirSync } from 'node:fs';
import { SourceMap } from 'node:module';
import { resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

/** Per script of dist/src/<folder>/, the functions of each run that loaded it. */
function runsOf(v8Dir, folder) {
  const prefix = pathToFileURL(resolve('dist/src', folder)).href + '/';
  const runs = new Map();
  for (const file of readdirSync(v8Dir)) {
    for (const script of JSON.parse(readFileSync(resolve(v8Dir, file), 'utf8')).result) {
      if (!script.url.startsWith(prefix) || !script.url.endsWith('.js')) continue;
      runs.set(script.url, [...(runs.get(script.url) ?? []), script.functions]);
    }
  }
  return runs;
}

/** A line that holds code: not blank, not a comment, an import or closing brackets alone. */
const isCode = (t) =>
  t !== '' && !/^(\/\/|\/\*|\*|import |export \{)/.test(t) && !/^[}\])]+[;,)]*$/.test(t) && !t.startsWith('//#');

function report(url, runs) {
  const path = fileURLToPath(url);
  const src = readFileSync(path, 'utf8');
  const map = new SourceMap(JSON.parse(readFileSync(`${path}.map`, 'utf8')));
  const starts = [0];
  for (let i = 0; i < src.length; i++) if (src[i] === '\n') starts.push(i + 1);
  const tsLine = (offset) => {
    const line = starts.findLastIndex((s) => s <= offset);
    const entry = map.findEntry(line, offset - starts[line]);
    return entry.originalLine === undefined ? `js:${line + 1}` : entry.originalLine + 1;
  };
  // A range counts as run when any run ran it.
  const functions = new Map();
  const branches = new Map();
  for (const run of runs) {
    for (const fn of run) {
      fn.ranges.forEach((r, i) => {
        const into = i === 0 ? functions : branches;
        const key = `${r.startOffset}:${r.endOffset}`;
        into.set(key, { ...r, name: fn.functionName, count: (into.get(key)?.count ?? 0) + r.count });
      });
    }
  }
  // The module's own top level is no function of the source.
  const fns = [...functions.values()].filter((f) => !(f.startOffset === 0 && f.endOffset >= src.length - 1));
  const ranges = [...functions.values(), ...branches.values()];
  const innermost = (offset) =>
    ranges
      .filter((r) => r.startOffset <= offset && offset < r.endOffset)
      .sort((a, b) => a.endOffset - a.startOffset - (b.endOffset - b.startOffset))[0];
  const lines = src
    .split('\n')
    .map((text, i) => ({ text: text.trim(), offset: starts[i] + text.search(/\S/) }))
    .filter((l) => isCode(l.text));
  const missed = lines.filter((l) => innermost(l.offset)?.count === 0);
  const notRun = [...branches.values()].filter((b) => b.count === 0);
  const fnsNotRun = fns.filter((f) => f.count === 0);
  const name = path.replace(/.*\/dist\//, '').replace(/\.js$/, '.ts');
  return {
    name,
    lines: [lines.length - missed.length, lines.length],
    branches: [branches.size - notRun.length, branches.size],
    functions: [fns.length - fnsNotRun.length, fns.length],
    details: [
      ...notRun.map(
        (b) =>
          `  branch not taken: ${name}:${tsLine(b.startOffset)} ${JSON.stringify(src.slice(b.startOffset, b.startOffset + 60))}`,
      ),
      ...fnsNotRun.map((f) => `  function not run: ${name}:${tsLine(f.startOffset)} ${f.name}`),
      ...(missed.length > 0
        ? [`  lines not run: ${[...new Set(missed.map((l) => tsLine(l.offset)))].join(', ')}`]
        : []),
    ],
  };
}

const [v8Dir, folder] = process.argv.slice(2);
if (!v8Dir || !folder) {
  console.error('usage: node scripts/coverage.mjs V8_COVERAGE_DIR FOLDER_OF_SRC');
  process.exit(2);
}
const figures = (f) =>
  ['lines', 'branches', 'functions']
    .map((k) => `${k} ${f[k][0]}/${f[k][1]} (${((100 * f[k][0]) / Math.max(1, f[k][1])).toFixed(1)}%)`)
    .join(', ');
const total = { lines: [0, 0], branches: [0, 0], functions: [0, 0] };
for (const [url, runs] of [...runsOf(v8Dir, folder)].sort(([a], [b]) => a.localeCompare(b))) {
  const r = report(url, runs);
  console.log(`${r.name}: ${figures(r)}`);
  for (const line of r.details) console.log(line);
  for (const k of Object.keys(total)) total[k] = [total[k][0] + r[k][0], total[k][1] + r[k][1]];
}
console.log(`src/${folder}/: ${figures(total)}`);
