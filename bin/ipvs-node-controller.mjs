#!/usr/bin/env node
// ipvs-node-controller: the one way to start the controller, for package.json's `bin` and the
// image's ENTRYPOINT alike. It runs the bundle (dist/bundle/ipvs-node-controller.mjs, made by
// `npm run build`) under this same `node` with the flags of package.json's
// `ipvsNodeController.nodeFlags`, then any flags this launcher was itself given
// (`node --max-old-space-size=200 bin/ipvs-node-controller.mjs ...`), then the arguments.
//
// Where Node.js has process.execve (22.15, 23.11 and later: the image's Node 24) the launcher
// replaces itself with that process: same PID, so the controller receives every signal itself
// and its exit code is the process's, and no second Node.js stays resident. On older Node.js it
// runs the controller as a child, forwards SIGTERM, SIGINT and SIGHUP to it, and ends as the
// child ended: with its exit code, or killed by the same signal.
//
//   ipvs-node-controller --dry-run --from-file services.yaml     (npm's bin link)
//   node bin/ipvs-node-controller.mjs --version                  (the image: /opt/ipvs-node-controller)

import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { constants } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const PROGRAM = 'ipvs-node-controller';
// Node.js resolves the symlinks to a main module (npm's bin links, the image's PATH link): this is
// the package's own bin/.
const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const bundle = join(root, 'dist', 'bundle', 'ipvs-node-controller.mjs');

function fail(message) {
  process.stderr.write(`${PROGRAM}: ${message}\n`);
  process.exit(1);
}

let nodeFlags;
try {
  nodeFlags = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).ipvsNodeController.nodeFlags;
  if (!Array.isArray(nodeFlags) || !nodeFlags.every((f) => typeof f === 'string')) throw new Error('not a list');
} catch (err) {
  fail(`cannot read ipvsNodeController.nodeFlags of ${join(root, 'package.json')}: ${err.message}`);
}
if (!existsSync(bundle)) fail(`${bundle} is missing: run \`npm run build\``);

const args = [...nodeFlags, ...process.execArgv, bundle, ...process.argv.slice(2)];

if (typeof process.execve === 'function') {
  try {
    process.execve(process.execPath, [process.execPath, ...args], process.env);
  } catch (err) {
    fail(`cannot start ${process.execPath}: ${err.message}`);
  }
}

// A session of its own (setsid): a terminal's Ctrl-C or hangup reaches the launcher only, which
// forwards it once. Were the child in the terminal's foreground group too, it would receive a
// second SIGINT, and a second stop request makes the controller stop at once, not gracefully.
// Without a controlling terminal it still reads and writes the terminal it inherited.
const child = spawn(process.execPath, args, { stdio: 'inherit', detached: true });
const FORWARDED = ['SIGTERM', 'SIGINT', 'SIGHUP'];
const forward = (signal) => child.kill(signal);
for (const signal of FORWARDED) process.on(signal, forward);
child.on('error', (err) => fail(`cannot start ${process.execPath}: ${err.message}`));
child.on('exit', (code, signal) => {
  if (signal === null) process.exit(code ?? 1);
  for (const s of FORWARDED) process.removeListener(s, forward);
  process.kill(process.pid, signal);
  // A signal whose default action does not end a process: the shell's convention.
  setImmediate(() => process.exit(128 + (constants.signals[signal] ?? 0)));
});
