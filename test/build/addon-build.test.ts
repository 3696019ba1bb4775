// The in-process nftables addon is built and is the path in use. This fails (never skips) when
// build/Release/nftables_addon.node is absent: a build that quietly fell back to the CLI must
// not pass. Both addons are built hardened (binding.gyp): full RELRO, stack protector,
// _FORTIFY_SOURCE. Nothing here talks to the kernel.

import { expect } from 'chai';
import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, copyFileSync, symlinkSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createRequire } from 'node:module';
import {
  NftAddonExecutor,
  defaultAddonPath,
  loadNftAddon,
  selectNftExecutor,
  type NftablesAddon,
} from '../../src/backends/nft/addon-executor.js';
import { NftCliExecutor, NftError } from '../../src/backends/nft/executor.js';
import { defaultAddonPath as ebpfAddonPath } from '../../src/backends/ebpf/native.js';
import { addonPath } from '../../src/native-addon.js';
import { withFileNotAnAddon } from '../support/temp-dir.js';

/** readelf's output (binutils, which g++ needs to build the addons at all). */
function readelf(args: string[], file: string): string {
  const run = spawnSync('readelf', ['-W', ...args, file], { encoding: 'utf8' });
  if (run.error) expect.fail(`readelf did not run (${run.error.message}): install binutils`);
  expect(run.status, run.stderr).to.equal(0);
  return run.stdout;
}

/** The functions an addon takes from other libraries (undefined dynamic symbols), without versions. */
function importedFunctions(file: string): Set<string> {
  const names = new Set<string>();
  for (const line of readelf(['--dyn-syms'], file).split('\n')) {
    const f = line.trim().split(/\s+/);
    // Num: Value Size Type Bind Vis Ndx Name
    if (f.length >= 8 && f[6] === 'UND' && f[7]) names.add(f[7].replace(/@.*/, ''));
  }
  return names;
}

/**
 * Format functions that glibc's _FORTIFY_SOURCE=2 always turns into their __*_chk variant (the
 * format is checked for %n whatever is known of the buffer): importing one plain means a part of
 * the addon was compiled without it.
 */
const ALWAYS_FORTIFIED = ['snprintf', 'vsnprintf', 'sprintf', 'vsprintf', 'printf', 'fprintf', 'vfprintf', 'vprintf'];

describe('nftables addon build', () => {
  it('build/Release/nftables_addon.node exists', () => {
    const path = defaultAddonPath();
    expect(path).to.match(/build\/Release\/nftables_addon\.node$/);
    expect(existsSync(path), `${path} is missing: install libnftables-dev and run \`npm run build:native\``).to.equal(
      true,
    );
  });

  it('loads and exposes run, check, list and the libnftables version', () => {
    const load = loadNftAddon();
    expect(load.executor, load.executor ? '' : load.reason).to.not.equal(undefined);
    if (!(load.executor instanceof NftAddonExecutor)) expect.fail('expected load.executor instanceof NftAddonExecutor');
    expect(load.executor.kind).to.equal('addon');
    expect(load.executor.libnftablesVersion).to.match(/^\d+\.\d+(\.\d+)?$/);
  });

  it('writes map elements as netlink batches: built with libnftnl and libmnl, which it links', () => {
    const load = loadNftAddon();
    if (!load.executor) expect.fail(load.reason);
    expect(
      load.executor.writesElementBatches,
      'writeElements is missing: install libnftnl-dev and libmnl-dev (scripts/install-system-packages.sh) and run `npm run build:native`',
    ).to.equal(true);
    const linked = execFileSync('ldd', [defaultAddonPath()], { encoding: 'utf8' });
    expect(linked).to.match(/libnftnl\.so/);
    expect(linked).to.match(/libmnl\.so/);
  });

  it('checks the arguments of writeElements before any work is queued', () => {
    const addon = createRequire(import.meta.url)(defaultAddonPath()) as NftablesAddon;
    expect(() => addon.writeElements!('inet', 't', 'm', '', ''))
      .to.throw()
      .that.includes({ name: 'TypeError', message: 'family must be ip or ip6' });
    expect(() => addon.writeElements!('ip', 't', 'm', '', 42 as unknown as string))
      .to.throw()
      .that.includes({ name: 'TypeError', message: 'added must be a string' });
  });

  it('checks the options of writeElements and the arguments of readSets before any work is queued', () => {
    const addon = createRequire(import.meta.url)(defaultAddonPath()) as NftablesAddon;
    expect(() => addon.writeElements!('ip', 't', 'm', '', '', false, 'k', { keySetRemoved: '' }))
      .to.throw()
      .that.includes({ name: 'TypeError', message: 'keySetRemoved and keySetAdded go together' });
    expect(() => addon.writeElements!('ip', 't', 'm', '', '', false, 'k', { generation: -1 }))
      .to.throw()
      .that.includes({ name: 'RangeError', message: 'generation must be an integer from 0 to 2^32 - 1' });
    expect(() => addon.readSets!('ip', 't', [{ name: 'm', kind: 'map' }], 0))
      .to.throw()
      .that.includes({ name: 'RangeError', message: 'maxElements must be from 1 to 10,000,000' });
    expect(() => addon.readSets!('inet', 't', [{ name: 'm', kind: 'map' }], 10))
      .to.throw()
      .that.includes({ name: 'TypeError', message: 'family must be ip or ip6' });
    expect(() => addon.readSets!('ip', 't', [{ name: 'm', kind: 'interval' as 'map' }], 10))
      .to.throw()
      .that.includes({ name: 'TypeError', message: 'kind must be map, keys, sourced or verdicts' });
    expect(() => addon.readSets!('ip', 't', [], 10))
      .to.throw()
      .that.includes({ name: 'RangeError', message: 'sets must name 1 to 8 sets' });
  });

  it('is what automatic executor selection picks', () => {
    const choice = selectNftExecutor('auto');
    expect(choice.executor.kind).to.equal('addon');
    expect(choice.reason).to.match(/in process through libnftables \d+\.\d+/);
  });

  it('rejects a non-string document before any work is queued', () => {
    const addon = createRequire(import.meta.url)(defaultAddonPath()) as NftablesAddon;
    expect(() => addon.run(42 as unknown as string))
      .to.throw()
      .that.includes({ name: 'TypeError', message: 'json must be a string' });
    expect(() => addon.list('ip', undefined as unknown as string))
      .to.throw()
      .that.includes({ name: 'TypeError', message: 'table must be a string' });
  });
});

describe('nft executor selection without the addon', () => {
  const missing = '/nonexistent/build/Release/nftables_addon.node';

  it('says how to build the addon when it is missing', () => {
    const load = loadNftAddon(missing);
    expect(load.executor).to.equal(undefined);
    const reason = !load.executor ? load.reason : '';
    expect(reason).to.match(/not built .* install libnftables-dev and run `npm run build:native`/);
  });

  it('says why when the file is not a loadable addon', () => {
    withFileNotAnAddon('nftables_addon.node', (notAnAddon) => {
      const load = loadNftAddon(notAnAddon);
      expect(load.executor).to.equal(undefined);
      expect(!load.executor ? load.reason : '').to.match(/did not load \(.*\): install libnftables-dev/);
    });
  });

  it('auto falls back to the CLI and gives the reason', () => {
    const choice = selectNftExecutor('auto', missing);
    expect(choice.executor).to.be.instanceOf(NftCliExecutor);
    expect(choice.reason).to.match(/nft CLI: the in-process nftables addon is not built/);
  });

  it('an explicit addon preference fails with the reason instead of falling back', () => {
    expect(() => selectNftExecutor('addon', missing))
      .to.throw()
      .that.satisfies((err: unknown) => {
        return err instanceof NftError && /npm run build:native/.test(err.message);
      });
  });

  it('cli is used when configured, even with the addon built', () => {
    const choice = selectNftExecutor('cli');
    expect(choice.executor.kind).to.equal('cli');
  });
});

describe('scripts/build-native.mjs without the libraries', () => {
  // A copy of the script in a scratch package, so the real build/ is never touched.
  let scratch: string;
  const packageRoot = dirname(dirname(dirname(defaultAddonPath())));
  const script = join(packageRoot, 'scripts', 'build-native.mjs');

  beforeEach(() => {
    scratch = mkdtempSync(join(tmpdir(), 'build-native-'));
    mkdirSync(join(scratch, 'scripts'));
    copyFileSync(script, join(scratch, 'scripts', 'build-native.mjs'));
    mkdirSync(join(scratch, 'build', 'Release'), { recursive: true });
    writeFileSync(join(scratch, 'build', 'Release', 'nftables_addon.node'), 'stale');
  });

  afterEach(() => rmSync(scratch, { recursive: true, force: true }));

  function buildNative(env: NodeJS.ProcessEnv): { status: number | null; lines: string[] } {
    const scratchScript = join(scratch, 'scripts', 'build-native.mjs');
    const run = spawnSync(process.execPath, [scratchScript], { env, encoding: 'utf8' });
    const lines = `${run.stdout}${run.stderr}`.split('\n').filter((l) => l.length > 0);
    return { status: run.status, lines };
  }

  it('succeeds with one line per library naming its -dev package and what happens without it, when pkg-config cannot find them', () => {
    const { status, lines } = buildNative({ ...process.env, PKG_CONFIG_LIBDIR: join(scratch, 'no-pkgconfig') });
    expect(status).to.equal(0);
    expect(lines, lines.join('\n')).to.have.lengthOf(3);
    expect(lines[0] ?? '').to.match(/libnftables not found by pkg-config: install .*libnftables-dev/);
    expect(lines[0] ?? '').to.match(/until then the `nft` CLI will be used\.$/);
    expect(lines[1] ?? '').to.match(
      /libmnl not found by pkg-config: install .*libmnl-dev.*deleted by the `conntrack` command\.$/,
    );
    expect(lines[2] ?? '').to.match(
      /libbpf not found by pkg-config: install .*libbpf-dev.*--backend=ebpf is not available\.$/,
    );
    expect(existsSync(join(scratch, 'build')), 'a stale addon was left behind').to.equal(false);
  });

  it('succeeds with one line per library when pkg-config itself is missing', () => {
    const { status, lines } = buildNative({ PATH: join(scratch, 'empty-path') });
    expect(status).to.equal(0);
    expect(lines, lines.join('\n')).to.have.lengthOf(3);
    expect(lines[0] ?? '').to.match(/pkg-config not found: install the Debian packages pkg-config and libnftables-dev/);
    expect(lines[1] ?? '').to.match(/pkg-config not found: install the Debian packages pkg-config and libmnl-dev/);
    expect(lines[2] ?? '').to.match(/pkg-config not found: install the Debian packages pkg-config and libbpf-dev/);
  });

  it('goes on to build the eBPF addon when libbpf is there and libnftables is not', () => {
    // pkg-config sees libbpf only; no compiler on the PATH, so the script stops at the tools it names.
    const pc = join(scratch, 'pkgconfig');
    mkdirSync(pc);
    const libdir = spawnSync('pkg-config', ['--variable', 'pcfiledir', 'libbpf'], { encoding: 'utf8' }).stdout.trim();
    for (const lib of ['libbpf', 'libelf', 'zlib']) copyFileSync(join(libdir, `${lib}.pc`), join(pc, `${lib}.pc`));
    const bin = join(scratch, 'bin');
    mkdirSync(bin);
    symlinkSync(
      spawnSync('sh', ['-c', 'command -v pkg-config'], { encoding: 'utf8' }).stdout.trim(),
      join(bin, 'pkg-config'),
    );
    const { status, lines } = buildNative({ PATH: bin, PKG_CONFIG_LIBDIR: pc, CXX: 'no-such-compiler' });
    expect(status).to.equal(0);
    expect(lines[0]!).to.match(/libnftables not found by pkg-config/);
    expect(lines.at(-1)!).to.match(
      /cannot build native addons: install the Debian packages .*; until then --backend=ebpf is not available\.$/,
    );
  });
});

describe('conntrack addon build', () => {
  const path = addonPath('conntrack_addon.node');

  it('exists, linked with libmnl, and checks its arguments before any work is queued', () => {
    expect(existsSync(path), `${path} is missing: install libmnl-dev and run \`npm run build:native\``).to.equal(true);
    expect(execFileSync('ldd', [path], { encoding: 'utf8' })).to.match(/libmnl\.so/);
    const addon = createRequire(import.meta.url)(path) as {
      deleteMatching(family: string, targets: string, timeoutMs?: number, limits?: unknown): Promise<unknown>;
    };
    expect(() => addon.deleteMatching('inet', '')).to.throw(TypeError, 'family must be ipv4 or ipv6');
    expect(() => addon.deleteMatching('ipv4', '17 2001:db8::1 53 0')).to.throw(TypeError, "not an address: '2001:db8::1'");
    expect(() => addon.deleteMatching('ipv4', '17 192.0.2.1 70000 0')).to.throw(TypeError, 'not a target');
    expect(() => addon.deleteMatching('ipv4', '', 0)).to.throw(RangeError, 'timeoutMs');
    expect(() => addon.deleteMatching('ipv4', '', 1000, 5)).to.throw(TypeError, 'limits must be an object');
    expect(() => addon.deleteMatching('ipv4', '', 1000, { perTarget: 0 })).to.throw(RangeError, 'perTarget');
    expect(() => addon.deleteMatching('ipv4', '', 1000, { total: 1.5 })).to.throw(RangeError, 'total');
  });
});

describe('memory addon build', () => {
  // The kernel pages out only pages no other process maps: the test runner's processes all map
  // this node binary, so the addon runs in a child started from a copy of it, mapped by no one
  // else (as the image's node is by the controller alone).
  let dir: string;
  before(() => (dir = mkdtempSync(join(tmpdir(), 'memory-addon-'))));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('hands the pages of the files its process maps back to the kernel', function () {
    this.timeout(60_000);
    const path = addonPath('memory_addon.node');
    expect(existsSync(path), `${path} is missing: run \`npm run build:native\``).to.equal(true);
    const node = join(dir, 'node');
    copyFileSync(process.execPath, node);
    chmodSync(node, 0o755);
    const script =
      `require(${JSON.stringify(path)}).releaseFilePages()` +
      '.then((r) => process.stdout.write(JSON.stringify(r)), (e) => { console.error(e); process.exit(1); })';
    const r = JSON.parse(execFileSync(node, ['-e', script], { encoding: 'utf8' })) as {
      mappings: number;
      residentBefore: number;
      residentAfter: number;
    };
    expect(r.mappings, 'file mappings advised').to.be.greaterThan(0);
    // The node binary alone is mapped with tens of MiB resident; most of it leaves.
    expect(r.residentBefore).to.be.greaterThan(8 * 2 ** 20);
    expect(r.residentAfter, `${r.residentAfter} of ${r.residentBefore} bytes`).to.be.below(r.residentBefore / 2);
  });
});

// `fortified`: whether the addon calls a function glibc can check (the conntrack addon's copies
// have sizes known only at run time, so it imports none; it is built with the same flags).
for (const [name, path, fortified] of [
  ['nftables', defaultAddonPath, true],
  ['conntrack', () => addonPath('conntrack_addon.node'), false],
  ['memory', () => addonPath('memory_addon.node'), false],
  ['eBPF', ebpfAddonPath, true],
] as const) {
  describe(`the ${name} addon is built hardened`, () => {
    let file: string;
    before(() => {
      file = path();
      expect(existsSync(file), `${file} is missing: run \`npm run build:native\``).to.equal(true);
    });

    it('with full RELRO: relocations resolved at load (BIND_NOW), then made read-only (GNU_RELRO)', () => {
      const dynamic = readelf(['-d'], file);
      expect(dynamic, 'BIND_NOW (-Wl,-z,now)').to.match(/\(FLAGS\)\s+.*\bBIND_NOW\b|\(FLAGS_1\)\s+Flags:.*\bNOW\b/);
      expect(readelf(['-l'], file), 'a GNU_RELRO segment (-Wl,-z,relro)').to.match(/^\s*GNU_RELRO\s/m);
    });

    it('with a stack protector: functions with buffers check their canary (__stack_chk_fail)', () => {
      expect([...importedFunctions(file)]).to.include('__stack_chk_fail');
    });

    it('with _FORTIFY_SOURCE: format functions are the checked ones, none the plain', () => {
      const imported = importedFunctions(file);
      const checked = [...imported].filter((f) => /^__\w+_chk$/.test(f) && f !== '__stack_chk_fail');
      if (fortified) {
        expect(checked, 'no __*_chk function: is the addon still compiled with _FORTIFY_SOURCE?').to.not.deep.equal(
          [],
        );
      }
      expect(ALWAYS_FORTIFIED.filter((f) => imported.has(f)), 'plain format functions').to.deep.equal([]);
    });
  });
}
