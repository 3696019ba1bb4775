// The eBPF backend's build artifacts: the addon and the BPF object are built and loadable, and
// scripts/build-bpf.mjs behaves on a machine without clang. Nothing here talks to the kernel.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { defaultAddonPath, defaultObjectPath, loadEbpfAddon, packageRoot } from '../../src/backends/ebpf/native.js';

const EM_BPF = 247;
const PROGRAM_SECTIONS = [
  'cgroup/connect4',
  'cgroup/connect6',
  'cgroup/sendmsg4',
  'cgroup/sendmsg6',
  'cgroup/recvmsg4',
  'cgroup/recvmsg6',
  'cgroup/getpeername4',
  'cgroup/getpeername6',
];

function assertBpfObject(path: string): void {
  const elf = readFileSync(path);
  assert.equal(elf.subarray(0, 4).toString('latin1'), '\x7fELF');
  assert.equal(elf.readUInt16LE(18), EM_BPF, 'e_machine is BPF');
  const text = elf.toString('latin1');
  for (const section of PROGRAM_SECTIONS) assert.ok(text.includes(section), `section ${section}`);
  assert.ok(text.includes('.BTF'), 'carries BTF (compiled with -g)');
}

describe('eBPF backend build', () => {
  it('the addon is built and loads', () => {
    const load = loadEbpfAddon();
    assert.ok(load.ok, load.ok ? '' : load.reason);
    assert.equal(load.path, defaultAddonPath());
    assert.match(load.addon.libbpfVersion, /^v?\d+\.\d+/);
    assert.equal(typeof load.addon.loadAndAttach, 'function');
  });

  it('the BPF object is built beside its source, for the BPF machine, with every program', () => {
    const path = defaultObjectPath();
    assert.equal(path, join(packageRoot(), 'bpf', 'ipvs_node_controller.bpf.o'));
    assert.ok(existsSync(path), `${path} is missing: run node scripts/build-bpf.mjs`);
    assertBpfObject(path);
  });

  it('an addon path that is not an addon gives one line saying so', () => {
    const dir = mkdtempSync(join(tmpdir(), 'ebpf-addon-'));
    try {
      const bogus = join(dir, 'ebpf_addon.node');
      writeFileSync(bogus, 'not a shared object');
      const load = loadEbpfAddon(bogus);
      assert.equal(load.ok, false);
      assert.match(load.ok ? '' : load.reason, /did not load .*: install libbpf1 and rebuild$/);
      const missing = loadEbpfAddon(join(dir, 'absent.node'));
      assert.match(missing.ok ? '' : missing.reason, /is not built: install libbpf-dev and pkg-config/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  describe('scripts/build-bpf.mjs', () => {
    // A scratch copy of the package's script and source, so the real bpf/ is never touched.
    let scratch: string;
    beforeEach(() => {
      scratch = mkdtempSync(join(tmpdir(), 'build-bpf-'));
      mkdirSync(join(scratch, 'scripts'));
      mkdirSync(join(scratch, 'bpf'));
      copyFileSync(join(packageRoot(), 'scripts', 'build-bpf.mjs'), join(scratch, 'scripts', 'build-bpf.mjs'));
      const source = 'ipvs_node_controller.bpf.c';
      copyFileSync(join(packageRoot(), 'bpf', source), join(scratch, 'bpf', source));
    });
    afterEach(() => rmSync(scratch, { recursive: true, force: true }));

    function buildBpf(env: NodeJS.ProcessEnv): { status: number | null; lines: string[] } {
      const r = spawnSync(process.execPath, [join(scratch, 'scripts', 'build-bpf.mjs')], { env, encoding: 'utf8' });
      return { status: r.status, lines: `${r.stdout}${r.stderr}`.split('\n').filter((l) => l.length > 0) };
    }

    it('exits 0 with one line naming clang when clang is missing', () => {
      const { status, lines } = buildBpf({ ...process.env, CLANG: join(scratch, 'no-clang') });
      assert.equal(status, 0);
      assert.equal(lines.length, 1, lines.join('\n'));
      assert.match(lines[0]!, /eBPF object not built: .*no-clang' not found \(install clang to use --backend=ebpf\)/);
      assert.equal(existsSync(join(scratch, 'bpf', 'ipvs_node_controller.bpf.o')), false);
    });

    it('compiles the object with clang', function () {
      this.timeout(30_000);
      const { status, lines } = buildBpf(process.env);
      assert.equal(status, 0, lines.join('\n'));
      assert.equal(lines.length, 1, lines.join('\n'));
      assert.match(lines[0]!, /eBPF object built: /);
      assertBpfObject(join(scratch, 'bpf', 'ipvs_node_controller.bpf.o'));
    });

    it('fails loudly when the source does not compile', function () {
      this.timeout(30_000);
      writeFileSync(join(scratch, 'bpf', 'ipvs_node_controller.bpf.c'), 'this is not C\n');
      const { status, lines } = buildBpf(process.env);
      assert.equal(status, 1);
      assert.match(lines.join('\n'), /eBPF object failed to compile/);
    });
  });
});
