// The iptables backend: chains IPVS_PREROUTING and IPVS_OUTPUT in the nat table of one iptables
// variant (legacy or nft), for IPv4 (iptables) and IPv6 (ip6tables). A sync rewrites our two
// chains and repairs the jump rules in one `-restore --noflush` transaction per family; the
// xtables lock (-w) keeps kube-proxy's own restores and ours from interleaving. With
// iptables-legacy the whole nat table is read anyway, so a table that already holds exactly our
// rules is left as it is (no rewrite, counters kept); iptables-nft is not read that far (listing
// a large chain costs as much as writing it) and is rewritten on every full sync.
// Between syncs a jump guard (jump-guard.ts) keeps our jumps at rule 1 when another writer
// prepends its own.

import type { Logger } from 'pino';
import { FAMILIES, type DesiredState, type Entry, type Family, type FamilyState } from '../../model/types.js';
import {
  BackendError,
  type Backend,
  type EntryCapacity,
  type ProbeResult,
  type SyncOptions,
  type SyncResult,
} from '../backend.js';
import {
  IptablesCommands,
  IptablesToolMissing,
  systemIptablesRunner,
  type IptablesRunner,
  type IptablesVariant,
} from './apply.js';
import { JUMPS, KUBE_MARK_MASQ, emptyNatTable, hasOurObjects, parseNatSave, type NatTableView } from './parse.js';
import { renderCleanupRestore, renderFamilyRestore, type Rejection } from './render.js';
import { JumpGuard } from './jump-guard.js';

/** A restore can lose a race with another writer between our read and our write: read again. */
const ATTEMPTS = 3;

export interface IptablesSyncResult extends SyncResult {
  /** Entries and matches left out because a value failed validation; the rest was programmed. */
  rejected: Rejection[];
}

async function withRetries<T>(work: () => Promise<T>): Promise<T> {
  let lastError: unknown;
  for (let attempt = 0; attempt < ATTEMPTS; attempt++) {
    try {
      return await work();
    } catch (err) {
      if (err instanceof IptablesToolMissing) throw err;
      lastError = err;
    }
  }
  throw lastError;
}

/**
 * The nat table of a variant and family, or undefined when it cannot hold anything of ours:
 * the tools are missing, or (legacy) the table was never created — looking would create it.
 */
export async function readNatTable(commands: IptablesCommands): Promise<NatTableView | undefined> {
  if (commands.variant === 'legacy') {
    const tables = await commands.runner.legacyTables(commands.family);
    if (!tables?.has('nat')) return undefined;
  }
  try {
    return parseNatSave(await commands.save('nat'));
  } catch (err) {
    if (err instanceof IptablesToolMissing) return undefined;
    throw err;
  }
}

/**
 * What a sync needs to know of the nat table: the rules of PREROUTING and OUTPUT and whether
 * KUBE-MARK-MASQ exists. iptables-nft lists single chains cheaply (a whole -save of a large
 * table takes about as long as writing it); iptables-legacy reads the whole table blob for any
 * listing, so one -save is cheapest there.
 */
export async function readJumpView(commands: IptablesCommands): Promise<NatTableView> {
  if (commands.variant === 'legacy') return parseNatSave(await commands.save('nat'));
  const view = emptyNatTable();
  for (const chain of [...JUMPS.map((j) => j.from), KUBE_MARK_MASQ]) {
    const lines = await commands.listRules('nat', chain);
    if (lines === undefined) continue;
    view.chains.add(chain);
    view.rules.set(
      chain,
      lines.map((l) => l.slice(`-A ${chain} `.length)),
    );
  }
  return view;
}

/** Removes our chains and jumps from one variant and family. Idempotent; nothing to do without the tools. */
export async function removeIptablesObjects(
  variant: IptablesVariant,
  family: Family,
  runner: IptablesRunner = systemIptablesRunner,
): Promise<void> {
  const commands = new IptablesCommands(variant, family, runner);
  await withRetries(async () => {
    const current = await readNatTable(commands);
    const input = current && renderCleanupRestore(current);
    if (input) await commands.restore(input);
  });
}

/** Whether a variant holds any chain or jump of ours, in either family. */
export async function hasIptablesObjects(variant: IptablesVariant): Promise<boolean> {
  for (const family of FAMILIES) {
    const current = await readNatTable(new IptablesCommands(variant, family));
    if (current && hasOurObjects(current)) return true;
  }
  return false;
}

export interface ProgrammedFamily {
  /** The entries array given (the model never changes an array it gave): equal means unchanged. */
  entries: Entry[];
  /** Everything else of the family's state that the rules depend on, serialised. */
  rest: string;
  /** The whole of it, compared when the array is another one. */
  signature: string;
  programmed: number;
  rejected: Rejection[];
}

/**
 * What the rules of a family depend on: the entries, the local pod match and the mark. Not
 * `changes`, which says how the entries came about and differs after every change even when a
 * later state holds the same entries.
 */
export function familySignature(state: FamilyState, masqueradeMark: number): { rest: string; signature: string } {
  const rest = JSON.stringify([state.localPodMatch, masqueradeMark]);
  return { rest, signature: JSON.stringify(state.entries) + rest };
}

/** Whether a family's state programs exactly what `before` did. */
export function sameAsProgrammed(
  before: ProgrammedFamily | undefined,
  state: FamilyState,
  masqueradeMark: number,
): boolean {
  if (!before) return false;
  if (JSON.stringify([state.localPodMatch, masqueradeMark]) !== before.rest) return false;
  // The same array is the same entries; serialising 10,000 of them is left to the rare other case.
  return before.entries === state.entries || before.signature === familySignature(state, masqueradeMark).signature;
}

export interface IptablesBackendOptions {
  /** Rejections (once per change) and jump repairs are logged here. */
  logger?: Logger;
  /** How often rule 1 of nat PREROUTING/OUTPUT is checked between syncs; 0: never. Default 1 s. */
  jumpCheckIntervalMs?: number;
  /** Runs the iptables commands; the real ones by default. */
  runner?: IptablesRunner;
}

/** Two rules per entry, walked one by one by every new connection that leaves the node. */
export const IPTABLES_CAPACITY: EntryCapacity = {
  defaultEntries: 20_000,
  why: 'every new connection walks two rules per entry',
};

export class IptablesBackend implements Backend {
  readonly name = 'iptables' as const;
  readonly capacity = IPTABLES_CAPACITY;
  /** What was last programmed per family; a partial sync of the same desired state does nothing. */
  private readonly programmed = new Map<Family, ProgrammedFamily>();
  /** Syncs, cleanups and jump repairs write the same rules: one at a time. */
  private queue: Promise<unknown> = Promise.resolve();
  private readonly jumpGuard: JumpGuard | undefined;
  private reportedRejections = '';

  constructor(
    readonly variant: IptablesVariant,
    private readonly options: IptablesBackendOptions = {},
  ) {
    const interval = options.jumpCheckIntervalMs ?? 1000;
    if (interval > 0) {
      this.jumpGuard = new JumpGuard({
        variant,
        intervalMs: interval,
        logger: options.logger,
        exclusive: (work) => this.exclusive(work),
        families: () => this.programmed.keys(),
        runner: options.runner,
      });
    }
  }

  /** Jump repairs made between syncs since the start. */
  get jumpRepairs(): number {
    return this.jumpGuard?.repairs ?? 0;
  }

  private exclusive<T>(work: () => Promise<T>): Promise<T> {
    const run = this.queue.then(work, work);
    this.queue = run.catch(() => undefined);
    return run;
  }

  private commands(family: Family): IptablesCommands {
    return new IptablesCommands(this.variant, family, this.options.runner);
  }

  async probe(): Promise<ProbeResult> {
    // A test restore (parsed and built, not committed) of rules of our shape proves the tools,
    // the nat table and the extensions used (comment, addrtype, tcp, MARK, DNAT).
    const sample: FamilyState = {
      entries: [],
      localPodMatch: { kind: 'interfacePrefix', prefix: 'veth' },
    };
    try {
      for (const family of FAMILIES) {
        const entry = {
          family,
          externalIp: family === 'ipv4' ? '192.0.2.1' : '2001:db8::1',
          protocol: 'TCP' as const,
          port: 80,
          clusterIp: family === 'ipv4' ? '192.0.2.2' : '2001:db8::2',
          service: 'probe/probe',
        };
        const rendered = renderFamilyRestore(family, { ...sample, entries: [entry] }, 0x4000, emptyNatTable());
        await this.commands(family).restore(rendered.text, { test: true });
      }
      return { ok: true, detail: `iptables via iptables-${this.variant}` };
    } catch (err) {
      return { ok: false, detail: `iptables-${this.variant} cannot be programmed: ${(err as Error).message}` };
    }
  }

  async sync(desired: DesiredState, options: SyncOptions): Promise<IptablesSyncResult> {
    const result = await this.exclusive(() => this.syncFamilies(desired, options));
    this.reportRejections(result.rejected);
    this.jumpGuard?.start();
    return result;
  }

  private async syncFamilies(desired: DesiredState, options: SyncOptions): Promise<IptablesSyncResult> {
    const failures: string[] = [];
    const rejected: Rejection[] = [];
    const entries = { ipv4: 0, ipv6: 0 };
    let applied = false;
    for (const family of FAMILIES) {
      const state = desired[family];
      try {
        const before = this.programmed.get(family);
        if (!options.full && before && sameAsProgrammed(before, state, desired.masqueradeMark)) {
          entries[family] = before.programmed;
          rejected.push(...before.rejected);
          continue;
        }
        const commands = this.commands(family);
        const result = await withRetries(async () => {
          const current = await readJumpView(commands);
          const rendered = renderFamilyRestore(family, state, desired.masqueradeMark, current);
          if (!rendered.upToDate) await commands.restore(rendered.text);
          return rendered;
        });
        if (!result.upToDate) applied = true;
        rejected.push(...result.rejected);
        entries[family] = result.programmed;
        this.programmed.set(family, {
          entries: state.entries,
          ...familySignature(state, desired.masqueradeMark),
          programmed: result.programmed,
          rejected: result.rejected,
        });
      } catch (err) {
        this.programmed.delete(family);
        failures.push(`${family}: ${(err as Error).message}`);
      }
    }
    if (failures.length > 0) {
      throw new BackendError(`iptables-${this.variant} sync failed: ${failures.join('; ')}`, 'iptables');
    }
    return { mode: applied ? 'full' : 'noop', entries, rejected };
  }

  /** Each rejection is logged once, when the set of them changes. */
  private reportRejections(rejected: Rejection[]): void {
    const key = JSON.stringify(rejected);
    if (key === this.reportedRejections) return;
    this.reportedRejections = key;
    for (const r of rejected) {
      this.options.logger?.warn({ family: r.family, item: r.item, reason: r.reason }, 'Left out of the iptables rules');
    }
  }

  async cleanup(): Promise<void> {
    await this.jumpGuard?.stop();
    await this.exclusive(async () => {
      this.programmed.clear();
      try {
        for (const family of FAMILIES) await removeIptablesObjects(this.variant, family, this.options.runner);
      } catch (err) {
        throw new BackendError(`iptables-${this.variant} cleanup failed: ${(err as Error).message}`, 'iptables');
      }
    });
  }

  /** Stops the jump checks; the rules stay. */
  async close(): Promise<void> {
    await this.jumpGuard?.stop();
  }
}
