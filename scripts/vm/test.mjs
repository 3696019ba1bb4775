#!/usr/bin/env node
// The VM test layer: for each of Debian's kernels, one guest (scripts/vm/guest.mjs) runs
// `node test/run.mjs vm vm-kernel`: the real-IPVS scenarios of test/vm, then the kernel tests
// whose outcome depends on the kernel (test/run.mjs names them), each inside its own network and
// mount namespace as on the host. Ends with a summary per kernel (package, boot and run time,
// mocha's counts and failures) and fails if any kernel failed.
//
// Usage (root, after `npm run build`; `npm run test:vm` builds first):
//   node scripts/vm/test.mjs [--timeout S] [kernel...]    kernels: 5.10 6.1 6.12 (default: all three)

import { parseArgs } from 'node:util';
import { abortOnStopSignals, accelerator, runInGuest } from './guest.mjs';
import { KERNELS, findKernel } from './kernels.mjs';

const SUMMARY_LINES = 400;

let parsed;
try {
  parsed = parseArgs({ allowPositionals: true, options: { timeout: { type: 'string', default: '1500' } } });
} catch (err) {
  usage(err.message);
}
const timeoutSeconds = Number(parsed.values.timeout);
if (!Number.isInteger(timeoutSeconds) || timeoutSeconds <= 0) usage(`--timeout ${parsed.values.timeout}`);
let kernels;
try {
  kernels = parsed.positionals.length > 0 ? parsed.positionals.map(findKernel) : KERNELS;
} catch (err) {
  usage(err.message);
}
if (process.getuid?.() !== 0) {
  console.error('vm tests need root: run `sudo npm run test:vm`');
  process.exit(2);
}

const controller = abortOnStopSignals();
console.log(
  `vm: QEMU accelerator ${accelerator() === 'kvm' ? 'kvm (/dev/kvm), tcg if KVM fails' : 'tcg (IPVS_NODE_CONTROLLER_VM_ACCEL=kvm for KVM)'}`,
);

const results = [];
for (const kernel of kernels) {
  if (controller.signal.aborted) break;
  console.log(`\n##### kernel ${kernel.name} (${kernel.suite}) #####`);
  // The guest's output goes through as it comes; from test/run.mjs's summary on it is also kept.
  const summary = [];
  let inSummary = false;
  let rest = '';
  const keep = (chunk) => {
    const lines = (rest + chunk.toString('utf8')).split('\n');
    rest = lines.pop() ?? '';
    for (const line of lines) {
      if (line === '=== summary ===') inSummary = true;
      else if (inSummary && summary.length < SUMMARY_LINES) summary.push(line);
    }
  };
  const tee = (out) => ({
    write(chunk) {
      keep(chunk);
      return out.write(chunk);
    },
  });
  const outcome = await runInGuest({
    kernel,
    command: [process.execPath, 'test/run.mjs', 'vm', 'vm-kernel'],
    cwd: process.cwd(),
    // A process costs seconds here: mocha's timeouts (waits, not measures) stretch accordingly.
    env: { IPVS_NODE_CONTROLLER_TEST_TIMEOUT_FACTOR: '5' },
    timeoutSeconds,
    stdout: tee(process.stdout),
    signal: controller.signal,
  });
  if (rest !== '' && inSummary) summary.push(rest);
  results.push({ kernel, outcome, summary });
  if (!outcome.commandStatus) console.log(`\nvm: kernel ${kernel.name}: ${outcome.reason}`);
}

console.log('\n===== VM layer summary =====');
let failed = results.length < kernels.length;
for (const { kernel, outcome, summary } of results) {
  const ok = outcome.status === 0;
  if (!ok) failed = true;
  const boot = outcome.bootSeconds === undefined ? 'no boot' : `boot ${outcome.bootSeconds.toFixed(0)} s`;
  console.log(
    `\n--- kernel ${kernel.name} (${outcome.record.package} ${outcome.record.version}): ${ok ? 'passed' : 'FAILED'}, ` +
      `${boot}, total ${outcome.totalSeconds.toFixed(0)} s, status ${outcome.status} ---`,
  );
  if (outcome.missingModules.length > 0) console.log(`modules not loaded: ${outcome.missingModules.join(' ')}`);
  if (summary.length > 0) console.log(summary.join('\n').trim());
  else console.log(outcome.commandStatus ? 'no summary from test/run.mjs' : outcome.reason.split('\n')[0]);
}
if (results.length < kernels.length) console.log('\ninterrupted: not every kernel ran');
process.exit(failed ? 1 : 0);

function usage(problem) {
  console.error(`vm: ${problem}`);
  console.error('usage: node scripts/vm/test.mjs [--timeout S] [5.10|6.1|6.12|bullseye|bookworm|trixie ...]');
  process.exit(2);
}
