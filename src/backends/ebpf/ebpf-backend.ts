// The eBPF backend: cgroup socket hooks translate (external IP, protocol, port) to
// (ClusterIP, port) when a socket connects or sends, for every process under a cgroup v2
// directory whatever its network namespace. The programs, their cgroup links and the maps are
// pinned under a bpffs directory, so translation goes on while no controller runs and a new
// controller process carries on with the same maps.
//
// A sync writes map elements only: upserts first, then deletes, so an entry present before and
// after never disappears. A partial sync writes the elements that changed and nothing else, found
// at the cost of the changes (ElementStorage, as the nft backend); a full sync compares with a
// dump of the map. Each element changes atomically; a sync as a whole does not (a
// concurrent connect sees some of a sync's changes and not others), unlike an nft transaction.

import { existsSync, readdirSync, rmdirSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';

import { FAMILIES, type DesiredState, type Entry, type Family, type FamilyState } from '../../model/types.js';
import {
  BackendError,
  type Backend,
  type EntryCapacity,
  type ProbeResult,
  type SyncOptions,
  type SyncResult,
} from '../backend.js';
import { ElementStorage } from '../element-storage.js';
import {
  BPF_FS_MAGIC,
  CGROUP2_SUPER_MAGIC,
  MINIMUM_KERNEL,
  atLeast,
  filesystemTypeOf,
  kernelVersion,
  missingCapabilities,
  readCgroup2MountPoint,
  readEffectiveCapabilities,
  runningKernel,
} from './host-support.js';
import { ENTRY_MAP_CAPACITY, dumpChanges, elementWrites, encodeKeys, encodeValues, KEY_SIZE } from './map-codec.js';
import {
  defaultObjectPath,
  loadEbpfAddon,
  type AddonLoad,
  type EbpfAddon,
  type LoadReport,
  type PinnedMap,
} from './native.js';

export const DEFAULT_BPFFS_PATH = '/sys/fs/bpf/ipvs-node-controller';

/** Map names in the BPF object; pinned as <bpffs>/maps/<name>. */
export const ENTRY_MAP_NAME: Record<Family, string> = { ipv4: 'entries_v4', ipv6: 'entries_v6' };
/** Subdirectories of the bpffs directory, as the addon lays them out. */
export const PIN_DIRECTORIES = ['links', 'programs', 'maps'] as const;

export interface EbpfBackendOptions {
  /** cgroup v2 directory the programs attach to; every socket created below it is translated. */
  cgroupPath: string;
  /** bpffs directory for the pins (--bpffs-path). */
  bpffsPath: string;
  /** The compiled BPF object; defaults to the one built into this package. */
  objectPath?: string;
}

/** The node's cgroup v2 root (the cgroup2 mount in /proc/mounts), or undefined when none is mounted. */
export function defaultCgroupPath(): string | undefined {
  return readCgroup2MountPoint();
}

/** The entry maps are created with a fixed size. */
export const EBPF_CAPACITY: EntryCapacity = {
  defaultEntries: ENTRY_MAP_CAPACITY,
  maxEntries: ENTRY_MAP_CAPACITY,
  why: `the entry maps hold ${ENTRY_MAP_CAPACITY}`,
};

export class EbpfBackend implements Backend {
  readonly name = 'ebpf' as const;
  readonly capacity = EBPF_CAPACITY;
  readonly cgroupPath: string;
  readonly bpffsPath: string;
  readonly objectPath: string;
  private addonLoad: AddonLoad | undefined;
  private maps: Record<Family, PinnedMap> | undefined;
  /** What this process last wrote, per family; absent until a full sync of that family succeeded. */
  private readonly programmed = new Map<Family, ElementStorage>();
  private attachment: LoadReport | undefined;
  /** Map elements written since this backend was made, per family (for tests and logs). */
  readonly written: Record<Family, { upserted: number; deleted: number }> = {
    ipv4: { upserted: 0, deleted: 0 },
    ipv6: { upserted: 0, deleted: 0 },
  };

  constructor(options: EbpfBackendOptions) {
    this.cgroupPath = options.cgroupPath;
    this.bpffsPath = options.bpffsPath;
    this.objectPath = options.objectPath ?? defaultObjectPath();
  }

  /** What the last attach did (program, link and map ids), for logs. */
  get lastAttachment(): LoadReport | undefined {
    return this.attachment;
  }

  private addon(): AddonLoad {
    this.addonLoad ??= loadEbpfAddon();
    return this.addonLoad;
  }

  private requireAddon(): EbpfAddon {
    const load = this.addon();
    if (!load.ok) throw new BackendError(load.reason, 'ebpf');
    return load.addon;
  }

  async probe(): Promise<ProbeResult> {
    const problems: string[] = [];
    const load = this.addon();
    if (!load.ok) problems.push(load.reason);
    if (!existsSync(this.objectPath)) {
      problems.push(
        `the eBPF object ${this.objectPath} is not built: install clang and libbpf-dev, then run scripts/build-bpf.mjs`,
      );
    }
    const kernel = runningKernel();
    const version = kernelVersion(kernel);
    if (!version || !atLeast(version, MINIMUM_KERNEL)) {
      problems.push(`kernel ${kernel} is too old: the eBPF backend needs Linux ${MINIMUM_KERNEL.join('.')} or newer`);
    }
    const cgroupFs = existsSync(this.cgroupPath) ? filesystemTypeOf(this.cgroupPath) : undefined;
    if (!cgroupFs || cgroupFs.type !== CGROUP2_SUPER_MAGIC) {
      problems.push(
        `${this.cgroupPath} is not a cgroup v2 directory: mount cgroup2 (mount -t cgroup2 none /sys/fs/cgroup) or pass --cgroup-path`,
      );
    }
    const bpffs = filesystemTypeOf(this.bpffsPath);
    if (!bpffs || bpffs.type !== BPF_FS_MAGIC) {
      problems.push(
        `${this.bpffsPath} is not on a bpffs mount: mount one (mount -t bpf bpf /sys/fs/bpf) or pass --bpffs-path`,
      );
    }
    const caps = readEffectiveCapabilities();
    const missing = caps === undefined ? ['CAP_BPF', 'CAP_NET_ADMIN'] : missingCapabilities(caps);
    if (missing.length > 0) {
      problems.push(
        `missing capabilities ${missing.join(', ')} (or CAP_SYS_ADMIN): grant them to load and attach eBPF programs`,
      );
    }
    if (problems.length > 0) return { ok: false, detail: problems.join('; ') };
    try {
      // Loads (and drops) the programs: the verifier of this very kernel accepts them.
      await (load as Extract<AddonLoad, { ok: true }>).addon.checkLoad(this.objectPath);
    } catch (err) {
      return { ok: false, detail: `the kernel refused the eBPF programs: ${(err as Error).message}` };
    }
    // Only the root of the hierarchy lacks cgroup.type; a container's private cgroup namespace
    // shows its own cgroup as /sys/fs/cgroup, which would cover that container alone.
    const scope = existsSync(join(this.cgroupPath, 'cgroup.type'))
      ? `; ${this.cgroupPath} is not the root cgroup: only processes below it are translated`
      : '';
    return {
      ok: true,
      detail: `eBPF cgroup socket hooks on ${this.cgroupPath}, pinned in ${this.bpffsPath} (libbpf ${
        (load as Extract<AddonLoad, { ok: true }>).addon.libbpfVersion
      }, kernel ${kernel})${scope}`,
    };
  }

  async sync(desired: DesiredState, options: SyncOptions): Promise<SyncResult> {
    const addon = this.requireAddon();
    for (const family of FAMILIES) {
      const n = desired[family].entries.length;
      if (n > ENTRY_MAP_CAPACITY) {
        throw new BackendError(
          `${n} ${family} entries exceed the eBPF map capacity of ${ENTRY_MAP_CAPACITY}: use the nft backend`,
          'ebpf',
        );
      }
    }
    if (options.full || this.maps === undefined) {
      // A full sync also repairs the attachment: detached links, removed pins, a new cgroup path.
      try {
        await this.attach(addon);
      } catch (err) {
        throw new BackendError(`ebpf attach failed: ${(err as Error).message}`, 'ebpf');
      }
    }
    const modes: Array<SyncResult['mode']> = [];
    const failures: string[] = [];
    for (const family of FAMILIES) {
      try {
        modes.push(await this.syncFamily(family, desired[family], options.full));
      } catch (err) {
        this.programmed.delete(family);
        failures.push(`${family}: ${(err as Error).message}`);
      }
    }
    if (failures.length > 0) throw new BackendError(`ebpf sync failed: ${failures.join('; ')}`, 'ebpf');
    return {
      mode: modes.includes('full') ? 'full' : modes.includes('partial') ? 'partial' : 'noop',
      entries: { ipv4: desired.ipv4.entries.length, ipv6: desired.ipv6.entries.length },
    };
  }

  private async attach(addon: EbpfAddon): Promise<void> {
    this.attachment = await addon.loadAndAttach({
      objectPath: this.objectPath,
      bpffsPath: this.bpffsPath,
      cgroupPath: this.cgroupPath,
    });
    // The maps may be new (first run, pins removed): open them afresh by their pins.
    this.closeMaps();
    const opened: Partial<Record<Family, PinnedMap>> = {};
    try {
      for (const family of FAMILIES) opened[family] = new addon.PinnedMap(this.mapPath(family));
    } catch (err) {
      for (const m of Object.values(opened)) m.close();
      throw err;
    }
    this.maps = opened as Record<Family, PinnedMap>;
    this.programmed.clear();
  }

  private async syncFamily(family: Family, state: FamilyState, full: boolean): Promise<SyncResult['mode']> {
    const map = this.maps![family];
    const before = this.programmed.get(family);
    if (!full && before) {
      try {
        const changes = before.changesTo(state);
        const { upserts, deletes } = elementWrites(changes);
        const wrote = await this.write(family, map, upserts, encodeKeys(family, deletes));
        before.commit(state, changes);
        return wrote ? 'partial' : 'noop';
      } catch {
        // What we wrote may not be what the map holds now: compare with the map itself.
        this.programmed.delete(family);
      }
    }
    const dump = await map.dump();
    const { upserts, deleteKeys } = dumpChanges(family, dump, state.entries);
    await this.write(family, map, upserts, deleteKeys);
    this.programmed.set(family, new ElementStorage(state));
    return 'full';
  }

  /** Upserts, then deletes (packed keys); returns whether anything was written. */
  private async write(family: Family, map: PinnedMap, upserts: readonly Entry[], deleteKeys: Buffer): Promise<boolean> {
    if (upserts.length > 0) {
      await map.update(encodeKeys(family, upserts), encodeValues(family, upserts));
      this.written[family].upserted += upserts.length;
    }
    if (deleteKeys.length > 0) {
      await map.delete(deleteKeys);
      this.written[family].deleted += deleteKeys.length / KEY_SIZE[family];
    }
    return upserts.length > 0 || deleteKeys.length > 0;
  }

  async cleanup(): Promise<void> {
    this.closeMaps();
    this.programmed.clear();
    this.attachment = undefined;
    // Without a bpffs where the pins would be, nothing can be seen, let alone removed: say so
    // rather than report a clean node (the node's bpffs may be mounted elsewhere, e.g. /host/sys/fs/bpf).
    const fs = filesystemTypeOf(this.bpffsPath);
    if (!fs || fs.type !== BPF_FS_MAGIC) {
      throw new BackendError(
        `ebpf cleanup: ${fs?.checked ?? this.bpffsPath} is not on a bpffs mount, so the pins under ${this.bpffsPath} ` +
          `cannot be seen: mount the node's bpffs there or pass --bpffs-path`,
        'ebpf',
      );
    }
    const load = this.addon();
    try {
      if (load.ok) await load.addon.removePinned(this.bpffsPath);
      else removePinsWithoutAddon(this.bpffsPath);
    } catch (err) {
      throw new BackendError(`ebpf cleanup failed: ${(err as Error).message}`, 'ebpf');
    }
  }

  async close(): Promise<void> {
    this.closeMaps();
  }

  /** Whether pins of ours exist (a leftover of another backend choice, say). */
  async hasState(): Promise<boolean> {
    return PIN_DIRECTORIES.some((d) => existsSync(join(this.bpffsPath, d)));
  }

  private mapPath(family: Family): string {
    return join(this.bpffsPath, 'maps', ENTRY_MAP_NAME[family]);
  }

  private closeMaps(): void {
    if (this.maps) for (const family of FAMILIES) this.maps[family].close();
    this.maps = undefined;
  }
}

/**
 * Cleanup on a node where the addon cannot load: removing the last pin of a link detaches it
 * (no process holds it), so unlinking our pins is enough. Only our own subdirectories are touched.
 */
function removePinsWithoutAddon(bpffsPath: string): void {
  if (!existsSync(bpffsPath)) return;
  for (const dir of PIN_DIRECTORIES) {
    const path = join(bpffsPath, dir);
    if (!existsSync(path)) continue;
    for (const name of readdirSync(path)) unlinkSync(join(path, name));
    rmdirSync(path);
  }
  rmdirSync(bpffsPath);
}
