// The nftables backend: tables `ip ipvs-node-controller` and `ip6 ipvs-node-controller`.
// A full sync replaces the tables in one JSON transaction; between full syncs only the map
// elements that changed are written (one JSON transaction per family). If a partial transaction fails (the table was removed by someone
// else, say) the family falls back to a full sync.

import { FAMILIES, entryKey, type DesiredState, type Entry, type Family, type FamilyState } from '../../model/types.js';
import { BackendError, type Backend, type ProbeResult, type SyncOptions, type SyncResult } from '../backend.js';
import { orderedChanges } from '../../model/ordered-changes.js';
import type { NftExecutor } from './executor.js';
import {
  NFT_FAMILY,
  TABLE_NAME,
  nftDocument,
  renderDeleteTablesJson,
  renderFullSyncJson,
  mapElementJson,
  renderMapChangesJson,
} from './render.js';

interface Programmed {
  /** The map elements in the kernel, in the order of the desired state they came from. */
  entries: Entry[];
  /** The same entries as a set of objects. */
  objects: Set<Entry>;
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
  /**
   * Element JSON by entry: the model hands unchanged entries back as the same objects, so a
   * periodic full sync writes tens of thousands of elements without building them again.
   */
  private readonly elementJsons = new WeakMap<Entry, unknown>();
  private readonly elementJson = (e: Entry): unknown => {
    let json = this.elementJsons.get(e);
    if (json === undefined) {
      json = mapElementJson(e);
      this.elementJsons.set(e, json);
    }
    return json;
  };

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
    const mark = desired.masqueradeMark;
    const needFull: Family[] = [];
    for (const family of FAMILIES) {
      const mode = options.full ? undefined : await this.syncChangedElements(family, desired[family], mark);
      if (mode) modes.push(mode);
      else needFull.push(family);
    }
    if (needFull.length > 0) {
      // Every family that needs it in one transaction: libnftables reads the whole ruleset,
      // elements included, before each transaction it runs (tens of ms with tens of thousands
      // of elements). If that fails, one transaction per family, so that one family's problem
      // neither blocks the other nor goes unreported.
      const together =
        needFull.length > 1 &&
        (await this.fullSync(needFull, desired).then(
          () => true,
          () => false,
        ));
      for (const family of needFull) {
        try {
          if (!together) await this.fullSync([family], desired);
          modes.push('full');
        } catch (err) {
          failures.push(`${NFT_FAMILY[family]}: ${(err as Error).message}`);
        }
      }
    }
    if (failures.length > 0) throw new BackendError(`nft sync failed: ${failures.join('; ')}`, 'nft');
    return {
      mode: modes.includes('full') ? 'full' : modes.includes('partial') ? 'partial' : 'noop',
      entries: { ipv4: desired.ipv4.entries.length, ipv6: desired.ipv6.entries.length },
    };
  }

  /**
   * A partial sync of one family: only the map elements that changed. Undefined when the family
   * needs a full sync (nothing programmed yet, another table shape, or the kernel refused the
   * changes because it no longer holds what we programmed).
   */
  private async syncChangedElements(
    family: Family,
    state: FamilyState,
    mark: number,
  ): Promise<'partial' | 'noop' | undefined> {
    const before = this.programmed.get(family);
    if (!before || before.shape !== shapeOf(state, mark)) return undefined;
    // The model says what changed since the entries it gave before; if those are the ones in the
    // kernel, nothing needs comparing.
    const hint = state.changes;
    const changes =
      hint && hint.since === before.entries
        ? pairReplacements(hint.removed, hint.added)
        : diffProgrammed(before, state.entries);
    if (changes.removed.length > 0 || changes.added.length > 0) {
      try {
        await this.executor.run(nftDocument(renderMapChangesJson(family, changes.removed, changes.added)));
      } catch {
        return undefined;
      }
    }
    // A model never changes an entries array it gave: kept as it is, comparable with `since`.
    before.entries = hint ? state.entries : state.entries.slice();
    if (changes.renewed) before.objects = new Set(state.entries);
    else {
      for (const e of changes.removed) before.objects.delete(e);
      for (const [old, current] of changes.replaced) {
        before.objects.delete(old);
        before.objects.add(current);
      }
      for (const e of changes.added) before.objects.add(e);
    }
    return changes.removed.length > 0 || changes.added.length > 0 ? 'partial' : 'noop';
  }

  /** Replaces the tables of `families` in one transaction. */
  private async fullSync(families: Family[], desired: DesiredState): Promise<void> {
    for (const family of families) this.programmed.delete(family);
    const mark = desired.masqueradeMark;
    await this.executor.run(
      nftDocument(families.flatMap((f) => renderFullSyncJson(f, desired[f], mark, this.elementJson))),
    );
    for (const family of families) {
      const state = desired[family];
      this.programmed.set(family, {
        entries: state.changes ? state.entries : state.entries.slice(),
        objects: new Set(state.entries),
        shape: shapeOf(state, mark),
      });
    }
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

interface ProgrammedChanges {
  removed: Entry[];
  added: Entry[];
  /** Programmed entries whose equal replacement is a new object: nothing to write to the kernel. */
  replaced: Array<[Entry, Entry]>;
  /** True when the changes were found by key, the object set must be rebuilt. */
  renewed: boolean;
}

/**
 * What to write so that the kernel map holds `next`. The model keeps an unchanged entry as the
 * same object, in sorted order: walking the programmed entries and `next` side by side finds
 * the changes at the cost of the changes, not of the table. Entries from a caller that does not
 * keep them so are compared by key.
 */
export function diffProgrammed(programmed: Pick<Programmed, 'entries' | 'objects'>, next: Entry[]): ProgrammedChanges {
  const walked =
    programmed.objects.size === programmed.entries.length
      ? orderedChanges(programmed.entries, next, (e) => programmed.objects.has(e))
      : undefined;
  if (!walked || new Set(walked.fresh).size !== walked.fresh.length) {
    const byKey = new Map([...programmed.objects].map((p) => [entryKey(p), p]));
    return { ...diffEntries(byKey, next), replaced: [], renewed: true };
  }
  return pairReplacements(walked.gone, walked.fresh);
}

/**
 * Entries gone and new as objects, as element changes: a new object equal to the one it
 * replaces (same key and value) is no change for the kernel.
 */
export function pairReplacements(gone: Entry[], fresh: Entry[]): ProgrammedChanges {
  const freshByKey = new Map(fresh.map((e) => [entryKey(e), e]));
  const removed: Entry[] = [];
  const replaced: Array<[Entry, Entry]> = [];
  for (const old of gone) {
    const key = entryKey(old);
    const current = freshByKey.get(key);
    if (current && current.clusterIp === old.clusterIp && current.service === old.service) {
      replaced.push([old, current]);
      freshByKey.delete(key);
    } else {
      removed.push(old);
    }
  }
  return { removed, added: [...freshByKey.values()], replaced, renewed: false };
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
