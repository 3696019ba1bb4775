// Golden files: compare output with test/golden/<name>; UPDATE_GOLDEN=1 rewrites them.

import assert from 'node:assert/strict';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const GOLDEN_DIR = fileURLToPath(new URL('../../../test/golden/', import.meta.url));

export function assertGolden(name: string, actual: string): void {
  const path = GOLDEN_DIR + name;
  if (process.env.UPDATE_GOLDEN === '1') {
    writeFileSync(path, actual);
    return;
  }
  assert.ok(existsSync(path), `golden file ${path} is missing: run with UPDATE_GOLDEN=1 once and review it`);
  assert.equal(actual, readFileSync(path, 'utf8'), `output differs from ${path}`);
}
