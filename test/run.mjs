#!/usr/bin/env node
// Runs the unit tests, the build checks (what the build and install produced: addons, BPF object,
// bundle, image layout, version), then the kernel tests and the container tests, each inside a
// network and mount namespace of their own,
// so that nothing they program can reach the machine's firewall, routes or /run/netns.
// Kernel tests need root (CI runs as root); without it they are reported as not run and the run fails.

import { spawn } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { isolated } from './isolation.mjs';

// Tests check results, not time: a test without a timeout of its own gets one that a loaded
// 2-core machine does not reach with CPU-bound work (mocha's default is 2 s).
const mocha = [
  'node_modules/mocha/bin/mocha.js',
  '--reporter',
  process.env.MOCHA_REPORTER ?? 'spec',
  '--timeout',
  '120000',
];
// In the VM layer's guests (scripts/vm/test.mjs) every mocha timeout is multiplied by this factor.
if (process.env.IPVS_NODE_CONTROLLER_TEST_TIMEOUT_FACTOR) mocha.push('--require', 'scripts/vm/mocha-slow-guest.mjs');
const only = process.argv.slice(2);
const suites = [
  { name: 'unit', glob: 'dist/test/unit/**/*.test.js', isolated: false },
  // Checks of what `npm ci` and `npm run build` produced on this machine; no root.
  { name: 'build', glob: 'dist/test/build/**/*.test.js', isolated: false },
  { name: 'kernel', glob: 'dist/test/kernel/**/*.test.js', isolated: true },
  // The built image under the DaemonSet of each overlay, run by podman as a kubelet would
  // (skipped when the image is not built: npm run image).
  { name: 'container', glob: 'dist/test/container/**/*.test.js', isolated: true },
  // The VM layer (npm run test:vm) runs these two inside a guest of each of Debian's kernels
  // (scripts/vm/test.mjs); they run only when named. `vm`: the real-IPVS scenarios, which run the
  // controller with every backend on the kernel (what each programs, the packets it translates).
  // `vm-kernel`: the parts of test/kernel that add to them what depends on the kernel: every
  // packet row of semantics.md through the nft backend as --backend=auto sets it up on that
  // kernel (the map or the key set), the netlink batches and dumps the addon writes and reads,
  // whole writes under traffic (what those kernels' set lookups miss), and the conntrack
  // clean-up's filtered dumps and deletions by filter (CTA_FILTER: which filters each kernel
  // honours, which refuses a deletion by filter). The rest would
  // repeat what the scenarios show, at a process per probe costing seconds in the guest.
  { name: 'vm', glob: 'dist/test/vm/**/*.test.js', isolated: true, onlyWhenNamed: true },
  {
    name: 'vm-kernel',
    files: [
      'packets',
      'nft-element-batch',
      'nft-whole-write-difference',
      'nft-whole-write-packets',
      'conntrack-cleaner',
    ].map((name) => `dist/test/kernel/${name}.test.js`),
    // Of the whole writes' difference, what the kernel answers (dumps, the generation check,
    // the source-range set's elements): the rest is the same on every kernel, and 10,000 entries
    // take a minute in the guest.
    // Of the conntrack clean-up, the dumps and deletions, not the bounds: 70,000 entries do not
    // fit the guest's conntrack table (nf_conntrack_max follows its memory: 65,536 at 3 GiB).
    grep:
      'packets through the nft \\(addon\\) backend|nft map elements as a netlink batch|' +
      'nft whole writes under traffic|' +
      'nft whole writes write the difference (reads|in one JSON transaction|source ranges through the addon)|' +
      'conntrack clean-up on the kernel (deletes the entries|in process by dumps, walks|in process, with more ports|' +
      'in process, deletes (thousands|a few IPv4 tuples by a filter)|with untranslatedOnly|' +
      'a tuple with more entries than its share of one in-process call \\(by dumps\\) (deletes every|the same in IPv6))',
    isolated: true,
    onlyWhenNamed: true,
  },
];

if (!existsSync('dist/test')) {
  console.error('dist/test is missing: run `npm run build` first (npm test does)');
  process.exit(2);
}

// Each suite's output goes through as it comes, and is also kept: the end of the run repeats,
// for every suite that failed, its exit status, mocha's list of failures and the last lines
// it printed, so that the tail of a long CI log says what failed and where.
const KEPT_LINES = 60;
const MAX_FAILURE_LINES = 400;
const results = [];
let failed = false;
for (const suite of suites) {
  if (only.length > 0 ? !only.includes(suite.name) : suite.onlyWhenNamed) continue;
  console.log(`\n=== ${suite.name} tests ===`);
  if (suite.glob && !hasTestFiles(suite.glob)) {
    console.log(`no test files (${suite.glob})`);
    results.push({ name: suite.name, status: 0, signal: null, counts: 'no test files', failures: [], tail: [] });
    continue;
  }
  let cmd = process.execPath;
  let args = [...mocha, ...(suite.grep ? ['--grep', suite.grep] : []), ...(suite.files ?? [suite.glob])];
  if (suite.isolated) {
    if (process.getuid?.() !== 0) {
      console.error(`${suite.name} tests need root (network namespaces, nftables, iptables): run \`sudo npm test\``);
      failed = true;
      continue;
    }
    ({ cmd, args } = isolated(process.execPath, args));
  }
  const outcome = await runSuite(cmd, args);
  results.push({ name: suite.name, ...outcome });
  if (outcome.status !== 0) failed = true;
}

console.log('\n=== summary ===');
for (const r of results) {
  const how = r.signal ? `killed by ${r.signal}` : `exit ${r.status}`;
  console.log(`${r.name}: ${r.counts || 'no mocha summary'} (${how})`);
}
for (const r of results.filter((x) => x.status !== 0)) {
  console.log(`\n--- ${r.name} failed (${r.signal ? `killed by ${r.signal}` : `exit ${r.status}`}) ---`);
  if (r.failures.length > 0) console.log(r.failures.join('\n'));
  else console.log(`no failing test was reported; the suite's last lines:\n${r.tail.join('\n')}`);
}
process.exit(failed ? 1 : 0);

/** Whether the folder a suite glob starts with holds a compiled test file (mocha fails on none). */
function hasTestFiles(glob) {
  const dir = glob.slice(0, glob.indexOf('/**'));
  if (!existsSync(dir)) return false;
  return readdirSync(dir, { recursive: true }).some((f) => String(f).endsWith('.test.js'));
}

/** Runs one suite, passing its output through; returns its status and what to repeat. */
function runSuite(cmd, args) {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { stdio: ['inherit', 'pipe', 'pipe'] });
    const tail = [];
    const failures = [];
    let inFailures = false;
    let counts = '';
    const keep = (stream, out) => {
      let rest = '';
      stream.on('data', (chunk) => {
        out.write(chunk);
        const lines = (rest + chunk.toString('utf8')).split('\n');
        rest = lines.pop() ?? '';
        for (const line of lines) note(line);
      });
      stream.on('end', () => {
        if (rest !== '') note(rest);
      });
    };
    const note = (line) => {
      tail.push(line);
      if (tail.length > KEPT_LINES) tail.shift();
      if (/^\s+\d+ (passing|pending)\b/.test(line)) counts = counts ? `${counts}, ${line.trim()}` : line.trim();
      if (/^\s+\d+ failing\b/.test(line)) {
        counts = counts ? `${counts}, ${line.trim()}` : line.trim();
        inFailures = true;
      }
      if (inFailures && failures.length < MAX_FAILURE_LINES) failures.push(line);
    };
    keep(child.stdout, process.stdout);
    keep(child.stderr, process.stderr);
    child.on('error', (err) => {
      tail.push(`could not start ${cmd}: ${err.message}`);
      resolve({ status: 127, signal: null, counts, failures, tail });
    });
    child.on('close', (status, signal) => resolve({ status: status ?? 1, signal, counts, failures, tail }));
  });
}
