#!/usr/bin/env node
// Runs one command in a QEMU guest booted from one of Debian's kernels, with real IPVS.
//
// Usage (as root, from the checkout or any directory):
//   node scripts/vm/run.mjs --kernel <5.10|6.1|6.12|bullseye|bookworm|trixie> [options] -- <command...>
// Options:
//   --kernel K        which kernel (required): 5.10 (bullseye), 6.1 (bookworm), 6.12 (trixie)
//   --cwd DIR         where the command runs in the guest (default: the current directory)
//   --env KEY=VALUE   an environment variable for the command (repeatable); CI, UPDATE_GOLDEN,
//                     MOCHA_* and IPVS_NODE_CONTROLLER_* pass through from the caller anyway
//   --timeout S       kill the guest after S seconds (default 1800): exit 124
//   --memory MIB      guest memory (default 3072); --cpus N (default 2)
//   --console         stream the guest kernel's console to stderr (boot messages, oopses)
//   --fetch           only fetch the kernel and build its initramfs, boot nothing
// Examples:
//   node scripts/vm/run.mjs --kernel 6.1 -- ipvsadm -Ln
//   node scripts/vm/run.mjs --kernel 6.12 -- sh -c 'modprobe ip_vs && node --version'
//   node scripts/vm/run.mjs --kernel 5.10 -- node node_modules/mocha/bin/mocha.js dist/test/vm/x.test.js
//
// The guest's root is the host's root filesystem (read-only, under a tmpfs overlay: writes stay in
// the guest), so the checkout, node (this node's binary), nft, iptables-legacy/iptables-nft,
// ipvsadm, ipset, conntrack and python3 are at the same paths. Inside: the Debian kernel's own
// modules at /lib/modules/$(uname -r) (modprobe and autoloading work; ip_vs, nf_tables, the
// iptables and nft modules, veth, dummy, bridge are loaded already), proc, sysfs, devtmpfs,
// cgroup2 at /sys/fs/cgroup, bpffs at /sys/fs/bpf, tmpfs at /run and /tmp, `lo` up. The command
// runs as root with PATH, HOME=/root. Its stdout and stderr come back as it writes them.
//
// Exit status: the command's own; 124 when the guest timed out; 125 when the guest ended without
// one (kernel panic, failed boot: the console's last lines are printed); 2 for a usage error.
// SIGINT/SIGTERM kill the guest. Kernels are fetched once into the cache (scripts/vm/kernels.mjs).

import { parseArgs } from 'node:util';
import { resolve } from 'node:path';
import { abortOnStopSignals, runInGuest } from './guest.mjs';
import { ensureInitramfs, ensureKernel, findKernel } from './kernels.mjs';

let parsed;
try {
  parsed = parseArgs({
    allowPositionals: true,
    options: {
      kernel: { type: 'string' },
      cwd: { type: 'string' },
      env: { type: 'string', multiple: true, default: [] },
      timeout: { type: 'string', default: '1800' },
      memory: { type: 'string', default: '3072' },
      cpus: { type: 'string', default: '2' },
      console: { type: 'boolean', default: false },
      fetch: { type: 'boolean', default: false },
    },
  });
} catch (err) {
  usage(err.message);
}
const { values, positionals } = parsed;
if (!values.kernel) usage('--kernel is required');
let kernel;
try {
  kernel = findKernel(values.kernel);
} catch (err) {
  usage(err.message);
}
if (values.fetch) {
  const record = ensureKernel(kernel);
  ensureInitramfs(record);
  console.log(`${record.suite}: ${record.package} ${record.version} (kernel ${record.release}) in ${record.dir}`);
  process.exit(0);
}
if (positionals.length === 0) usage('no command: put it after --');
const env = {};
for (const pair of values.env) {
  const eq = pair.indexOf('=');
  if (eq <= 0) usage(`--env ${pair}: expected KEY=VALUE`);
  env[pair.slice(0, eq)] = pair.slice(eq + 1);
}
const numbers = {};
for (const key of ['timeout', 'memory', 'cpus']) {
  numbers[key] = Number(values[key]);
  if (!Number.isInteger(numbers[key]) || numbers[key] <= 0)
    usage(`--${key} ${values[key]}: expected a positive integer`);
}
if (process.getuid?.() !== 0) {
  console.error('vm: run as root (the guest shares the whole root filesystem)');
  process.exit(2);
}

const controller = abortOnStopSignals();
const outcome = await runInGuest({
  kernel,
  command: positionals,
  cwd: resolve(values.cwd ?? process.cwd()),
  env,
  timeoutSeconds: numbers.timeout,
  memoryMiB: numbers.memory,
  cpus: numbers.cpus,
  onConsole: values.console ? (line) => process.stderr.write(`console: ${line}\n`) : undefined,
  signal: controller.signal,
});
const boot = outcome.bootSeconds === undefined ? 'did not boot' : `booted in ${outcome.bootSeconds.toFixed(1)} s`;
console.error(
  `vm: ${kernel.name} (${outcome.record.package} ${outcome.record.version}): ${boot}, ` +
    `ended after ${outcome.totalSeconds.toFixed(1)} s, status ${outcome.status}`,
);
if (outcome.missingModules.length > 0) console.error(`vm: modules not found: ${outcome.missingModules.join(' ')}`);
if (!outcome.commandStatus) console.error(`vm: ${outcome.reason}`);
if (process.exitCode === undefined) process.exitCode = outcome.status;

function usage(problem) {
  console.error(`vm: ${problem}`);
  console.error(
    'usage: node scripts/vm/run.mjs --kernel <5.10|6.1|6.12> [--cwd DIR] [--env K=V] [--timeout S] -- <command...>',
  );
  process.exit(2);
}
