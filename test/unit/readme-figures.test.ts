// What the README shows, held to what the code does: the flags table against the command's own
// options (every flag listed, every listed default the one the command has), the figures it
// quotes from the code (the probe's and `check`'s bounds), and the `npm run preview` output it
// prints against the output of that very command on examples/services.yaml. The demo's transcript
// is held to the demo by test/kernel/demo.test.ts; the image's sizes by the container suite.

import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { execa } from 'execa';
import { buildCommand } from '../../src/config/flags.js';
import { DEFAULT_PROBED_SERVICES } from '../../src/config/probe-settings.js';
import { DEFAULT_SAMPLE, MAX_SAMPLE } from '../../src/cli/check/check-options.js';
import { codeBlockAfter, shownAsPrinted } from '../support/readme.js';

const README = readFileSync(new URL('../../../README.md', import.meta.url), 'utf8');
/** The README's prose with its line breaks and runs of spaces made one space. */
const PROSE = README.replace(/\s+/g, ' ');
const CLI = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const EXAMPLES = fileURLToPath(new URL('../../../examples/services.yaml', import.meta.url));

/** The rows of the README's "## Flags" table: the flag's long name and its default cell. */
function flagRows(): Map<string, string> {
  const section = README.slice(
    README.indexOf('\n## Flags\n'),
    README.indexOf('\n## ', README.indexOf('\n## Flags\n') + 1),
  );
  const rows = new Map<string, string>();
  for (const line of section.split('\n')) {
    const m = /^\| `(--[a-z0-9-]+)[^`]*` \|([^|]*)\|/.exec(line);
    if (m) rows.set(m[1]!, m[2]!.trim());
  }
  return rows;
}

describe('README: what it shows is what the code does', () => {
  it('the flags table lists every flag of the command, and each default it gives as a value is the default', () => {
    const rows = flagRows();
    const options = buildCommand().options.filter((o) => !o.hidden && o.long !== undefined);
    // Aliases (kube-proxy's names) are named in the row of the flag they stand for.
    const aliases = options.filter((o) => README.includes(`Also \`${o.long}\``)).map((o) => o.long!);
    const listed = options.map((o) => o.long!).filter((l) => !aliases.includes(l));
    expect([...rows.keys()].sort(), 'README rows').to.deep.equal(
      listed.filter((l) => l !== '--help' && l !== '--version').sort(),
    );
    let compared = 0;
    for (const option of options) {
      const cell = rows.get(option.long!);
      const m = cell === undefined ? null : /^`([^`]+)`$/.exec(cell);
      if (!m) continue;
      compared += 1;
      expect(String(option.defaultValue), `${option.long}'s default`).to.equal(m[1]);
    }
    const booleans = options.filter((o) => rows.get(o.long!) === 'off');
    for (const option of booleans) expect(option.defaultValue, `${option.long} is off`).to.equal(false);
    // So that a table the parser no longer reads cannot pass.
    expect(compared, 'defaults compared').to.be.greaterThan(10);
  });

  it("quotes the probe's and check's bounds as the code has them", () => {
    expect(PROSE).to.include(`(at most ${DEFAULT_PROBED_SERVICES} in all, every 30 s`);
    const probeInterval = buildCommand().options.find((o) => o.long === '--probe-interval');
    expect(probeInterval?.defaultValue).to.equal('30s');
    expect(PROSE).to.include(`a sample of ${DEFAULT_SAMPLE} Services (\`--sample\`, at most ${MAX_SAMPLE})`);
  });

  it('prints the output of npm run preview as the command prints it (abridged where it says so)', async function () {
    this.timeout(60_000);
    const run = await execa(process.execPath, [CLI, '--dry-run', '--from-file', EXAMPLES], { reject: false });
    expect(run.exitCode, run.stderr).to.equal(0);
    const shown = codeBlockAfter(README, '`npm run preview` (abridged to the IPv4 table):');
    // `...` marks what the README leaves out; every other line is the command's, in its order.
    const elided = (l: string) => /^\s*(# )?\.\.\. /.test(l);
    expect(shown.filter((l) => !elided(l)).length).to.be.greaterThan(30);
    expect(shownAsPrinted(shown, run.stdout.split('\n'), elided)).to.deep.equal({ missing: undefined });
  });
});
