#!/usr/bin/env node
// Runs the unit tests, the build checks (what the build and install produced: addons, BPF object,
// bundle, image layout, version), then the kernel tests and the container tests, each inside a
// network and mount namespace of their own,
// so that nothing they program can reach the machine's firewall, routes or /run/netns.
// Kernel tests need root (CI runs as root); without it they are reported as not run and the run fails.

import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';

const mocha = ['node_modules/mocha/bin/mocha.js', '--reporter', process.env.MOCHA_REPORTER ?? 'spec'];
const only = process.argv.slice(2);
const suites = [
  { name: 'unit', glob: 'dist/test/unit/**/*.test.js', isolated: false },
  // Checks of what `npm ci` and `npm run build` produced on this machine; no root.
  { name: 'build', glob: 'dist/test/build/**/*.test.js', isolated: false },
  { name: 'kernel', glob: 'dist/test/kernel/**/*.test.js', isolated: true },
  // The built image under the DaemonSet of each overlay, run by podman as a kubelet would
  // (skipped when the image is not built: npm run image).
  { name: 'container', glob: 'dist/test/container/**/*.test.js', isolated: true },
];

if (!existsSync('dist/test')) {
  console.error('dist/test is missing: run `npm run build` first (npm test does)');
  process.exit(2);
}

let failed = false;
for (const suite of suites) {
  if (only.length > 0 && !only.includes(suite.name)) continue;
  console.log(`\n=== ${suite.name} tests ===`);
  let cmd = process.execPath;
  let args = [...mocha, suite.glob];
  if (suite.isolated) {
    if (process.getuid?.() !== 0) {
      console.error(`${suite.name} tests need root (network namespaces, nftables, iptables): run \`sudo npm test\``);
      failed = true;
      continue;
    }
    cmd = 'unshare';
    // A tmpfs on /run/netns inside the private mount namespace: the `ip netns` names the tests
    // create never appear on the host, not even as dangling entries while the tests run. And a
    // bpffs of the tests' own at /sys/fs/bpf, as a node has one: a cleanup fails where it finds
    // none, and the host's pins (if any) are never seen.
    args = [
      '--net',
      '--mount',
      '--propagation',
      'private',
      '--',
      'sh',
      '-c',
      'mkdir -p /run/netns && mount -t tmpfs -o mode=0755 ipvs-node-controller-tests /run/netns && ' +
        'mount -t bpf ipvs-node-controller-tests /sys/fs/bpf && exec "$0" "$@"',
      process.execPath,
      ...args,
    ];
  }
  const result = spawnSync(cmd, args, { stdio: 'inherit' });
  if (result.status !== 0) failed = true;
}
process.exit(failed ? 1 : 0);
