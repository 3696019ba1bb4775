// Files a test writes for itself: a directory of its own under the system's temporary one,
// removed after, whatever the test did.

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** Runs `use` (synchronous) with a new temporary directory whose name starts with `prefix`, then removes it. */
export function withTempDir<T>(prefix: string, use: (dir: string) => T): T {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  try {
    return use(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * Runs `use` with the path of a file named `name` that is not a shared object (an addon path
 * that does not load), in a temporary directory; `use` may put more beside it.
 */
export function withFileNotAnAddon(name: string, use: (path: string, dir: string) => void): void {
  withTempDir('not-an-addon-', (dir) => {
    const path = join(dir, name);
    writeFileSync(path, 'not a shared object');
    use(path, dir);
  });
}
