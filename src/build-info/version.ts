// What this build is: the package version, the source revision and the Node.js running it, and
// the kernel it runs on (what each backend may program depends on it: docs/operations.md, Kernels).
// The bundle (scripts/bundle.mjs) stamps version and revision in at build time through esbuild's
// `define`; unbundled (dist/, tests), the version is read from package.json and the revision is
// `unknown`.

import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { release, type, version } from 'node:os';
import { fileURLToPath } from 'node:url';

declare const IPVS_NODE_CONTROLLER_VERSION: string | undefined;
declare const IPVS_NODE_CONTROLLER_REVISION: string | undefined;

export interface BuildInfo {
  version: string;
  revision: string;
  nodeVersion: string;
  /** The kernel's name and release, as `uname -sr` prints them: `Linux 6.1.0-28-amd64`. */
  kernel: string;
  /** The kernel's build, as `uname -v` prints it (a distribution's package version is in it). */
  kernelVersion: string;
}

function versionFromPackageJson(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const manifest = join(dir, 'package.json');
    if (existsSync(manifest)) {
      try {
        const pkg = JSON.parse(readFileSync(manifest, 'utf8')) as { name?: string; version?: string };
        if (pkg.name === 'ipvs-node-controller' && pkg.version) return pkg.version;
      } catch {
        // not ours: keep walking up
      }
    }
    const up = dirname(dir);
    if (up === dir) return 'unknown';
    dir = up;
  }
}

let cached: BuildInfo | undefined;

export function buildInfo(): BuildInfo {
  cached ??= {
    version: typeof IPVS_NODE_CONTROLLER_VERSION === 'string' ? IPVS_NODE_CONTROLLER_VERSION : versionFromPackageJson(),
    revision: typeof IPVS_NODE_CONTROLLER_REVISION === 'string' ? IPVS_NODE_CONTROLLER_REVISION : 'unknown',
    nodeVersion: process.version,
    kernel: `${type()} ${release()}`,
    kernelVersion: version(),
  };
  return cached;
}
