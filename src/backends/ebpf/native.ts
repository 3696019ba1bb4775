// The typed face of the eBPF addon (native/bpf, libbpf) and where the built artifacts live.

import { join } from 'node:path';
import { addonPath, hasFunctions, loadNativeAddon, packageRoot } from '../../native-addon.js';

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
  /** The network namespace the programs count as the node's (this process's); 0n before Linux 5.14: the initial one. */
  nodeNetnsCookie: bigint;
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
  /** A per-CPU array of u64 (at most 64 slots): each slot summed over the possible CPUs, exactly. */
  sumPerCpu(): Promise<bigint[]>;
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

export { packageRoot };

/** Where the compiled BPF object ships: beside its source (scripts/build-bpf.mjs writes it). */
export function defaultObjectPath(): string {
  return join(packageRoot(), 'bpf', OBJECT_FILE);
}

/** Where node-gyp puts the addon (binding.gyp target ebpf_addon). */
export function defaultAddonPath(): string {
  return addonPath(ADDON_FILE);
}

function isEbpfAddon(value: unknown): value is EbpfAddon {
  return (
    hasFunctions(value, ['loadAndAttach', 'checkLoad', 'removePinned', 'PinnedMap']) &&
    typeof (value as EbpfAddon).libbpfVersion === 'string'
  );
}

export type AddonLoad = { ok: true; addon: EbpfAddon; path: string } | { ok: false; reason: string };

/** Loads the addon, or says in one line why it cannot. */
export function loadEbpfAddon(path = defaultAddonPath()): AddonLoad {
  const load = loadNativeAddon(path, isEbpfAddon, {
    missing: (p) =>
      `the eBPF addon ${p} is not built: install libbpf-dev and pkg-config, then run \`npm run build:native\``,
    broken: (p, error) => `the eBPF addon ${p} did not load (${error}): install libbpf1 and rebuild`,
    notTheAddon: (p) => `${p} is not the eBPF addon: run \`npm run build:native\``,
  });
  return load.ok ? { ok: true, addon: load.addon, path } : load;
}
