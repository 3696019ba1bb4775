// The version lives in package.json and is the same everywhere it appears: the copies that
// scripts/stamp-version.mjs writes, the CHANGELOG, the CLI (--version, -V, unbundled and
// bundled, where the revision is stamped in), and the build_info metric.

import { expect } from 'chai';
import { execFile } from 'node:child_process';
import { readFile, readdir } from 'node:fs/promises';
import { release, type } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { ControllerMetrics } from '../../src/metrics/controller-metrics.js';
import { buildInfo } from '../../src/build-info/version.js';

const run = promisify(execFile);
const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const DIST_CLI = join(repoRoot, 'dist', 'src', 'cli', 'main.js');
const BUNDLE_CLI = join(repoRoot, 'dist', 'bundle', 'ipvs-node-controller.mjs');
const LAUNCHER = join(repoRoot, 'bin', 'ipvs-node-controller.mjs');

describe('the version', function () {
  let version: string;

  before(async () => {
    version = (JSON.parse(await readFile(join(repoRoot, 'package.json'), 'utf8')) as { version: string }).version;
  });

  it('is stamped everywhere it appears (scripts/stamp-version.mjs --check)', async () => {
    const { stdout, stderr } = await run(process.execPath, [join(repoRoot, 'scripts', 'stamp-version.mjs'), '--check']);
    expect(stdout + stderr).to.equal('');
  });

  it('has its entry at the top of CHANGELOG.md', async () => {
    const changelog = await readFile(join(repoRoot, 'CHANGELOG.md'), 'utf8');
    // Above it, changes not released yet may gather under `## Unreleased`.
    expect(/^## (?!Unreleased$)(\S+)/m.exec(changelog)?.[1]).to.equal(version);
  });

  for (const [what, cli] of [
    ['dist/', DIST_CLI],
    ['the bundle', BUNDLE_CLI],
    ["package.json's bin", LAUNCHER],
  ] as const) {
    it(`--version and -V print it (${what}) and exit 0`, async () => {
      for (const flag of ['--version', '-V']) {
        const { stdout } = await run(process.execPath, [cli, flag]);
        expect(stdout.trim()).to.equal(version);
      }
    });
  }

  it('the bundle carries the version and the revision it was built from', async () => {
    const dir = join(repoRoot, 'dist', 'bundle');
    const files = (await readdir(dir, { recursive: true })).filter((f) => f.endsWith('.mjs'));
    const text = (await Promise.all(files.map((f) => readFile(join(dir, f), 'utf8')))).join('\n');
    expect(text).to.not.include('IPVS_NODE_CONTROLLER_REVISION');
    expect(text).to.match(
      new RegExp(`version:"${version.replace(/\./g, '\\.')}",revision:"(?:[0-9a-f]{40}(?:-dirty)?|unknown)"`),
    );
  });

  it('ipvs_node_controller_build_info says version, revision, Node.js version and the kernel', async () => {
    const { text } = await new ControllerMetrics({ defaultMetrics: false }).exposition();
    const info = buildInfo();
    expect(info.version).to.equal(version);
    expect(info.kernel).to.equal(`${type()} ${release()}`);
    expect(text).to.include(
      `ipvs_node_controller_build_info{version="${version}",revision="${info.revision}",node_version="${process.version}",` +
        `kernel="${info.kernel}",kernel_version="${info.kernelVersion}"} 1`,
    );
  });
});
