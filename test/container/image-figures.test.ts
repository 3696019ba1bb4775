// The image's sizes as docs/operations.md ("The image") and the README give them, held to what
// `npm run image:sizes` measures of the images built here (scripts/image-sizes.mjs): each figure
// within a tenth of the measured one (Debian's point releases and the bundle move them a little;
// a figure further off is out of date). The compressed sizes need the release's release.json
// (`npm run release`, as CI runs it); without it those two are left out and the figures say so.

import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';

const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const VERSION = (JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { version: string }).version;
const IMAGE = `localhost/ipvs-node-controller:${VERSION}`;

interface Measured {
  image: string;
  architecture: string;
  compressedBytes?: number;
  unpackedBytes: number;
  nodeBytes: number;
  controllerBytes: number;
  debianBytes: number;
  debianPackages: number;
}

/** docs/operations.md's size table: row label -> [amd64 MB, arm64 MB]. */
function documentedTable(): Map<string, [number, number]> {
  const doc = readFileSync(join(repoRoot, 'docs', 'operations.md'), 'utf8');
  const table = new Map<string, [number, number]>();
  for (const line of doc.split('\n')) {
    const m = /^\| ((?:compressed|unpacked|of which)[^|]*) \| ([\d.]+) MB \| ([\d.]+) MB \|$/.exec(line);
    if (m) table.set(m[1]!, [Number(m[2]), Number(m[3])]);
  }
  return table;
}

function near(documentedMb: number, bytes: number, what: string): void {
  const measuredMb = bytes / 1e6;
  expect(
    Math.abs(documentedMb - measuredMb),
    `${what}: documented ${documentedMb} MB, measured ${measuredMb.toFixed(1)} MB`,
  ).to.be.at.most(Math.max(0.1 * measuredMb, 0.2));
}

describe('the image sizes the docs give are the measured ones', function () {
  this.timeout(300_000);
  const figures: string[] = [];
  let measured: Measured[] = [];

  before(function () {
    const env = { ...process.env, CONTAINERS_CONF: join(repoRoot, 'scripts', 'containers.conf') };
    if (spawnSync('podman', ['image', 'exists', IMAGE], { env }).status !== 0) {
      if (process.env.IPVS_NODE_CONTROLLER_REQUIRE_IMAGE === '1')
        throw new Error(`the image ${IMAGE} is not built (npm run image)`);
      console.log(`    skipped: the image ${IMAGE} is not built: run \`npm run image\` first`);
      this.skip();
    }
    const r = spawnSync(process.execPath, [join(repoRoot, 'scripts', 'image-sizes.mjs'), '--json'], {
      env,
      encoding: 'utf8',
      timeout: 240_000,
    });
    expect(r.status, r.stderr).to.equal(0);
    measured = JSON.parse(r.stdout) as Measured[];
  });

  after(() => {
    if (figures.length > 0) console.log(`\n    figures:\n${figures.map((f) => `      ${f}`).join('\n')}`);
  });

  it("docs/operations.md's table: each architecture built here, row by row", () => {
    const table = documentedTable();
    expect([...table.keys()]).to.have.length(5);
    const row = (prefix: string) => [...table].find(([label]) => label.startsWith(prefix))![1];
    const debian = [...table.keys()].find((l) => / Debian packages$/.test(l));
    expect(debian, 'a row for the Debian packages').to.be.a('string');
    expect(measured.length, 'images measured').to.be.greaterThan(0);
    for (const m of measured) {
      const column = m.architecture === 'arm64' ? 1 : 0;
      near(row('unpacked')[column], m.unpackedBytes, `${m.architecture} unpacked`);
      near(row('of which Node.js')[column], m.nodeBytes, `${m.architecture} Node.js`);
      near(row('of which the controller')[column], m.controllerBytes, `${m.architecture} controller`);
      near(table.get(debian!)![column], m.debianBytes, `${m.architecture} Debian packages`);
      expect(debian, 'the package count').to.include(`the ${m.debianPackages} Debian packages`);
      if (m.compressedBytes === undefined)
        figures.push(`${m.architecture}: no release.json (npm run release): compressed not compared`);
      else near(row('compressed')[column], m.compressedBytes, `${m.architecture} compressed`);
      figures.push(
        `${m.architecture}: unpacked ${(m.unpackedBytes / 1e6).toFixed(1)} MB, Node.js ${(m.nodeBytes / 1e6).toFixed(1)} MB, ` +
          `${m.debianPackages} Debian packages ${(m.debianBytes / 1e6).toFixed(1)} MB, controller ${(m.controllerBytes / 1e6).toFixed(1)} MB` +
          (m.compressedBytes === undefined ? '' : `, compressed ${(m.compressedBytes / 1e6).toFixed(1)} MB`),
      );
    }
  });

  it("the README's sentence: compressed per architecture, unpacked on amd64 and on arm64", () => {
    const prose = readFileSync(join(repoRoot, 'README.md'), 'utf8').replace(/\s+/g, ' ');
    const m = /(\d+) MB compressed per architecture, (\d+) MB unpacked on amd64, (\d+) MB on arm64/.exec(prose);
    expect(m, 'the README gives the sizes').to.not.equal(null);
    for (const one of measured) {
      near(
        Number(one.architecture === 'arm64' ? m![3] : m![2]),
        one.unpackedBytes,
        `README ${one.architecture} unpacked`,
      );
      if (one.compressedBytes !== undefined)
        near(Number(m![1]), one.compressedBytes, `README ${one.architecture} compressed`);
    }
  });
});
