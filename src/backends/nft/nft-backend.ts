// The nftables backend: tables `ip ipvs-node-controller` and `ip6 ipvs-node-controller`.
// A full sync replaces a family's table in one transaction; between full syncs only the map
// elements that changed are written (one transaction per family). If a partial transaction
// fails (the table was removed by someone else, say) the family falls back to a full sync.

import { FAMILIES, entryKey, type DesiredState, type Entry, type Family, type FamilyState } from '../../model/types.js';
import { BackendError, type Backend, type ProbeResult, type SyncOptions, type SyncResult } from '../backend.js';
import type { NftExecutor } from './executor.js';
import {
  NFT_FAMILY,
  TABLE_NAME,
  nftDocument,
  renderDeleteTablesJson,
  renderFullSyncJson,
  renderMapChangesJson,
} from './render.js';

interface Programmed {
  entries: Map<string, Entry>;
  /** Everything but the map elements, compared to decide whether a partial sync is possible. */
  shape: string;
}

function shapeOf(state: FamilyState, mark: number): string {
  return JSON.stringify([state.localPodMatch, mark]);
}

export class NftBackend implements Backend {
  readonly name = 'nft' as const;
  /** What this process last programmed, per family; absent until a full sync succeeded. */
  private readonly programmed = new Map<Family, Programmed>();

  constructor(readonly executor: NftExecutor) {}

  async probe(): Promise<ProbeResult> {
    // A check-mode transaction of the real table shape: proves the nft userspace, the nat hooks,
    // fib and concatenated maps in this kernel, and the permission to program them.
    const empty: FamilyState = { entries: [], localPodMatch: { kind: 'cidrs', cidrs: [] } };
    try {
      for (const family of FAMILIES) {
        const cmds = renderFullSyncJson(family, empty, 0x4000).slice(2); // no delete in check mode
        await this.executor.check(nftDocument(cmds));
      }
      return { ok: true, detail: `nftables via ${this.executor.kind}` };
    } catch (err) {
      return { ok: false, detail: `nftables cannot be programmed: ${(err as Error).message}` };
    }
  }

  async sync(desired: DesiredState, options: SyncOptions): Promise<SyncResult> {
    const modes: Array<SyncResult['mode']> = [];
    const failures: string[] = [];
    for (const family of FAMILIES) {
      try {
        modes.push(await this.syncFamily(family, desired[family], desired.masqueradeMark, options.full));
      } catch (err) {
        this.programmed.delete(family);
        failures.push(`${NFT_FAMILY[family]}: ${(err as Error).message}`);
      }
    }
    if (failures.length > 0) throw new BackendError(`nft sync failed: ${failures.join('; ')}`, 'nft');
    return {
      mode: modes.includes('full') ? 'full' : modes.includes('partial') ? 'partial' : 'noop',
      entries: { ipv4: desired.ipv4.entries.length, ipv6: desired.ipv6.entries.length },
    };
  }

  private async syncFamily(
    family: Family,
    state: FamilyState,
    mark: number,
    full: boolean,
  ): Promise<SyncResult['mode']> {
    const shape = shapeOf(state, mark);
    const before = this.programmed.get(family);
    if (!full && before && before.shape === shape) {
      const { removed, added } = diffEntries(before.entries, state.entries);
      if (removed.length === 0 && added.length === 0) return 'noop';
      try {
        await this.executor.run(nftDocument(renderMapChangesJson(family, removed, added)));
        for (const e of removed) before.entries.delete(entryKey(e));
        for (const e of added) before.entries.set(entryKey(e), e);
        return 'partial';
      } catch {
        // The kernel no longer holds what we programmed: rebuild the table.
      }
    }
    await this.executor.run(nftDocument(renderFullSyncJson(family, state, mark)));
    this.programmed.set(family, { entries: new Map(state.entries.map((e) => [entryKey(e), e])), shape });
    return 'full';
  }

  async cleanup(): Promise<void> {
    this.programmed.clear();
    try {
      await this.executor.run(nftDocument(renderDeleteTablesJson(FAMILIES)));
    } catch (err) {
      throw new BackendError(`nft cleanup failed: ${(err as Error).message}`, 'nft');
    }
  }

  /** Whether any of our tables exists in the kernel (used to find leftovers of another backend choice). */
  async hasState(): Promise<boolean> {
    for (const family of FAMILIES) {
      if ((await this.executor.listTable(NFT_FAMILY[family], TABLE_NAME)) !== undefined) return true;
    }
    return false;
  }
}

/** Entries to delete and to add so that `current` becomes `next`; a changed value is both. */
export function diffEntries(current: Map<string, Entry>, next: Entry[]): { removed: Entry[]; added: Entry[] } {
  const removed: Entry[] = [];
  const added: Entry[] = [];
  const nextKeys = new Set<string>();
  for (const e of next) {
    const key = entryKey(e);
    nextKeys.add(key);
    const old = current.get(key);
    if (!old) added.push(e);
    else if (old.clusterIp !== e.clusterIp || old.service !== e.service) {
      removed.push(old);
      added.push(e);
    }
  }
  for (const [key, e] of current) if (!nextKeys.has(key)) removed.push(e);
  return { removed, added };
}
