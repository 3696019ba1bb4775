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
// child ended: with its exit code, or killed by the same signal. The child lives no longer than
// the launcher: it holds the read end of a pipe whose other end only the launcher holds, and
// when that end closes (the launcher ended in any way, SIGKILL included) it stops as on SIGTERM
// (the rules stay in place), or is killed 10 s later if the stop has not ended it.
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
//
// Out of the launcher's process group, the child is not reached by what reaches the group only
// (a SIGKILL of the group, or of the launcher, cannot be forwarded): the lifeline below ends it.
// It is file descriptor 3 of the child, read by a module the child imports before the bundle.
const LIFELINE_FD = 3;
const LIFELINE_GRACE_MS = 10_000;
const lifeline = `
import net from 'node:net';
const line = new net.Socket({ fd: ${LIFELINE_FD}, readable: true, writable: false });
const stop = () => {
  process.kill(process.pid, 'SIGTERM');
  setTimeout(() => process.kill(process.pid, 'SIGKILL'), ${LIFELINE_GRACE_MS}).unref();
};
line.on('end', stop);
line.on('error', stop);
line.resume();
line.unref();
`;
const child = spawn(process.execPath, [`--import=data:text/javascript,${encodeURIComponent(lifeline)}`, ...args], {
  stdio: ['inherit', 'inherit', 'inherit', 'pipe'],
  detached: true,
});
// Never written, never read: it only has to stay open while the launcher lives.
child.stdio[LIFELINE_FD]?.unref?.();
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
