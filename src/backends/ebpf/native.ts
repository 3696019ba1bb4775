// The typed face of the eBPF addon (native/bpf, libbpf) and where the built artifacts live.

import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export interface AttachedProgram {
  name: string;
  /** libbpf's name of the attach type, e.g. `cgroup_inet4_connect`. */
  attachType: string;
  programId: number;
  linkId: number;
  /** `created`: new link; `updated`: the pinned link now runs the new program; `replaced`: it pointed elsewhere. */
  link: 'created' | 'updated' | 'replaced';
}

export interface LoadReport {
  cgroupId: bigint;
  programs: AttachedProgram[];
  maps: Array<{ name: string; path: string; id: number; reused: boolean }>;
}

export interface PinnedMap {
  readonly name: string;
  readonly id: number;
  readonly keySize: number;
  readonly valueSize: number;
  readonly maxEntries: number;
  /** Inserts or overwrites; keys and values packed back to back. */
  update(keys: Buffer, values: Buffer): Promise<void>;
  /** Deletes; absent keys are skipped. Resolves to the number deleted. */
  delete(keys: Buffer): Promise<number>;
  dump(): Promise<{ keys: Buffer; values: Buffer }>;
  close(): void;
}

export interface EbpfAddon {
  loadAndAttach(options: { objectPath: string; bpffsPath: string; cgroupPath: string }): Promise<LoadReport>;
  checkLoad(objectPath: string): Promise<void>;
  removePinned(bpffsPath: string): Promise<{ detachedLinks: number; removedPins: number }>;
  PinnedMap: new (path: string) => PinnedMap;
  libbpfVersion: string;
}

export const ADDON_FILE = 'ebpf_addon.node';
export const OBJECT_FILE = 'ipvs_node_controller.bpf.o';

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

/** Where the compiled BPF object ships: beside its source (scripts/build-bpf.mjs writes it). */
export function defaultObjectPath(): string {
  return join(packageRoot(), 'bpf', OBJECT_FILE);
}

/** Where node-gyp puts the addon (binding.gyp target ebpf_addon). */
export function defaultAddonPath(): string {
  return join(packageRoot(), 'build', 'Release', ADDON_FILE);
}

export type AddonLoad = { ok: true; addon: EbpfAddon; path: string } | { ok: false; reason: string };

/** Loads the addon, or says in one line why it cannot. */
export function loadEbpfAddon(path = defaultAddonPath()): AddonLoad {
  if (!existsSync(path)) {
    return {
      ok: false,
      reason: `the eBPF addon ${path} is not built: install libbpf-dev and pkg-config, then run \`npm run build:native\``,
    };
  }
  try {
    return { ok: true, addon: createRequire(import.meta.url)(path) as EbpfAddon, path };
  } catch (err) {
    const first = (err as Error).message.split('\n')[0];
    return { ok: false, reason: `the eBPF addon ${path} did not load (${first}): install libbpf1 and rebuild` };
  }
}
