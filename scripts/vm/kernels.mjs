// Debian's own kernels for the VM test layer: fetched once into a cache outside the checkout,
// unpacked (never installed), and a small initramfs built for each.
//
// Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/ipvs-node-controller/vm/<suite>/ (IPVS_NODE_CONTROLLER_VM_CACHE
// overrides the vm/ directory). Each suite's directory holds:
//   kernel.json      the exact package and version fetched, the kernel release, the paths below
//   root/            the kernel package unpacked with dpkg-deb -x (boot/vmlinuz-*, lib/modules/*)
//   initramfs.cpio.gz and initramfs.key (what it was built from: rebuilt when that changes)
// The packages come from Debian's archive (IPVS_NODE_CONTROLLER_DEBIAN_MIRROR, default
// http://deb.debian.org/debian) through a private apt configuration: the machine's own sources,
// lists and package cache are never read or written.

import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  existsSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  realpathSync,
  renameSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { homedir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));

/** The kernels the layer boots, by Debian suite; each can also be named by its version. */
export const KERNELS = [
  { suite: 'bullseye', name: '5.10' },
  { suite: 'bookworm', name: '6.1' },
  { suite: 'trixie', name: '6.12' },
];

/** The modules the initramfs loads, in this order with their dependencies, to mount the host's root. */
const INITRAMFS_MODULES = ['virtio_pci', '9pnet_virtio', '9p', 'overlay'];

/** Finds a kernel by suite or version ("bookworm", "6.1"); throws with the list otherwise. */
export function findKernel(name) {
  const kernel = KERNELS.find((k) => k.suite === name || k.name === name);
  if (!kernel) {
    const names = KERNELS.map((k) => `${k.name} (${k.suite})`).join(', ');
    throw new Error(`unknown kernel "${name}": one of ${names}`);
  }
  return kernel;
}

export function cacheRoot() {
  if (process.env.IPVS_NODE_CONTROLLER_VM_CACHE) return resolve(process.env.IPVS_NODE_CONTROLLER_VM_CACHE);
  const base = process.env.XDG_CACHE_HOME || join(homedir(), '.cache');
  return join(base, 'ipvs-node-controller', 'vm');
}

function run(command, args, options = {}) {
  const r = spawnSync(command, args, { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024, ...options });
  if (r.error) throw new Error(`${command}: ${r.error.message}`);
  if (r.status !== 0) {
    const out = `${r.stderr ?? ''}${r.stdout ?? ''}`.trim().split('\n').slice(-20).join('\n');
    throw new Error(`${command} ${args.join(' ')} exited with ${r.status ?? r.signal}:\n${out}`);
  }
  return r.stdout ?? '';
}

const log = (line) => console.error(`vm: ${line}`);

/**
 * Fetches and unpacks the suite's linux-image-amd64 kernel unless the cache has it; returns
 * { suite, name, package, version, release, vmlinuz, modules, dir }.
 */
export function ensureKernel(kernel) {
  const dir = join(cacheRoot(), kernel.suite);
  const recordPath = join(dir, 'kernel.json');
  if (existsSync(recordPath)) {
    const record = JSON.parse(readFileSync(recordPath, 'utf8'));
    if (existsSync(record.vmlinuz) && existsSync(join(record.modules, 'modules.dep'))) return record;
  }
  log(`fetching Debian ${kernel.suite}'s linux-image-amd64 into ${dir}`);
  // Fetched beside the cache entry and renamed into place: a runner started meanwhile never
  // sees half a kernel, and two first fetches do not mix.
  const work = `${dir}.fetch-${process.pid}`;
  rmSync(work, { recursive: true, force: true });
  try {
    return fetchInto(kernel, dir, work);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

/** ensureKernel's fetch: unpacks into `work`, then renames it to `dir` (unless another fetch did first). */
function fetchInto(kernel, dir, work) {
  const recordPath = join(dir, 'kernel.json');
  const apt = join(work, 'apt');
  for (const d of ['lists/partial', 'cache/archives/partial', 'etc', 'debs'])
    mkdirSync(join(apt, d), { recursive: true });
  const mirror = process.env.IPVS_NODE_CONTROLLER_DEBIAN_MIRROR || 'http://deb.debian.org/debian';
  const sources = join(apt, 'etc', 'sources.list');
  writeFileSync(
    sources,
    `deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${mirror} ${kernel.suite} main\n`,
  );
  const aptOptions = [
    '-o',
    `Dir::Etc::sourcelist=${sources}`,
    '-o',
    'Dir::Etc::sourceparts=-',
    '-o',
    `Dir::State::Lists=${join(apt, 'lists')}`,
    '-o',
    `Dir::Cache=${join(apt, 'cache')}`,
    '-o',
    'APT::Architecture=amd64',
    '-o',
    'APT::Architectures=amd64',
    '-o',
    'Debug::NoLocking=1',
    '-o',
    'Acquire::Languages=none',
  ];
  run('apt-get', [...aptOptions, '-qq', 'update']);
  // linux-image-amd64 is a metapackage: the kernel itself is the linux-image-<release> it depends on.
  const meta = run('apt-cache', [...aptOptions, 'show', '--no-all-versions', 'linux-image-amd64']);
  const depends = /^Depends: (.*)$/m.exec(meta)?.[1] ?? '';
  const imagePackage = depends
    .split(/,\s*/)
    .map((d) => d.split(/\s/)[0])
    .find((d) => /^linux-image-\d/.test(d));
  if (!imagePackage) throw new Error(`linux-image-amd64 of ${kernel.suite} depends on no kernel image: ${depends}`);
  const metaVersion = /^Version: (.*)$/m.exec(meta)?.[1];
  const image = run('apt-cache', [...aptOptions, 'show', '--no-all-versions', imagePackage]);
  const version = /^Version: (.*)$/m.exec(image)?.[1];
  run('apt-get', [...aptOptions, '-qq', 'download', imagePackage], { cwd: join(apt, 'debs') });
  const deb = readdirSync(join(apt, 'debs')).find((f) => f.endsWith('.deb'));
  if (!deb) throw new Error(`apt-get download ${imagePackage} left no .deb`);
  const root = join(work, 'root');
  run('dpkg-deb', ['-x', join(apt, 'debs', deb), root]);
  // trixie's packages are merged-/usr (usr/lib/modules): lib/ points there, as on a merged system.
  if (!existsSync(join(root, 'lib')) && existsSync(join(root, 'usr', 'lib', 'modules'))) {
    symlinkSync('usr/lib', join(root, 'lib'));
  }
  const release = readdirSync(join(root, 'lib', 'modules'))[0];
  if (!release) throw new Error(`${deb} holds no lib/modules/<release>`);
  run('depmod', ['-b', root, release]);
  const record = {
    suite: kernel.suite,
    name: kernel.name,
    package: imagePackage,
    version,
    metapackage: `linux-image-amd64 ${metaVersion}`,
    release,
    vmlinuz: join(dir, 'root', 'boot', `vmlinuz-${release}`),
    modules: join(dir, 'root', relative(root, realpathSync(join(root, 'lib', 'modules', release)))),
    dir,
    fetched: new Date().toISOString(),
  };
  if (!existsSync(join(root, 'boot', `vmlinuz-${release}`))) throw new Error(`${deb} holds no boot/vmlinuz-${release}`);
  // The downloaded .deb and apt's lists are not needed once unpacked.
  rmSync(apt, { recursive: true, force: true });
  writeFileSync(join(work, 'kernel.json'), `${JSON.stringify(record, null, 2)}\n`);
  if (existsSync(recordPath)) {
    rmSync(work, { recursive: true, force: true });
    return JSON.parse(readFileSync(recordPath, 'utf8'));
  }
  rmSync(dir, { recursive: true, force: true });
  renameSync(work, dir);
  log(`${kernel.suite}: ${imagePackage} ${version} (kernel ${release})`);
  return record;
}

/**
 * Builds (or reuses) the kernel's initramfs: busybox-static, the modules that mount the host's
 * root over 9p with a tmpfs overlay, and scripts/vm/initramfs-init.sh as /init. Returns its path.
 */
export function ensureInitramfs(record) {
  const busybox = '/bin/busybox';
  const init = join(here, 'initramfs-init.sh');
  const depends = run('modprobe', [
    '-d',
    join(record.dir, 'root'),
    '-S',
    record.release,
    '--show-depends',
    '-a',
    ...INITRAMFS_MODULES,
  ]);
  const modules = [];
  for (const line of depends.split('\n')) {
    const m = /^insmod (\S+)/.exec(line);
    if (m && !modules.includes(m[1])) modules.push(m[1]);
  }
  if (modules.length === 0)
    throw new Error(`modprobe --show-depends listed no module for ${INITRAMFS_MODULES.join(' ')}`);
  const key = createHash('sha256');
  for (const file of [busybox, init, ...modules]) {
    key.update(`${file}\n`);
    key.update(readFileSync(file));
  }
  const digest = key.digest('hex');
  const output = join(record.dir, 'initramfs.cpio.gz');
  const keyPath = join(record.dir, 'initramfs.key');
  if (existsSync(output) && existsSync(keyPath) && readFileSync(keyPath, 'utf8').trim() === digest) return output;
  log(`${record.suite}: building the initramfs`);
  const staging = join(record.dir, `initramfs.tmp-${process.pid}`);
  rmSync(staging, { recursive: true, force: true });
  for (const d of ['bin', 'dev', 'proc', 'sys', 'modules', 'lower', 'upper', 'newroot']) {
    mkdirSync(join(staging, d), { recursive: true });
  }
  run('cp', [busybox, join(staging, 'bin', 'busybox')]);
  run('cp', [init, join(staging, 'init')]);
  const order = [];
  modules.forEach((file, i) => {
    // Compressed modules (.ko.xz, .ko.zst) are unpacked here: busybox's insmod takes plain ELF.
    const name = `${String(i).padStart(2, '0')}-${file
      .split('/')
      .pop()
      .replace(/\.ko(\..*)?$/, '.ko')}`;
    const target = join(staging, 'modules', name);
    if (file.endsWith('.xz')) writeFileSync(target, run('xz', ['-dc', file], { encoding: 'buffer' }));
    else if (file.endsWith('.zst')) writeFileSync(target, run('zstd', ['-dc', file], { encoding: 'buffer' }));
    else if (file.endsWith('.gz')) writeFileSync(target, run('gzip', ['-dc', file], { encoding: 'buffer' }));
    else run('cp', [file, target]);
    order.push(name);
  });
  writeFileSync(join(staging, 'modules', 'order'), `${order.join('\n')}\n`);
  run('chmod', ['0755', join(staging, 'init'), join(staging, 'bin', 'busybox')]);
  const tmp = `${output}.tmp-${process.pid}`;
  run('sh', ['-c', `cd "$0" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1 > "$1"`, staging, tmp]);
  renameSync(tmp, output);
  writeFileSync(keyPath, `${digest}\n`);
  rmSync(staging, { recursive: true, force: true });
  log(`${record.suite}: initramfs ${Math.round(statSync(output).size / 1024)} KiB (${order.join(' ')})`);
  return output;
}
