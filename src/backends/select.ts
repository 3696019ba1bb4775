// Which backend programs this node (--backend=auto|nft|iptables|ebpf), and removal of what the
// backends not in use left behind, so that a node never carries two translations at once.
// The eBPF backend is passed in by the caller (a factory and its cleanup), keeping this module
// independent of it.

import { access, constants } from 'node:fs/promises';
import type { Logger } from 'pino';
import { delimiter, join } from 'node:path';
import { BackendError, type Backend, type BackendName } from './backend.js';
import { selectNftExecutor, type NftExecutorPreference } from './nft/addon-executor.js';
import { NftBackend } from './nft/nft-backend.js';
import { IptablesBackend, hasIptablesObjects, removeIptablesObjects } from './iptables/iptables-backend.js';
import { IPTABLES_VARIANTS, detectIptablesVariant, type IptablesVariant } from './iptables/variant.js';
import { FAMILIES } from '../model/types.js';

export type BackendChoice = 'auto' | BackendName;

/** A cleanup of objects another backend owns (the eBPF backend's programs and maps, say). */
export interface LeftoverCleanup {
  backend: BackendName;
  /** What it removes, for logs: "eBPF programs and maps". */
  description: string;
  /** Idempotent; succeeds when there is nothing to remove or the tools are missing. */
  cleanup(): Promise<void>;
}

export interface SelectBackendDeps {
  /** Builds the eBPF backend; without it `--backend=ebpf` is refused. */
  ebpf?: () => Backend | Promise<Backend>;
  /** 'auto' (default): the variant kube-proxy uses, detected as its iptables-wrapper does. */
  iptablesVariant?: 'auto' | IptablesVariant;
  /** How nft transactions are run (--nft-executor); 'auto' (default): the addon, else the CLI. */
  nftExecutor?: NftExecutorPreference;
  /** The iptables backend logs rejected entries and jump repairs here. */
  logger?: Logger;
}

export interface SelectedBackend {
  backend: Backend;
  /** One line saying which backend and why, to log once. */
  reason: string;
}

async function iptablesBackend(deps: SelectBackendDeps): Promise<{ backend: IptablesBackend; reason: string }> {
  const wanted = deps.iptablesVariant ?? 'auto';
  const options = { logger: deps.logger };
  if (wanted !== 'auto') {
    return { backend: new IptablesBackend(wanted, options), reason: `iptables-${wanted}, as configured` };
  }
  const detected = await detectIptablesVariant();
  return { backend: new IptablesBackend(detected.variant, options), reason: detected.reason };
}

function nftBackend(preference: NftExecutorPreference = 'auto'): { backend: NftBackend; reason: string } {
  const { executor, reason } = selectNftExecutor(preference);
  return { backend: new NftBackend(executor), reason };
}

export async function selectBackend(choice: BackendChoice, deps: SelectBackendDeps = {}): Promise<SelectedBackend> {
  switch (choice) {
    case 'nft': {
      const nft = nftBackend(deps.nftExecutor);
      return { backend: nft.backend, reason: `nft backend, as configured: ${nft.reason}` };
    }
    case 'iptables': {
      const ipt = await iptablesBackend(deps);
      return { backend: ipt.backend, reason: `iptables backend, as configured: ${ipt.reason}` };
    }
    case 'ebpf': {
      if (!deps.ebpf) {
        throw new BackendError(
          'the ebpf backend is not part of this build: use --backend=nft or --backend=iptables',
          'ebpf',
        );
      }
      return { backend: await deps.ebpf(), reason: 'ebpf backend, as configured' };
    }
    case 'auto': {
      // kube-proxy's own order: nftables where it works, else the iptables variant in use.
      const nft = nftBackend(deps.nftExecutor);
      const nftProbe = await nft.backend.probe();
      if (nftProbe.ok) return { backend: nft.backend, reason: `--backend=auto chose nft: ${nft.reason}` };
      await (nft.backend as Backend).close?.();
      const ipt = await iptablesBackend(deps);
      const iptProbe = await ipt.backend.probe();
      if (iptProbe.ok) {
        return {
          backend: ipt.backend,
          reason: `--backend=auto chose iptables (${ipt.reason}) because ${nftProbe.detail}`,
        };
      }
      throw new BackendError(`no backend can program this node: ${nftProbe.detail}; ${iptProbe.detail}`, 'iptables');
    }
  }
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
function nftLeftovers(): LeftoverCleanup {
  return {
    backend: 'nft',
    description: 'nft tables ip/ip6 ipvs-node-controller',
    async cleanup() {
      const { backend } = nftBackend();
      if (backend.executor.kind === 'cli' && !(await onPath('nft'))) return;
      if (await backend.hasState()) await backend.cleanup();
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

export interface LeftoverOptions {
  /** The variant the active iptables backend uses: the other variant's objects are leftovers. */
  iptablesVariant?: IptablesVariant;
  /** Cleanups of backends this module does not know (the eBPF backend's). */
  extraCleanups?: LeftoverCleanup[];
}

/**
 * At start, removes what the backends not in use left behind: nft tables, our iptables chains
 * and jumps in both variants (only the other variant when iptables is active), and the extra
 * cleanups of other backends. Returns what was checked, for logs.
 */
export async function removeLeftovers(active: BackendName, options: LeftoverOptions = {}): Promise<string[]> {
  const cleanups: LeftoverCleanup[] = [];
  if (active !== 'nft') cleanups.push(nftLeftovers());
  for (const variant of IPTABLES_VARIANTS) {
    const inUse = active === 'iptables' && (options.iptablesVariant ?? variant) === variant;
    if (inUse) continue;
    cleanups.push(iptablesLeftovers(variant));
  }
  cleanups.push(...(options.extraCleanups ?? []).filter((c) => c.backend !== active));
  return runCleanups(cleanups);
}

/** --cleanup: removes every object of ours from every backend and both iptables variants. Idempotent. */
export async function cleanupAll(extraCleanups: LeftoverCleanup[] = []): Promise<string[]> {
  return runCleanups([nftLeftovers(), ...IPTABLES_VARIANTS.map(iptablesLeftovers), ...extraCleanups]);
}
