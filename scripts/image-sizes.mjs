#!/usr/bin/env node
// `npm run image:sizes [-- --json] [IMAGE ...]`: what the image's size is made of, the figures
// docs/operations.md ("The image") and the README give. For each image (default: this version's
// localhost/ipvs-node-controller:VERSION-amd64 and -arm64, those that exist) its file system is
// read from `podman export` of a container created from it (never started) and summed: Node.js
// (/usr/local/bin/node), the controller (/opt/ipvs-node-controller) and the rest (the Debian
// packages' files), with the packages /var/lib/dpkg/status lists. `podman images` gives the
// unpacked size; the compressed size (the layers a node pulls) comes from the release's
// release.json when `npm run release` made one for this version.

import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const { version } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const env = {
  ...process.env,
  CONTAINERS_CONF: process.env.CONTAINERS_CONF ?? join(root, 'scripts', 'containers.conf'),
};

const args = process.argv.slice(2);
const json = args.includes('--json');
const named = args.filter((a) => a !== '--json');
for (const a of named) {
  if (a.startsWith('-')) {
    process.stderr.write(
      `image-sizes: unknown option ${a}\nusage: node scripts/image-sizes.mjs [--json] [IMAGE ...]\n`,
    );
    process.exit(2);
  }
}

function podman(argv, options = {}) {
  const r = spawnSync('podman', argv, { env, maxBuffer: 1 << 30, ...options });
  if (r.error) throw new Error(`podman ${argv[0]}: ${r.error.message}`);
  return r;
}

const text = (r) => (r.stdout ?? Buffer.alloc(0)).toString('utf8').trim();
const exists = (image) => podman(['image', 'exists', image]).status === 0;

/** Regular files of a tar stream: path -> size (a later entry of a path replaces an earlier one). */
function tarFiles(buf) {
  const files = new Map();
  let contents = new Map();
  let longName;
  let paxPath;
  for (let at = 0; at + 512 <= buf.length;) {
    const header = buf.subarray(at, at + 512);
    if (header.every((b) => b === 0)) break;
    const field = (from, length) =>
      header
        .subarray(from, from + length)
        .toString('utf8')
        .replace(/\0.*$/s, '');
    const size = parseInt(field(124, 12).trim() || '0', 8);
    const type = String.fromCharCode(header[156] || 48);
    const data = buf.subarray(at + 512, at + 512 + size);
    at += 512 + Math.ceil(size / 512) * 512;
    if (type === 'L') {
      longName = data.toString('utf8').replace(/\0.*$/s, '');
      continue;
    }
    if (type === 'x') {
      const m = /\d+ path=([^\n]*)\n/.exec(data.toString('utf8'));
      paxPath = m ? m[1] : undefined;
      continue;
    }
    const prefix = field(345, 155);
    const path =
      '/' + (paxPath ?? longName ?? (prefix ? `${prefix}/${field(0, 100)}` : field(0, 100))).replace(/^\.?\//, '');
    longName = undefined;
    paxPath = undefined;
    if (type === '0' || type === '7') {
      files.set(path, size);
      if (path === '/var/lib/dpkg/status') contents.set(path, data.toString('utf8'));
    }
  }
  return { files, contents };
}

function measure(image) {
  const created = podman(['create', '--pull', 'never', image]);
  if (created.status !== 0) throw new Error(`podman create ${image}: ${text({ stdout: created.stderr })}`);
  const id = text(created);
  const dir = mkdtempSync(join(tmpdir(), 'image-sizes-'));
  try {
    const tar = join(dir, 'fs.tar');
    const exported = podman(['export', '--output', tar, id]);
    if (exported.status !== 0) throw new Error(`podman export ${image}: ${exported.stderr.toString('utf8').trim()}`);
    const { files, contents } = tarFiles(readFileSync(tar));
    const sum = (pick) => [...files].filter(([p]) => pick(p)).reduce((n, [, s]) => n + s, 0);
    const node = sum((p) => p === '/usr/local/bin/node');
    const controller = sum((p) => p.startsWith('/opt/ipvs-node-controller/'));
    const all = sum(() => true);
    const status = contents.get('/var/lib/dpkg/status') ?? '';
    const packages = status.split('\n').filter((l) => l.startsWith('Package: ')).length;
    const inspect = JSON.parse(text(podman(['image', 'inspect', image])))[0];
    return {
      image,
      architecture: inspect.Architecture,
      unpackedBytes: inspect.Size,
      filesBytes: all,
      nodeBytes: node,
      controllerBytes: controller,
      debianBytes: all - node - controller,
      debianPackages: packages,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
    podman(['rm', '--force', id]);
  }
}

// The release's images, one per architecture; else the one `npm run image` builds for this machine.
const perArchitecture = [
  `localhost/ipvs-node-controller:${version}-amd64`,
  `localhost/ipvs-node-controller:${version}-arm64`,
].filter(exists);
const images =
  named.length > 0
    ? named
    : perArchitecture.length > 0
      ? perArchitecture
      : [`localhost/ipvs-node-controller:${version}`].filter(exists);
if (images.length === 0) {
  process.stderr.write(
    `image-sizes: no image of ${version} is built: run \`npm run image\` (or \`npm run release\`)\n`,
  );
  process.exit(1);
}
for (const image of images) {
  if (!exists(image)) {
    process.stderr.write(`image-sizes: no image ${image}\n`);
    process.exit(1);
  }
}

const releaseFile = join(root, 'dist', 'release', 'release.json');
const release = existsSync(releaseFile) ? JSON.parse(readFileSync(releaseFile, 'utf8')) : undefined;
const measured = images.map((image) => {
  const m = measure(image);
  const platform = release?.version === version ? release.platforms?.[m.architecture] : undefined;
  return { ...m, compressedBytes: platform?.compressedBytes };
});

if (json) {
  process.stdout.write(JSON.stringify(measured, null, 2) + '\n');
} else {
  const mb = (n) => (n === undefined ? '(no release.json: npm run release)' : `${(n / 1e6).toFixed(1)} MB`);
  const rows = [
    ['compressed (the layers a node pulls)', (m) => mb(m.compressedBytes)],
    ['unpacked (`podman images`)', (m) => mb(m.unpackedBytes)],
    ['of which Node.js', (m) => mb(m.nodeBytes)],
    [`of which the Debian packages`, (m) => `${mb(m.debianBytes)} (${m.debianPackages} packages)`],
    ['of which the controller (bundle, addons, BPF object)', (m) => mb(m.controllerBytes)],
  ];
  process.stdout.write(`| | ${measured.map((m) => `linux/${m.architecture}`).join(' | ')} |\n`);
  process.stdout.write(`| --- |${measured.map(() => ' ---: |').join('')}\n`);
  for (const [label, cell] of rows) process.stdout.write(`| ${label} | ${measured.map(cell).join(' | ')} |\n`);
}
