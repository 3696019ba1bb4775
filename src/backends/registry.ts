// Every backend by name (--backend=nft|iptables|ebpf): how its driver is built from the
// configuration, how it is described in metrics, what its objects on a node are and how they are
// removed, and what --dry-run prints for it. --backend=auto and the removal of leftovers, so that
// a node never carries two translations at once, go through this table: callers know no backend
// class. It hands out drivers (src/driver/driver.ts); the composition root (src/cli/) puts the
// reconciler over the one chosen.

import type { Logger } from 'pino';
import { access, constants } from 'node:fs/promises';
import { delimiter, join } from 'node:path';
import {
  BackendError,
  type BackendChoice,
  type BackendDescription,
  type BackendName,
  type Driver,
  type EntryCapacity,
  type ProbeResult,
} from '../driver/driver.js';
import { DEFAULT_BPFFS_PATH, EBPF_CAPACITY, EbpfDriver, defaultCgroupPath } from './ebpf/ebpf-driver.js';
import { selectNftExecutor, type NftExecutorPreference } from './nft/addon-executor.js';
import { NFT_CAPACITY, NftDriver } from './nft/nft-driver.js';
import { renderDesiredStateText, type KeyLookup } from './nft/render.js';
import { IPTABLES_CAPACITY, IptablesDriver } from './iptables/iptables-driver.js';
import { hasIptablesObjects, removeIptablesObjects } from './iptables/nat-view.js';
import { renderDesiredStateRestoreText } from './iptables/render.js';
import { IPTABLES_VARIANTS, detectIptablesVariant, type IptablesVariant } from './iptables/variant.js';
import { FAMILIES, type DesiredState } from '../model/types.js';

/** What building and cleaning up the backends takes from the configuration. */
export interface BackendSettings {
  /** How nft transactions are run (--nft-executor); 'auto' (default): the addon, else the CLI. */
  nftExecutor?: NftExecutorPreference;
  /** How nft rules look keys up (--nft-key-lookup); 'auto' (default): as this kernel allows. */
  nftKeyLookup?: 'auto' | KeyLookup;
  /** 'auto' (default): the variant kube-proxy uses, detected as its iptables-wrapper does. */
  iptablesVariant?: 'auto' | IptablesVariant;
  /** Whether the iptables rules carry their Service's name as a comment (--iptables-comments; default true). */
  iptablesComments?: boolean;
  /** The ebpf backend's cgroup v2 directory (--cgroup-path); default: the cgroup v2 root. */
  cgroupPath?: string;
  /** The ebpf backend's bpffs directory for pins (--bpffs-path). */
  bpffsPath?: string;
  /** Where the iptables backend logs rejected entries and jump repairs. */
  logger?: Logger;
}

export interface SelectedBackend {
  driver: Driver;
  /** What metrics show of it, known where its driver was built (no cast of the driver later). */
  description: BackendDescription;
  /** One line saying which backend and why, to log once. */
  reason: string;
  /** What its probe found on this kernel (selectBackend probes every backend it returns). */
  probe?: string;
}

/** A cleanup of objects one backend owns. */
export interface LeftoverCleanup {
  backend: BackendName;
  /** What it removes, for logs: "eBPF programs and maps". */
  description: string;
  /** Idempotent; succeeds when there is nothing to remove or the tools are missing. */
  cleanup(): Promise<void>;
}

export interface BackendEntry {
  /** Builds the backend; `reason` says which executor or variant and why ('' when nothing to say). */
  create(settings: BackendSettings): Promise<SelectedBackend>;
  /**
   * The cleanups of this backend's objects. `inUse` is the running backend when it is this one:
   * what it uses stays (all of it, or one iptables variant).
   */
  leftovers(settings: BackendSettings, inUse?: BackendDescription): LeftoverCleanup[];
  /**
   * What --dry-run prints: the rules this backend would program (nft: with the key lookup of
   * --nft-key-lookup, the map's when it is auto, as no kernel is asked).
   */
  renderDryRun(desired: DesiredState, settings?: BackendSettings): string;
  /** Entries per family it is given (the backends built by create() carry the same). */
  capacity: EntryCapacity;
}

export type BackendRegistry = Readonly<Record<BackendName, BackendEntry>>;

/** --backend=auto tries these in turn, kube-proxy's own order: nftables where it works, else iptables. */
const AUTO_ORDER: readonly BackendName[] = ['nft', 'iptables'];

/** What to run instead when a backend chosen with --backend cannot program this node. */
export const INSTEAD: Readonly<Record<BackendName, string>> = {
  nft: '--backend=iptables',
  iptables: '--backend=nft',
  ebpf: '--backend=nft or --backend=iptables',
};

function iptables(
  variant: IptablesVariant,
  options: { logger?: Logger | undefined; comments?: boolean | undefined },
  reason: string,
): SelectedBackend {
  return {
    driver: new IptablesDriver(variant, options),
    description: { backend: 'iptables', iptablesVariant: variant },
    reason,
  };
}

export const BACKENDS: BackendRegistry = {
  nft: {
    async create(settings) {
      const { executor, reason } = selectNftExecutor(settings.nftExecutor ?? 'auto');
      return {
        driver: new NftDriver(executor, { lookup: settings.nftKeyLookup ?? 'auto' }),
        description: { backend: 'nft', nftExecutor: executor.kind },
        reason,
      };
    },
    leftovers: (settings, inUse) => (inUse ? [] : [nftLeftovers(settings)]),
    renderDryRun: (desired, settings) =>
      renderDesiredStateText(desired, settings?.nftKeyLookup === 'set' ? 'set' : 'map'),
    capacity: NFT_CAPACITY,
  },
  iptables: {
    async create(settings) {
      const wanted = settings.iptablesVariant ?? 'auto';
      const options = { logger: settings.logger, comments: settings.iptablesComments };
      if (wanted !== 'auto') return iptables(wanted, options, `iptables-${wanted}, as configured`);
      const detected = await detectIptablesVariant();
      return iptables(detected.variant, options, detected.reason);
    },
    // Only the variant in use stays: the other one's chains are an earlier run's.
    leftovers: (_settings, inUse) =>
      IPTABLES_VARIANTS.filter((v) => !inUse || (inUse.iptablesVariant ?? v) !== v).map(iptablesLeftovers),
    renderDryRun: (desired, settings) =>
      renderDesiredStateRestoreText(desired, { useKubeMarkMasq: true, comments: settings?.iptablesComments ?? true }),
    capacity: IPTABLES_CAPACITY,
  },
  ebpf: {
    async create(settings) {
      const cgroupPath = settings.cgroupPath ?? defaultCgroupPath();
      if (!cgroupPath) {
        throw new BackendError('no cgroup v2 mount in /proc/mounts: mount cgroup2 or pass --cgroup-path', 'ebpf');
      }
      return {
        driver: new EbpfDriver({ cgroupPath, bpffsPath: bpffsPath(settings) }),
        description: { backend: 'ebpf' },
        reason: '',
      };
    },
    leftovers: (settings, inUse) => (inUse ? [] : [ebpfLeftovers(settings)]),
    // The eBPF maps hold the same entries as the nft sets: their text shows them.
    renderDryRun: (desired) => renderDesiredStateText(desired),
    capacity: EBPF_CAPACITY,
  },
};

/** Builds the driver for --backend and probes it; for 'auto', the first of AUTO_ORDER whose probe passes. */
export async function selectBackend(
  choice: BackendChoice,
  settings: BackendSettings = {},
  backends: BackendRegistry = BACKENDS,
): Promise<SelectedBackend> {
  if (choice !== 'auto') {
    const created = await backends[choice].create(settings);
    const { driver, reason } = created;
    const probe = await driver.probe();
    if (!probe.ok) {
      await driver.close();
      throw new BackendError(`${probe.detail} (on this kernel, try ${INSTEAD[choice]})`, choice);
    }
    return {
      ...probed(created, probe),
      reason: `${choice} backend, as configured${reason ? `: ${reason}` : ''}`,
    };
  }
  const failed: string[] = [];
  for (const name of AUTO_ORDER) {
    const created = await backends[name].create(settings);
    const { driver, reason } = created;
    const probe = await driver.probe();
    if (probe.ok) {
      return {
        ...probed(created, probe),
        reason:
          failed.length === 0
            ? `--backend=auto chose ${name}: ${reason}`
            : `--backend=auto chose ${name} (${reason}) because ${failed.join('; ')}`,
      };
    }
    await driver.close();
    failed.push(probe.detail);
  }
  throw new BackendError(`no backend can program this node: ${failed.join('; ')}`, AUTO_ORDER.at(-1)!);
}

/** A backend whose probe passed: what the probe found goes into its description. */
function probed(created: SelectedBackend, probe: ProbeResult): SelectedBackend {
  const description = { ...created.description };
  if (probe.nftKeyLookup) description.nftKeyLookup = probe.nftKeyLookup;
  return { ...created, description, probe: probe.detail };
}

/** What --dry-run prints for --backend; 'auto' shows the nft text, as the eBPF backend does. */
export function renderDryRun(
  choice: BackendChoice,
  desired: DesiredState,
  settings: BackendSettings = {},
  backends: BackendRegistry = BACKENDS,
) {
  return backends[dryRunBackend(choice)].renderDryRun(desired, settings);
}

/** --dry-run shows what nft would program when the choice is left to the node. */
function dryRunBackend(choice: BackendChoice): BackendName {
  return choice === 'auto' ? 'nft' : choice;
}

/** The entries per family --dry-run assumes: those of the backend it renders for. */
export function dryRunCapacity(choice: BackendChoice, backends: BackendRegistry = BACKENDS): EntryCapacity {
  return backends[dryRunBackend(choice)].capacity;
}

/**
 * At start, removes what the backends not in use left behind: nft tables, our iptables chains
 * and jumps in both variants (only the other variant when iptables is active), the eBPF
 * programs and maps. Returns what was checked, for logs.
 */
export async function removeLeftovers(
  active: BackendDescription,
  settings: BackendSettings = {},
  backends: BackendRegistry = BACKENDS,
): Promise<string[]> {
  return runCleanups(
    entries(backends).flatMap(([name, entry]) =>
      entry.leftovers(settings, name === active.backend ? active : undefined),
    ),
  );
}

/** --cleanup: removes every object of ours from every backend and both iptables variants. Idempotent. */
export async function cleanupAll(
  settings: BackendSettings = {},
  backends: BackendRegistry = BACKENDS,
): Promise<string[]> {
  return runCleanups(entries(backends).flatMap(([, entry]) => entry.leftovers(settings)));
}

function entries(backends: BackendRegistry): Array<[BackendName, BackendEntry]> {
  return Object.entries(backends) as Array<[BackendName, BackendEntry]>;
}

function bpffsPath(settings: BackendSettings): string {
  return settings.bpffsPath ?? DEFAULT_BPFFS_PATH;
}

async function onPath(command: string): Promise<boolean> {
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (dir === '') continue;
    try {
      await access(join(dir, command), constants.X_OK);
      return true;
    } catch {
      // not in this directory
    }
  }
  return false;
}

/** The nft backend's cleanup, or nothing to do when neither the addon nor the nft command is there. */
function nftLeftovers(settings: BackendSettings): LeftoverCleanup {
  return {
    backend: 'nft',
    description: 'nft tables ip/ip6 ipvs-node-controller',
    async cleanup() {
      const { driver, description } = await BACKENDS.nft.create({ ...settings, nftExecutor: 'auto' });
      if (description.nftExecutor === 'cli' && !(await onPath('nft'))) return;
      if (await driver.hasState()) await driver.apply([{ kind: 'removeAll' }]);
    },
  };
}

function iptablesLeftovers(variant: IptablesVariant): LeftoverCleanup {
  return {
    backend: 'iptables',
    description: `iptables-${variant} chains IPVS_PREROUTING, IPVS_OUTPUT and their jump rules`,
    async cleanup() {
      if (!(await hasIptablesObjects(variant))) return;
      for (const family of FAMILIES) await removeIptablesObjects(variant, family);
    },
  };
}

/** The eBPF backend's cleanup: its pins under bpffs, and its programs' attachments. */
function ebpfLeftovers(settings: BackendSettings): LeftoverCleanup {
  return {
    backend: 'ebpf',
    description: `eBPF programs and maps pinned under ${bpffsPath(settings)}`,
    async cleanup() {
      const driver = new EbpfDriver({
        cgroupPath: settings.cgroupPath ?? defaultCgroupPath() ?? '/sys/fs/cgroup',
        bpffsPath: bpffsPath(settings),
      });
      await driver.apply([{ kind: 'removeAll' }]);
    },
  };
}

async function runCleanups(cleanups: LeftoverCleanup[]): Promise<string[]> {
  const done: string[] = [];
  const failures: Array<{ backend: BackendName; line: string }> = [];
  for (const c of cleanups) {
    try {
      await c.cleanup();
      done.push(c.description);
    } catch (err) {
      failures.push({ backend: c.backend, line: `${c.description}: ${(err as Error).message}` });
    }
  }
  if (failures.length > 0) {
    throw new BackendError(`could not remove ${failures.map((f) => f.line).join('; ')}`, failures[0]!.backend);
  }
  return done;
}
