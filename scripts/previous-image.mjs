#!/usr/bin/env node
// npm run image:previous: the image of the release before this one, built from its own commit
// with its own Dockerfile and scripts, tagged localhost/ipvs-node-controller:<previous version>.
// The container suite rolls the DaemonSet from it to this tree's image and back (old -> new ->
// old -> new) with the previous release's own manifests for the old pods, as an operator's
// upgrade and rollback do.
//
// The previous release is named below by version and commit (the commit its tag points at). Its
// source comes from git: `git archive` of that commit, fetched from `origin` when the clone does
// not hold it (a shallow clone). It is unpacked into dist/previous/<version> (its deploy/ is what
// the test renders), and its image is built only when no image of that tag carries that
// revision. The Debian packages come from Debian at build time, as they do for any rebuild; the
// code, the Node.js version and the base images are the release's.
//
//   npm run image:previous             build (or keep) the image; print its tag and source dir
//   npm run image:previous -- --check  print {version, commit, image, dir} as JSON when the image
//                                      and the source dir are there; else say what is missing, exit 1

import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The release before this one: what an operator upgrades from and rolls back to. */
export const PREVIOUS = { version: '0.4.0', commit: '9417f42bd1a3fd011b326fd7c57cbe2d683d030f' };
export const PREVIOUS_IMAGE = `localhost/ipvs-node-controller:${PREVIOUS.version}`;

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const PREVIOUS_DIR = join(root, 'dist', 'previous', PREVIOUS.version);
const env = {
  ...process.env,
  CONTAINERS_CONF: process.env.CONTAINERS_CONF ?? join(root, 'scripts', 'containers.conf'),
};

function fail(message) {
  console.error(`image:previous: ${message}`);
  process.exit(1);
}

function git(args, options = {}) {
  return spawnSync('git', args, { cwd: root, encoding: 'utf8', ...options });
}

/** The revision label of the image of that tag, or undefined when there is none. */
function imageRevision() {
  const r = spawnSync(
    'podman',
    ['image', 'inspect', '--format', '{{index .Labels "org.opencontainers.image.revision"}}', PREVIOUS_IMAGE],
    { encoding: 'utf8', env },
  );
  return r.status === 0 ? r.stdout.trim() : undefined;
}

function haveCommit() {
  return git(['cat-file', '-e', `${PREVIOUS.commit}^{commit}`]).status === 0;
}

function unpack() {
  if (existsSync(join(PREVIOUS_DIR, 'package.json'))) return;
  if (!haveCommit()) {
    console.log(`image:previous: ${PREVIOUS.commit} is not in this clone; fetching it from origin`);
    const fetched = git(['fetch', '--depth=1', 'origin', PREVIOUS.commit], { stdio: 'inherit' });
    if (fetched.status !== 0 || !haveCommit()) {
      fail(
        `the commit of ${PREVIOUS.version} (${PREVIOUS.commit}) is neither in this clone nor fetchable ` +
          'from origin: clone with history (not --depth), or fetch it, then run this again',
      );
    }
  }
  rmSync(PREVIOUS_DIR, { recursive: true, force: true });
  mkdirSync(PREVIOUS_DIR, { recursive: true });
  const archive = spawnSync(
    'bash',
    ['-o', 'pipefail', '-c', 'git archive "$1" | tar -x -C "$2"', '-', PREVIOUS.commit, PREVIOUS_DIR],
    {
      cwd: root,
      stdio: 'inherit',
    },
  );
  if (archive.status !== 0) {
    rmSync(PREVIOUS_DIR, { recursive: true, force: true });
    fail(`git archive ${PREVIOUS.commit} failed`);
  }
}

const check = process.argv.includes('--check');
const unknown = process.argv.slice(2).filter((a) => a !== '--check');
if (unknown.length > 0) fail(`unknown argument '${unknown[0]}' (usage: npm run image:previous [-- --check])`);

if (check) {
  const ok = existsSync(join(PREVIOUS_DIR, 'deploy')) && imageRevision() === PREVIOUS.commit;
  if (!ok) fail(`${PREVIOUS_IMAGE} of ${PREVIOUS.commit} or ${PREVIOUS_DIR} is missing: run npm run image:previous`);
  console.log(JSON.stringify({ ...PREVIOUS, image: PREVIOUS_IMAGE, dir: PREVIOUS_DIR }));
  process.exit(0);
}

unpack();
if (imageRevision() === PREVIOUS.commit) {
  console.log(`image:previous: ${PREVIOUS_IMAGE} (revision ${PREVIOUS.commit}) is built already`);
} else {
  const started = Date.now();
  const built = spawnSync('node', ['scripts/image.mjs', '--tag', PREVIOUS_IMAGE], {
    cwd: PREVIOUS_DIR,
    stdio: 'inherit',
    env: { ...env, REVISION: PREVIOUS.commit, SOURCE: process.env.SOURCE ?? 'unknown' },
  });
  if (built.status !== 0) fail(`building ${PREVIOUS_IMAGE} from ${PREVIOUS_DIR} failed (exit ${built.status})`);
  if (imageRevision() !== PREVIOUS.commit)
    fail(`${PREVIOUS_IMAGE} was built but does not carry revision ${PREVIOUS.commit}`);
  console.log(`image:previous: ${PREVIOUS_IMAGE} built in ${Math.round((Date.now() - started) / 1000)} s`);
}
console.log(`image:previous: ${PREVIOUS_IMAGE} from ${PREVIOUS_DIR}`);
