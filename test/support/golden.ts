// Golden files: compare output with test/golden/<name>; UPDATE_GOLDEN=1 rewrites them.

import { expect } from 'chai';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const GOLDEN_DIR = fileURLToPath(new URL('../../../test/golden/', import.meta.url));

export function assertGolden(name: string, actual: string): void {
  const path = GOLDEN_DIR + name;
  if (process.env.UPDATE_GOLDEN === '1') {
    writeFileSync(path, actual);
    return;
  }
  expect(existsSync(path), `golden file ${path} is missing: run with UPDATE_GOLDEN=1 once and review it`).to.equal(
    true,
  );
  expect(actual, `output differs from ${path}`).to.equal(readFileSync(path, 'utf8'));
}
