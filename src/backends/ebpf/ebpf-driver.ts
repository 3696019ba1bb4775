// The eBPF driver: cgroup socket hooks translate (external IP, protocol, port) to
// (ClusterIP, port) when a socket connects or sends, for every process under a cgroup v2
// directory whatever its network namespace. The programs, their cgroup links and the maps are
// pinned under a bpffs directory, so translation goes on while no controller runs and a new
// controller process carries on with the same maps.
//
// Writes are map elements only: upserts first, then deletes, so an entry present before and
// after never disappears. Each element changes atomically; a write as a whole does not (a
// concurrent connect sees some of its changes and not others), unlike an nft transaction. A
// family written whole, and a read back, compare with a dump of the map, on the bytes.

import { existsSync, readdirSync, rmdirSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';

import { FAMILIES, type DesiredState, type Entry, type Family } from '../../model/types.js';
import {
  BackendError,
  type Applied,
  type Driver,
  type DriverCapabilities,
  type DriverOperation,
  type EntryCapacity,
  type KernelElement,
  type ProbeResult,
  type FamilyShape,
  type ReadBack,
  type TranslatedConnections,
} from '../../driver/driver.js';
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
import { COUNTER_MAP_NAME, translatedRows } from './counters.js';
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

export interface EbpfDriverOptions {
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

export class EbpfDriver implements Driver {
  readonly name = 'ebpf' as const;
  readonly label = 'ebpf';
  readonly capacity = EBPF_CAPACITY;
  readonly capabilities: DriverCapabilities = {
    transactional: false,
    translates: 'sockets',
    // A cgroup connect hook does not know the source of an unbound socket (docs/ebpf.md).
    filtersSources: false,
  };
  readonly cgroupPath: string;
  readonly bpffsPath: string;
  readonly objectPath: string;
  private addonLoad: AddonLoad | undefined;
  private maps: Record<Family, PinnedMap> | undefined;
  private attachment: LoadReport | undefined;
  /** Map elements written since this driver was made, per family (for tests and logs). */
  readonly written: Record<Family, { upserted: number; deleted: number }> = {
    ipv4: { upserted: 0, deleted: 0 },
    ipv6: { upserted: 0, deleted: 0 },
  };

  constructor(options: EbpfDriverOptions) {
    this.cgroupPath = options.cgroupPath;
    this.bpffsPath = options.bpffsPath;
    this.objectPath = options.objectPath ?? defaultObjectPath();
  }

  /** What the last attach did (program, link and map ids), for logs. */
  get lastAttachment(): LoadReport | undefined {
    return this.attachment;
  }

  familyLabel(family: Family): string {
    return family;
  }

  /** The maps hold entries only: every state has the same shape. */
  shapeKey(): string {
    return '';
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

  async prepare(desired: DesiredState, full: boolean): Promise<void> {
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
    if (full || this.attachment === undefined) {
      // A full sync also repairs the attachment: detached links, removed pins, a new cgroup path.
      try {
        await this.attach(addon);
      } catch (err) {
        throw new BackendError(`ebpf attach failed: ${(err as Error).message}`, 'ebpf');
      }
    }
  }

  private async attach(addon: EbpfAddon): Promise<void> {
    this.attachment = await addon.loadAndAttach({
      objectPath: this.objectPath,
      bpffsPath: this.bpffsPath,
      cgroupPath: this.cgroupPath,
    });
    // The maps may be new (first run, pins removed): open them afresh by their pins.
    this.closeMaps();
    this.maps = this.openPins(addon);
  }

  private openPins(addon: EbpfAddon): Record<Family, PinnedMap> {
    const opened: Partial<Record<Family, PinnedMap>> = {};
    try {
      for (const family of FAMILIES) opened[family] = new addon.PinnedMap(this.mapPath(family));
    } catch (err) {
      for (const m of Object.values(opened)) m.close();
      throw err;
    }
    return opened as Record<Family, PinnedMap>;
  }

  /**
   * A family's map: the one attach() opened, or, in a driver that attached nothing (`check`
   * reading what the running controller pinned), the pinned one, opened without loading anything.
   */
  private map(family: Family): PinnedMap {
    if (!this.maps) {
      const load = this.addon();
      if (!load.ok || !existsSync(this.mapPath(family))) {
        throw new BackendError(`the eBPF maps are not pinned in ${this.bpffsPath}: nothing is attached`, 'ebpf');
      }
      this.maps = this.openPins(load.addon);
    }
    return this.maps[family];
  }

  /** Each operation in turn; a family written whole is compared with a dump of its map. */
  async apply(operations: readonly DriverOperation[]): Promise<Applied> {
    const before = this.writes();
    for (const op of operations) {
      switch (op.kind) {
        case 'writeFamily':
        case 'replaceFamily': {
          const map = this.map(op.family);
          const { upserts, deleteKeys } = dumpChanges(op.family, await map.dump(), op.state.entries);
          await this.write(op.family, upserts, deleteKeys);
          break;
        }
        case 'writeShape':
        case 'elements':
          await this.writeElements(op.family, op.remove, op.add);
          break;
        case 'repairShape':
          break;
        case 'removeAll':
          await this.removeAll();
          return {};
      }
    }
    return this.writes() === before ? { unchanged: true } : {};
  }

  /** Elements written in all, to tell whether an apply wrote any. */
  private writes(): number {
    return FAMILIES.reduce((n, f) => n + this.written[f].upserted + this.written[f].deleted, 0);
  }

  /**
   * Element changes: an entry removed and added under one key is an overwrite (or nothing when
   * only its Service changed: an element holds no name); elements read back are deleted by the
   * bytes they were read as.
   */
  private async writeElements(family: Family, remove: readonly KernelElement[], add: readonly Entry[]): Promise<void> {
    const exact = remove.filter((e) => Buffer.isBuffer(e.ref)).map((e) => e.ref as Buffer);
    const ours = remove.filter((e) => !Buffer.isBuffer(e.ref)) as Entry[];
    const { upserts, deletes } = elementWrites({ removed: ours, added: add });
    await this.write(family, upserts, Buffer.concat([encodeKeys(family, deletes), ...exact]));
  }

  /** Upserts, then deletes (packed keys). */
  private async write(family: Family, upserts: readonly Entry[], deleteKeys: Buffer): Promise<void> {
    const map = this.map(family);
    if (upserts.length > 0) {
      await map.update(encodeKeys(family, upserts), encodeValues(family, upserts));
      this.written[family].upserted += upserts.length;
    }
    if (deleteKeys.length > 0) {
      await map.delete(deleteKeys);
      this.written[family].deleted += deleteKeys.length / KEY_SIZE[family];
    }
  }

  /** The map dumped and compared, on the bytes, with `expected`. */
  /** The maps dumped in this process: between our writes only. */
  async readBack(
    family: Family,
    expected: readonly Entry[],
    _shape: FamilyShape,
    how: 'alongside-writes' | 'between-writes',
  ): Promise<ReadBack | 'not-alongside'> {
    if (how === 'alongside-writes') return 'not-alongside';
    const { upserts, deleteKeys, extra } = dumpChanges(family, await this.map(family).dump(), expected);
    const size = KEY_SIZE[family];
    return {
      missing: upserts,
      foreign: extra.map((element, i) => ({ ...element, ref: deleteKeys.subarray(i * size, (i + 1) * size) })),
      shapeDrift: [],
    };
  }

  /** Programs, links and pins removed. */
  private async removeAll(): Promise<void> {
    this.closeMaps();
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
    if (load.ok) await load.addon.removePinned(this.bpffsPath);
    else removePinsWithoutAddon(this.bpffsPath);
  }

  /**
   * The programs' counters (pinned map `translated`), summed over the CPUs: four lookups, on a
   * worker thread. Nothing while the map is not pinned: nothing attached yet, or pins of a
   * release without counters, until this one attaches (which makes the map).
   */
  async translatedConnections(): Promise<TranslatedConnections[]> {
    const path = join(this.bpffsPath, 'maps', COUNTER_MAP_NAME);
    if (!existsSync(path)) return [];
    const map = new (this.requireAddon().PinnedMap)(path);
    try {
      return translatedRows(await map.sumPerCpu());
    } finally {
      map.close();
    }
  }

  async close(): Promise<void> {
    this.closeMaps();
  }

  /** The maps are declared with their capacity, which --max-entries never exceeds (EBPF_CAPACITY). */
  roomFor(): number {
    return Number.POSITIVE_INFINITY;
  }

  /** BPF maps have no ruleset generation. */
  generation = async (): Promise<number | undefined> => undefined;

  /** No other writer can get ahead of a cgroup's socket hooks: nothing is ever bypassed. */
  watchBypasses(): void {}

  /** The maps' elements are written one syscall each, from buffers V8 owns: nothing to hand back. */
  async releaseMemory(): Promise<void> {}

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
