#!/usr/bin/env node
// Runs kernel test files (or the tests of them that --grep names) again and again, each run in a
// network and mount namespace of its own as `npm test` runs them, beside busy loops that keep
// the CPUs loaded, and stops at the first run that fails. This is how a test that failed once in
// a while is shown to hold: "N runs in a row, loaded".
//
//   node scripts/repeat-kernel-test.mjs --runs 50 --hogs 2 [--grep RE] FILE...
//
// FILE is a kernel test's name (nft-resync) or its compiled path. Every run's time, outcome and
// the load average at its end are printed; a failed run's whole output is printed, and the exit
// status is 1. Needs root and `npm run build` (the tests and the bundle they start).

import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import { isolated } from '../test/isolation.mjs';

const usage = 'usage: node scripts/repeat-kernel-test.mjs --runs N [--hogs K] [--grep RE] FILE...';
let parsed;
try {
  parsed = parseArgs({
    allowPositionals: true,
    options: {
      runs: { type: 'string', default: '10' },
      hogs: { type: 'string', default: '0' },
      grep: { type: 'string' },
    },
  });
} catch (err) {
  console.error(`${err.message}\n${usage}`);
  process.exit(2);
}
const runs = Number(parsed.values.runs);
const hogs = Number(parsed.values.hogs);
if (!Number.isInteger(runs) || runs < 1 || !Number.isInteger(hogs) || hogs < 0 || hogs > 64) {
  console.error(`--runs must be a whole number from 1, --hogs from 0 to 64\n${usage}`);
  process.exit(2);
}
if (parsed.positionals.length === 0) {
  console.error(`name at least one kernel test file\n${usage}`);
  process.exit(2);
}
const files = parsed.positionals.map((f) => (f.endsWith('.js') ? f : `dist/test/kernel/${f}.test.js`));
for (const f of files) {
  if (!existsSync(f)) {
    console.error(`${f} is missing: run \`npm run build\` first, or name a file of dist/test/kernel`);
    process.exit(2);
  }
}
if (process.getuid?.() !== 0) {
  console.error('kernel tests need root (network namespaces, nftables, iptables)');
  process.exit(2);
}

// Each busy loop is a process of its own, so that it competes for a CPU as another pod's
// workload would, at the same priority as the test.
const loops = [];
for (let i = 0; i < hogs; i++) {
  const loop = spawn(process.execPath, ['-e', 'for (;;) {}'], { stdio: 'ignore' });
  loop.unref();
  loops.push(loop);
}
const stopLoops = () => {
  for (const l of loops) l.kill('SIGKILL');
};
process.on('exit', stopLoops);
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => {
    stopLoops();
    process.exit(1);
  });
}

const mocha = ['node_modules/mocha/bin/mocha.js', '--reporter', 'dot', '--timeout', '120000'];
if (parsed.values.grep) mocha.push('--grep', parsed.values.grep);
console.log(
  `${runs} runs of ${files.join(' ')}${parsed.values.grep ? ` (--grep ${parsed.values.grep})` : ''} beside ${hogs} busy loops`,
);
const started = Date.now();
for (let run = 1; run <= runs; run++) {
  const { cmd, args } = isolated(process.execPath, [...mocha, ...files]);
  const t0 = Date.now();
  const { status, output } = await capture(cmd, args);
  const seconds = ((Date.now() - t0) / 1000).toFixed(1);
  const counts = [...output.matchAll(/^\s+(\d+ (?:passing|failing|pending))/gm)].map((m) => m[1]).join(', ');
  const load = loadavg()[0].toFixed(1);
  console.log(
    `run ${run}/${runs}: ${status === 0 ? 'passed' : 'FAILED'} in ${seconds} s (${counts || 'no mocha summary'}; load ${load})`,
  );
  if (status !== 0) {
    console.log(output);
    console.log(`${run - 1} runs in a row passed before run ${run} failed`);
    process.exit(1);
  }
  if (!/\d+ passing/.test(output)) {
    console.log(output);
    console.log(`run ${run} ran no test: check --grep`);
    process.exit(1);
  }
}
stopLoops();
console.log(
  `${runs} of ${runs} runs passed in a row in ${((Date.now() - started) / 1000).toFixed(0)} s, beside ${hogs} busy loops`,
);

function capture(cmd, args) {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (c) => (output += c));
    child.stderr.on('data', (c) => (output += c));
    child.on('error', (err) => resolve({ status: 127, output: `could not start ${cmd}: ${err.message}` }));
    child.on('close', (status, signal) => resolve({ status: signal ? 1 : (status ?? 1), output }));
  });
}
