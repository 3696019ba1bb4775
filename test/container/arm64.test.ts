// The arm64 image on this amd64 machine, under QEMU user emulation (Debian's qemu-user-static):
// it is an arm64 image, it prints --version, its --dry-run on the example Services prints what
// the host's build prints, and, where the emulation carries the kernel's netfilter netlink, its nft
// programs a table in a network namespace the test creates. Which of these the emulation does is
// printed with the figures.
//
// The QEMU handler is registered in binfmt_misc mounted inside this suite's private mount
// namespace (test/run.mjs starts it under `unshare --mount`): the kernel keeps the handler while
// that mount exists, so it goes when the suite ends and the machine's mounts are never changed.
// Needs the image: `npm run release` (or `npm run image -- --arch arm64`); without it the suite is
// skipped, except when IPVS_NODE_CONTROLLER_REQUIRE_IMAGE=1, where that is a failure.

import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const VERSION = (JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { version: string }).version;
const IMAGE = `localhost/ipvs-node-controller:${VERSION}-arm64`;
const PODMAN_ENV = { ...process.env, CONTAINERS_CONF: join(repoRoot, 'scripts', 'containers.conf') };
const BINFMT = '/proc/sys/fs/binfmt_misc';
const NETNS = `arm64-smoke-${process.pid}`;

function run(cmd: string, args: string[], options: { env?: NodeJS.ProcessEnv } = {}) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 240_000, ...options });
  return { code: r.status ?? -1, out: (r.stdout ?? '').trim(), err: (r.stderr ?? '').trim() };
}
const podman = (args: string[]) => run('podman', args, { env: PODMAN_ENV });
/** The image run once, root in the container, without network unless one is given. */
const inImage = (args: string[], extra: string[] = []) =>
  podman([
    'run',
    '--rm',
    '--pull',
    'never',
    '--arch',
    'arm64',
    ...(extra.includes('--network') ? [] : ['--network', 'none']),
    ...extra,
    IMAGE,
    ...args,
  ]);

describe('the arm64 image under QEMU user emulation', function () {
  this.timeout(300_000);
  const figures: string[] = [];
  let mounted = false;
  let enabled = false;

  before(function () {
    if (podman(['image', 'exists', IMAGE]).code !== 0) {
      if (process.env.IPVS_NODE_CONTROLLER_REQUIRE_IMAGE === '1') {
        throw new Error(`the image ${IMAGE} is not built (npm run release) and this run requires it`);
      }
      console.log(`    skipped: the image ${IMAGE} is not built: run \`npm run release\` first`);
      this.skip();
    }
    if (process.arch === 'arm64') return;
    if (!existsSync('/usr/share/binfmts/qemu-aarch64')) {
      throw new Error('qemu-user-static is not installed (bash scripts/install-system-packages.sh)');
    }
    if (!existsSync(join(BINFMT, 'status'))) {
      const m = run('mount', ['-t', 'binfmt_misc', 'binfmt_misc', BINFMT]);
      if (m.code !== 0) throw new Error(`cannot mount binfmt_misc: ${m.err}`);
      mounted = true;
    }
    const handler = join(BINFMT, 'qemu-aarch64');
    if (!existsSync(handler) || !readFileSync(handler, 'utf8').startsWith('enabled')) {
      const e = run('update-binfmts', ['--enable', 'qemu-aarch64']);
      if (e.code !== 0) throw new Error(`update-binfmts --enable qemu-aarch64: ${e.err}`);
      enabled = true;
    }
    figures.push(`emulation: qemu-aarch64 ${enabled ? 'registered for this suite' : 'already registered'}`);
  });

  after(() => {
    run('ip', ['netns', 'delete', NETNS]);
    // A handler this suite enabled in a binfmt_misc it did not mount is the machine's: disable it.
    if (enabled && !mounted) run('update-binfmts', ['--disable', 'qemu-aarch64']);
    if (mounted) run('umount', [BINFMT]);
    if (figures.length > 0) console.log(`\n    figures:\n${figures.map((f) => `      ${f}`).join('\n')}`);
  });

  it('is an arm64 image whose node is an AArch64 executable', () => {
    expect(podman(['image', 'inspect', '--format', '{{.Os}}/{{.Architecture}}', IMAGE]).out).to.equal('linux/arm64');
    const arch = inImage(['-p', 'process.arch'], ['--entrypoint', 'node']);
    expect(arch.code, arch.err).to.equal(0);
    expect(arch.out).to.equal('arm64');
  });

  it('--version prints the version', () => {
    const t0 = Date.now();
    const r = inImage(['--version']);
    expect(r.code, r.err).to.equal(0);
    expect(r.out).to.equal(VERSION);
    figures.push(`--version under emulation: ${Date.now() - t0} ms (podman run included)`);
  });

  it('--dry-run on the example Services prints the ruleset the host build prints', () => {
    // Without asking kube-proxy's /proxyMode: its answer would depend on each side's network.
    const args = [
      '--dry-run',
      '--from-file',
      '/examples/services.yaml',
      '--node-name',
      'worker-1',
      '--kube-proxy-metrics-address=',
    ];
    const t0 = Date.now();
    const r = inImage(args, ['-v', `${join(repoRoot, 'examples')}:/examples:ro`]);
    expect(r.code, r.err).to.equal(0);
    figures.push(`--dry-run under emulation: ${Date.now() - t0} ms (podman run included)`);
    expect(r.out).to.match(/^table ip ipvs-node-controller \{$/m);
    const host = run(process.execPath, [
      join(repoRoot, 'dist', 'bundle', 'ipvs-node-controller.mjs'),
      ...args.slice(0, 2),
      join(repoRoot, 'examples', 'services.yaml'),
      ...args.slice(3),
    ]);
    expect(host.code, host.err).to.equal(0);
    expect(r.out).to.equal(host.out);
  });

  it('programs an nft table in a network namespace the test creates, when the emulation carries netfilter netlink', () => {
    expect(run('ip', ['netns', 'add', NETNS]).code).to.equal(0);
    const r = inImage(
      ['add', 'table', 'ip', 'arm64-smoke'],
      ['--network', `ns:/run/netns/${NETNS}`, '--cap-drop', 'all', '--cap-add', 'net_admin', '--entrypoint', 'nft'],
    );
    // Listed by the machine's own nft, natively.
    const tables = run('nsenter', [`--net=/run/netns/${NETNS}`, 'nft', 'list', 'tables']);
    expect(tables.code, tables.err).to.equal(0);
    if (r.code === 0) {
      expect(tables.out).to.include('table ip arm64-smoke');
      figures.push('netlink: the arm64 nft programmed a table in the test namespace');
    } else {
      // QEMU's user mode refuses netlink families it does not translate (it carries NETLINK_ROUTE,
      // NETLINK_AUDIT and NETLINK_KOBJECT_UEVENT): the socket call fails, nothing is programmed.
      expect(r.err).to.match(/Protocol not supported/);
      expect(tables.out).to.not.include('arm64-smoke');
      const line = r.err.split('\n').find((l) => l.includes('Protocol not supported'));
      figures.push(`netlink: not carried by the emulation (nft: ${line})`);
    }
  });
});
