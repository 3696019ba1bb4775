// Tests check results, not time: a test that fails because the machine is busy says nothing about
// the code. test/run.mjs gives every test 120 s (mocha's own default is 2 s); a test file may set
// a timeout of its own, for a test that needs more, or below FLOOR_MS only with a comment saying
// why (on the line or in the comment right above it, starting "below the floor:"), e.g. a bound on one request
// inside a polling loop. The floor: CPU-bound work that takes a second on an idle machine takes
// ten to twenty times that on a 2-core machine that also builds or runs the other suites, and a
// timeout bounds a hang, which any generous value bounds as well.

import { expect } from 'chai';
import { readdir, readFile } from 'node:fs/promises';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const FLOOR_MS = 60_000;
const SUITES = ['unit', 'build', 'kernel', 'container', 'vm', 'support', 'doubles'];

/** Each mocha timeout (this.timeout(N)) and each `timeout: N` option a test file sets, with N. */
function timeoutsIn(text: string): Array<{ line: number; ms: number; text: string; why: boolean }> {
  const lines = text.split('\n');
  const found: Array<{ line: number; ms: number; text: string; why: boolean }> = [];
  const literal = /(?:\.timeout\(\s*|\btimeout:\s*)(\d[\d_]*)\b/g;
  lines.forEach((l, i) => {
    for (const m of l.matchAll(literal)) {
      // The line itself, or the comment lines right above it.
      const above: string[] = [];
      for (let j = i - 1; j >= 0 && /^\s*\/\//.test(lines[j]!); j--) above.push(lines[j]!);
      const why = [l, ...above].some((c) => /\/\/\s*below the floor:/.test(c));
      found.push({ line: i + 1, ms: Number(m[1]!.replaceAll('_', '')), text: l.trim(), why });
    }
  });
  return found;
}

async function testFiles(): Promise<string[]> {
  const files: string[] = [];
  for (const suite of SUITES) {
    const dir = join(repoRoot, 'test', suite);
    const entries = await readdir(dir, { recursive: true }).catch(() => [] as string[]);
    for (const e of entries) if (/\.(ts|mjs)$/.test(e)) files.push(join(dir, e));
  }
  return files;
}

describe('test timeouts: none below the floor without a reason', () => {
  it('finds this.timeout(N) and timeout: N, and the reason', () => {
    const found = timeoutsIn(
      [
        'this.timeout(10_000);',
        'run(cmd, { reject: false, timeout: 2000 });',
        '// below the floor: one request of a polling loop,',
        '// retried by the loop',
        'http.get({ timeout: 5_000 });',
        'this.timeout(120_000);',
      ].join('\n'),
    );
    expect(found.map((f) => [f.line, f.ms, f.why])).to.deep.equal([
      [1, 10_000, false],
      [2, 2000, false],
      [5, 5000, true],
      [6, 120_000, false],
    ]);
  });

  it(`no test file sets a timeout below ${FLOOR_MS / 1000} s without saying why`, async () => {
    const files = await testFiles();
    expect(files.length).to.be.greaterThan(50);
    const short: string[] = [];
    for (const file of files) {
      if (file.endsWith('test-timeouts.test.ts')) continue;
      for (const t of timeoutsIn(await readFile(file, 'utf8')))
        if (t.ms < FLOOR_MS && !t.why) short.push(`${relative(repoRoot, file)}:${t.line}: ${t.text}`);
    }
    expect(short, 'raise or remove them (test/run.mjs gives 120 s), or say why above them').to.deep.equal([]);
  });

  it('test/run.mjs gives every test at least the floor', async () => {
    const run = await readFile(join(repoRoot, 'test', 'run.mjs'), 'utf8');
    const m = /'--timeout',\s*'(\d+)'/.exec(run);
    expect(Number(m?.[1])).to.be.at.least(FLOOR_MS);
  });
});
