#!/usr/bin/env node
// The version lives in package.json. This writes it everywhere else it appears: the Dockerfile's
// VERSION default, the image tag (deploy/components/image) and the app.kubernetes.io/version label (deploy/base), and the
// image tag in README.md's install commands. npm runs it on `npm version <new>` (the "version"
// script); test/build/deploy-version.test.ts fails while any copy is out of step.
//
//   node scripts/stamp-version.mjs           write
//   node scripts/stamp-version.mjs --check   exit 1 and name the files that are out of step

import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const { version } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const V = '\\d+\\.\\d+\\.\\d+(?:-[0-9A-Za-z.-]+)?';

/** Each file with the patterns whose version group is replaced. */
export const STAMPS = [
  {
    file: 'Dockerfile',
    patterns: [new RegExp(`^(ARG VERSION=)(${V})$`, 'm'), new RegExp(`(ipvs-node-controller:)(${V})`, 'g')],
  },
  {
    file: 'deploy/base/kustomization.yaml',
    patterns: [new RegExp(`^(\\s+app.kubernetes.io/version: ')(${V})(?=')`, 'm')],
  },
  {
    file: 'deploy/components/image/kustomization.yaml',
    patterns: [new RegExp(`^(\\s+newTag: )(${V})$`, 'm'), new RegExp(`(ipvs-node-controller:)(${V})`, 'g')],
  },
  { file: 'README.md', patterns: [new RegExp(`(ipvs-node-controller:)(${V})`, 'g')] },
  { file: 'docs/operations.md', patterns: [new RegExp(`(ipvs-node-controller:)(${V})`, 'g')] },
];

export function stamp(text, patterns, to) {
  let found = 0;
  let out = text;
  for (const p of patterns) {
    out = out.replace(p, (_m, head) => {
      found++;
      return `${head}${to}`;
    });
  }
  return { out, found };
}

const check = process.argv.includes('--check');
let bad = 0;
for (const { file, patterns } of STAMPS) {
  const path = join(root, file);
  const text = readFileSync(path, 'utf8');
  const { out, found } = stamp(text, patterns, version);
  if (found < patterns.length) {
    console.error(`stamp-version: ${file}: a version pattern is missing`);
    bad++;
  } else if (out !== text) {
    if (check) {
      console.error(`stamp-version: ${file} does not say ${version} (run node scripts/stamp-version.mjs)`);
      bad++;
    } else {
      writeFileSync(path, out);
      console.log(`stamp-version: ${file} -> ${version}`);
    }
  }
}
process.exit(bad > 0 ? 1 : 0);
