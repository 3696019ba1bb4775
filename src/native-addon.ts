// The native addons (build/Release/*.node, built by node-gyp from binding.gyp): found the same
// way from this package's root, loaded the same way, and checked for their shape before use.

import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The directory holding this package's package.json, found from this module's location. */
export function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const manifest = join(dir, 'package.json');
    if (existsSync(manifest)) {
      try {
        if ((JSON.parse(readFileSync(manifest, 'utf8')) as { name?: string }).name === 'ipvs-node-controller')
          return dir;
      } catch {
        // not ours: keep walking up
      }
    }
    const up = dirname(dir);
    if (up === dir) throw new Error('cannot find the ipvs-node-controller package root');
    dir = up;
  }
}

/** Where node-gyp puts an addon of this package. */
export function addonPath(file: string): string {
  return join(packageRoot(), 'build', 'Release', file);
}

export type NativeLoad<T> = { ok: true; addon: T } | { ok: false; reason: string };

/** What to tell a user when an addon is not built, does not load, or is something else. */
export interface AddonMessages {
  missing(path: string): string;
  broken(path: string, error: string): string;
  notTheAddon(path: string): string;
}

/** Loads an addon, or says in one line why it cannot. Never throws. */
export function loadNativeAddon<T>(
  path: string,
  isAddon: (value: unknown) => value is T,
  messages: AddonMessages,
): NativeLoad<T> {
  if (!existsSync(path)) return { ok: false, reason: messages.missing(path) };
  let loaded: unknown;
  try {
    loaded = createRequire(import.meta.url)(path);
  } catch (err) {
    const firstLine = ((err as Error).message ?? String(err)).split('\n')[0] ?? '';
    return { ok: false, reason: messages.broken(path, firstLine) };
  }
  if (!isAddon(loaded)) return { ok: false, reason: messages.notTheAddon(path) };
  return { ok: true, addon: loaded };
}

/** True when `value` is an object with a function under each of `functions`. */
export function hasFunctions(value: unknown, functions: readonly string[]): boolean {
  if (typeof value !== 'object' || value === null) return false;
  const v = value as Record<string, unknown>;
  return functions.every((f) => typeof v[f] === 'function');
}
