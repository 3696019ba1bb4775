#!/usr/bin/env node
// `npm run preview [-- FLAGS]`: the controller's --dry-run, without root, for the example Services
// (examples/services.yaml) unless FLAGS name another --from-file (`-` for stdin).
//
// It runs the controller as package.json's bin does (bin/ipvs-node-controller.mjs: the bundle,
// with the image's Node flags). It rebundles only when the bundle is missing or older than src/,
// and only where it may write: after `sudo npm start` dist/ belongs to root, and a normal user's
// preview must still run (the bundler would fail with EACCES). A stale bundle it cannot replace is
// used with a warning.

import { spawnSync } from 'node:child_process';
import { accessSync, constants, readdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
// The bundle is what the launcher (package.json's bin) runs; esbuild makes it from src/ directly.
const bundle = join(root, 'dist', 'bundle', 'ipvs-node-controller.mjs');
const launcher = join(root, 'bin', 'ipvs-node-controller.mjs');

function newestMtime(dir) {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    newest = Math.max(newest, entry.isDirectory() ? newestMtime(path) : statSync(path).mtimeMs);
  }
  return newest;
}

function builtAt() {
  try {
    return statSync(bundle).mtimeMs;
  } catch {
    return undefined;
  }
}

function writable(path) {
  try {
    accessSync(path, constants.W_OK);
    return true;
  } catch (err) {
    return err.code === 'ENOENT' && path !== root ? writable(dirname(path)) : false;
  }
}

const built = builtAt();
if (built === undefined || built < newestMtime(join(root, 'src'))) {
  if (writable(join(root, 'dist')) && writable(join(root, 'dist', 'bundle'))) {
    const build = spawnSync(process.execPath, [join(root, 'scripts', 'bundle.mjs')], {
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    if (build.status !== 0) process.exit(build.status ?? 1);
  } else if (built === undefined) {
    process.stderr.write('preview: the controller is not built and dist/ is not writable: run `npm run build`\n');
    process.exit(1);
  } else {
    process.stderr.write(
      'preview: dist/ is older than src/ but belongs to another user (built with sudo?): showing that build;' +
        ' `sudo npm run build` refreshes it\n',
    );
  }
}

const args = process.argv.slice(2);
if (!args.some((a) => a === '--from-file' || a.startsWith('--from-file='))) {
  args.push('--from-file', join(root, 'examples', 'services.yaml'));
}
const run = spawnSync(process.execPath, [launcher, '--dry-run', ...args], { stdio: 'inherit' });
process.exit(run.status ?? 1);
