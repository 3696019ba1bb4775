// The eBPF backend's build artifacts: the addon and the BPF object are built and loadable, and
// scripts/build-bpf.mjs behaves on a machine without clang. Nothing here talks to the kernel.

import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { defaultAddonPath, defaultObjectPath, loadEbpfAddon, packageRoot } from '../../src/backends/ebpf/native.js';
import { withFileNotAnAddon } from '../support/temp-dir.js';

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
  expect(elf.subarray(0, 4).toString('latin1')).to.equal('\x7fELF');
  expect(elf.readUInt16LE(18), 'e_machine is BPF').to.equal(EM_BPF);
  const text = elf.toString('latin1');
  for (const section of PROGRAM_SECTIONS) expect(text, `section ${section}`).to.include(section);
  expect(text, 'carries BTF (compiled with -g)').to.include('.BTF');
}

describe('eBPF backend build', () => {
  it('the addon is built and loads', () => {
    const load = loadEbpfAddon();
    if (!load.ok) expect.fail(load.reason);
    expect(load.path).to.equal(defaultAddonPath());
    expect(load.addon.libbpfVersion).to.match(/^v?\d+\.\d+/);
    expect(typeof load.addon.loadAndAttach).to.equal('function');
  });

  it('the BPF object is built beside its source, for the BPF machine, with every program', () => {
    const path = defaultObjectPath();
    expect(path).to.equal(join(packageRoot(), 'bpf', 'ipvs_node_controller.bpf.o'));
    expect(existsSync(path), `${path} is missing: run node scripts/build-bpf.mjs`).to.equal(true);
    assertBpfObject(path);
  });

  it('an addon path that is not an addon gives one line saying so', () => {
    withFileNotAnAddon('ebpf_addon.node', (bogus, dir) => {
      const load = loadEbpfAddon(bogus);
      expect(load.ok).to.equal(false);
      expect(load.ok ? '' : load.reason).to.match(/did not load .*: install libbpf1 and rebuild$/);
      const missing = loadEbpfAddon(join(dir, 'absent.node'));
      expect(missing.ok ? '' : missing.reason).to.match(/is not built: install libbpf-dev and pkg-config/);
    });
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
      expect(status).to.equal(0);
      expect(lines, lines.join('\n')).to.have.lengthOf(1);
      expect(lines[0]!).to.match(
        /eBPF object not built: .*no-clang' not found \(install clang to use --backend=ebpf\)/,
      );
      expect(existsSync(join(scratch, 'bpf', 'ipvs_node_controller.bpf.o'))).to.equal(false);
    });

    it('compiles the object with clang', function () {
      const { status, lines } = buildBpf(process.env);
      expect(status, lines.join('\n')).to.equal(0);
      expect(lines, lines.join('\n')).to.have.lengthOf(1);
      expect(lines[0]!).to.match(/eBPF object built: /);
      assertBpfObject(join(scratch, 'bpf', 'ipvs_node_controller.bpf.o'));
    });

    it('fails loudly when the source does not compile', function () {
      writeFileSync(join(scratch, 'bpf', 'ipvs_node_controller.bpf.c'), 'this is not C\n');
      const { status, lines } = buildBpf(process.env);
      expect(status).to.equal(1);
      expect(lines.join('\n')).to.match(/eBPF object failed to compile/);
    });
  });
});
