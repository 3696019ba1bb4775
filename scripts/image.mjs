#!/usr/bin/env node
// npm run image: builds the Dockerfile into localhost/ipvs-node-controller:<version>.
// With a docker engine that answers (`docker info`): `docker build` on the official base images.
// Without one: buildah (else podman) on base images made on this machine by
// scripts/local-base-images.sh (Debian from debootstrap, Node.js from the npm registry), passed
// as the build arguments BUILD_IMAGE and RUNTIME_IMAGE. Set BUILD_IMAGE and RUNTIME_IMAGE in the
// environment to use other bases with any engine.
//
//   npm run image [-- --arch amd64|arm64] [-- --tag NAME:TAG ...]
//
// --arch builds for another architecture than this machine's (default: this machine's) under QEMU
// emulation: with buildah, on local bases of that architecture, inside
// scripts/with-arm64-emulation.sh (root). The default tag is localhost/ipvs-node-controller:<version>
// for this machine's architecture and <version>-<arch> for another; npm run release builds both.
//
// Version from package.json, revision from git (env REVISION overrides), source from the git
// remote `origin` (env SOURCE overrides).

import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const { version } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const env = {
  ...process.env,
  CONTAINERS_CONF: process.env.CONTAINERS_CONF ?? join(root, 'scripts', 'containers.conf'),
};

function out(command, args) {
  const r = spawnSync(command, args, { cwd: root, encoding: 'utf8', env });
  return r.status === 0 ? r.stdout.trim() : undefined;
}
function ok(command, args) {
  const r = spawnSync(command, args, { cwd: root, stdio: 'ignore', env, timeout: 20_000 });
  return r.status === 0;
}

const ARCHES = { x64: 'amd64', arm64: 'arm64' };
const hostArch = ARCHES[process.arch] ?? process.arch;
const tags = [];
let arch = hostArch;
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--tag' && argv[i + 1]) tags.push(argv[++i]);
  else if (argv[i] === '--arch' && ['amd64', 'arm64'].includes(argv[i + 1])) arch = argv[++i];
  else {
    console.error(
      `npm run image: unknown argument '${argv[i]}' (usage: npm run image [-- --arch amd64|arm64] [-- --tag NAME:TAG ...])`,
    );
    process.exit(2);
  }
}
const foreign = arch !== hostArch;
if (tags.length === 0) tags.push(`localhost/ipvs-node-controller:${version}${foreign ? `-${arch}` : ''}`);
/** A command, run under QEMU emulation when the architecture is not this machine's. */
const emulated = (command, args) =>
  foreign ? ['bash', [join(root, 'scripts', 'with-arm64-emulation.sh'), command, ...args]] : [command, args];

let revision = process.env.REVISION ?? out('git', ['rev-parse', 'HEAD']) ?? 'unknown';
if (!process.env.REVISION && revision !== 'unknown' && out('git', ['status', '--porcelain', '--untracked-files=no'])) {
  revision += '-dirty';
}
const source = process.env.SOURCE ?? out('git', ['remote', 'get-url', 'origin']) ?? 'unknown';

const engine = ok('docker', ['info'])
  ? 'docker'
  : ok('buildah', ['--version'])
    ? 'buildah'
    : ok('podman', ['--version'])
      ? 'podman'
      : undefined;
if (!engine) {
  console.error('npm run image: no docker engine answers and neither buildah nor podman is installed');
  process.exit(1);
}

const buildArgs = { VERSION: version, REVISION: revision, SOURCE: source };
if (process.env.BUILD_IMAGE) buildArgs.BUILD_IMAGE = process.env.BUILD_IMAGE;
if (process.env.RUNTIME_IMAGE) buildArgs.RUNTIME_IMAGE = process.env.RUNTIME_IMAGE;
if (engine !== 'docker' && !(buildArgs.BUILD_IMAGE && buildArgs.RUNTIME_IMAGE)) {
  // No registry to pull from: bases made here (kept and reused while their inputs are unchanged).
  const bases = spawnSync(...emulated('bash', [join(root, 'scripts', 'local-base-images.sh')]), {
    cwd: root,
    encoding: 'utf8',
    env: { ...env, ARCH: arch },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  if (bases.status !== 0) {
    console.error('npm run image: making the local base images failed');
    process.exit(1);
  }
  for (const line of bases.stdout.trim().split('\n')) {
    const m = /^(BUILD_IMAGE|RUNTIME_IMAGE)=(.+)$/.exec(line);
    if (m) buildArgs[m[1]] ??= m[2];
  }
}

const args =
  engine === 'buildah'
    ? ['bud', '--isolation', 'chroot', '--layers', '--pull-never']
    : engine === 'podman'
      ? ['build', '--isolation', 'chroot', '--layers', '--pull-never']
      : ['build'];
if (engine !== 'docker' && !buildArgs.BUILD_IMAGE?.startsWith('localhost/')) args.pop(); // may pull
args.push('--platform', `linux/${arch}`);
for (const [k, v] of Object.entries(buildArgs)) args.push('--build-arg', `${k}=${v}`);
for (const t of tags) args.push('-t', t);
args.push('-f', 'Dockerfile', '.');
console.error(`npm run image: ${engine} ${args.join(' ')}`);
const started = Date.now();
const build = spawnSync(...emulated(engine, args), { cwd: root, stdio: 'inherit', env });
if (build.status !== 0) {
  console.error(`npm run image: the build failed (${engine} exit ${build.status ?? build.signal})`);
  process.exit(1);
}
console.error(
  `npm run image: built ${tags.join(', ')} (linux/${arch}) in ${((Date.now() - started) / 1000).toFixed(0)} s (${engine}${foreign ? ', emulated' : ''})`,
);
if (engine !== 'docker') {
  // Each build leaves untagged stages behind (the layer cache of the next build): drop the old ones.
  spawnSync('podman', ['image', 'prune', '-f', '--filter', 'until=72h'], { cwd: root, stdio: 'ignore', env });
}
