// The iptables backend: chains IPVS_PREROUTING and IPVS_OUTPUT in the nat table of one iptables
// variant (legacy or nft), for IPv4 (iptables) and IPv6 (ip6tables). Every write is one
// `-restore --noflush` per family, atomic on its own: iptables-legacy replaces the whole table
// blob in one call, iptables-nft commits the input as one nf_tables batch. The xtables lock (-w)
// keeps kube-proxy's own restores and ours from interleaving.
// - A change writes only the rules that changed (render.ts renderPartialRestore): deletes by spec
//   and appends, nothing read, nothing flushed.
// - A whole write (first sync, a changed local pod match or mark, a partial write refused, chains
//   found changed) declares our chains, so flushes them, and repairs the jumps.
// - A periodic resync writes the change, then verifies that the chains are what was last written
//   (iptables-nft: the ruleset generation says so without a listing when only we committed;
//   iptables-legacy: the `-save` read anyway) and rewrites them only if not.
// Between syncs a jump guard (jump-guard.ts) keeps our jumps at rule 1 when another writer
// prepends its own, and the flows that the displacement left untranslated are forgotten.

import { execa } from 'execa';
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
import { KUBE_MARK_MASQ, OUR_CHAINS, emptyNatTable, hasOurObjects, parseNatSave, type NatTableView } from './parse.js';
import {
  chainsHold,
  entryLabel,
  renderChainRules,
  renderCleanupRestore,
  renderFamilyRestore,
  renderJumpRepairs,
  renderPartialRestore,
  type Rejection,
} from './render.js';
import { JumpGuard, readJumpView } from './jump-guard.js';

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
  /** The entries array the rules were written from (the model never changes an array it gave). */
  entries: Entry[];
  localPodMatch: FamilyState['localPodMatch'];
  masqueradeMark: number;
  /** Whether the mark rules jump to KUBE-MARK-MASQ (it existed when the chains were written). */
  useKubeMarkMasq: boolean;
  programmed: number;
  rejected: Rejection[];
}

/**
 * What the rules of a family depend on besides the entries: the local pod match and the mark.
 * A change of either rewrites every rule, so it is a full write.
 */
export function familyRest(state: Pick<FamilyState, 'localPodMatch'>, masqueradeMark: number): string {
  return JSON.stringify([state.localPodMatch, masqueradeMark]);
}

function entryKey(e: Entry): string {
  return JSON.stringify([e.externalIp, e.protocol, e.port, e.clusterIp, e.service, e.family]);
}

/**
 * The entries that went and came between what was programmed and `state`: the model's own
 * account when it starts from the programmed array, else a comparison of the two lists.
 */
export function entryChanges(before: readonly Entry[], state: FamilyState): { removed: Entry[]; added: Entry[] } {
  if (state.entries === before) return { removed: [], added: [] };
  if (state.changes?.since === before) return { removed: state.changes.removed, added: state.changes.added };
  const old = new Set(before.map(entryKey));
  const now = new Set(state.entries.map(entryKey));
  return {
    removed: before.filter((e) => !now.has(entryKey(e))),
    added: state.entries.filter((e) => !old.has(entryKey(e))),
  };
}

/**
 * Our chains and the jumps as a verification needs them: legacy reads the whole nat table (one
 * -save, what any listing costs there); iptables-nft lists the four chains it needs.
 */
async function readVerificationView(commands: IptablesCommands): Promise<NatTableView> {
  if (commands.variant === 'legacy') return parseNatSave(await commands.save('nat'));
  const view = await readJumpView(commands);
  for (const chain of OUR_CHAINS) {
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

/** Conntrack entries deleted after one repair at most: the window is short, a flood is not ours to clear. */
const MAX_FORGOTTEN_FLOWS = 512;
const CONNTRACK_TIMEOUT_MS = 5000;
/** `conntrack -L` output we read: at most this much (a busy node's table can be far larger). */
const MAX_CONNTRACK_LISTING_BYTES = 32 << 20;
/** An unanswered flow: protocol, original source, destination and ports, then the reply's source. */
const UNREPLIED_FLOW =
  /^(tcp|udp)\s+\d+\s+\d+\s+(?:[A-Z_]+\s+)?src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+) \[UNREPLIED\] src=(\S+) /;

/**
 * Deletes the conntrack entries that a displacement of our jump pinned: flows to one of our
 * (external IP, protocol, port) whose first packet crossed the nat hook while another writer's
 * jump ran first, so that they were not translated (the reply would come from the external IP
 * itself), and that no reply has reached. NAT is decided on a flow's first packet: left alone,
 * every retransmitted SYN of such a connection follows the untranslated entry until it times
 * out. Deleted, the next retransmission starts a new entry and meets our DNAT. Flows that were
 * answered are left alone (they work, through whatever answered them). Returns how many went;
 * never throws (the conntrack command may be missing: a lost flow is a smaller harm).
 */
export async function forgetUntranslatedFlows(family: Family, keys: ReadonlySet<string>): Promise<number> {
  if (keys.size === 0) return 0;
  let deleted = 0;
  for (const protocol of ['tcp', 'udp'] as const) {
    const listing = await execa('conntrack', ['-L', '-f', family, '-p', protocol], {
      reject: false,
      timeout: CONNTRACK_TIMEOUT_MS,
      stdin: 'ignore',
      stderr: 'ignore',
      maxBuffer: MAX_CONNTRACK_LISTING_BYTES,
    });
    if (typeof listing.stdout !== 'string') continue;
    for (const line of listing.stdout.split('\n')) {
      const m = UNREPLIED_FLOW.exec(line);
      if (!m) continue;
      const [, proto, src, dst, sport, dport, replySrc] = m as unknown as string[];
      if (replySrc !== dst || !keys.has(`${dst!} ${proto!.toUpperCase()} ${dport!}`)) continue;
      if (deleted >= MAX_FORGOTTEN_FLOWS) return deleted;
      const args = ['-D', '-f', family, '-p', proto!, '-s', src!, '-d', dst!, '--sport', sport!, '--dport', dport!];
      const result = await execa('conntrack', args, { reject: false, timeout: CONNTRACK_TIMEOUT_MS, stdin: 'ignore' });
      if (result.exitCode === 0) deleted++;
    }
  }
  return deleted;
}

export interface IptablesBackendOptions {
  /** Rejections (once per change) and jump repairs are logged here. */
  logger?: Logger;
  /** How often rule 1 of nat PREROUTING/OUTPUT is checked between syncs; 0: never. Default 1 s. */
  jumpCheckIntervalMs?: number;
  /** Runs the iptables commands; the real ones by default. */
  runner?: IptablesRunner;
  /**
   * Deletes the flows a displacement of our jumps left untranslated (forgetUntranslatedFlows);
   * by default the conntrack command with the real iptables commands, nothing with a stand-in runner.
   */
  forgetFlows?: (family: Family, keys: ReadonlySet<string>) => Promise<number>;
}

/** Two rules per entry, walked one by one by every new connection that leaves the node. */
export const IPTABLES_CAPACITY: EntryCapacity = {
  defaultEntries: 20_000,
  why: 'every new connection walks two rules per entry',
};

interface FamilyOutcome extends ProgrammedFamily {
  wrote: 'nothing' | 'partial' | 'whole';
}

export class IptablesBackend implements Backend {
  readonly name = 'iptables' as const;
  readonly capacity = IPTABLES_CAPACITY;
  readonly partialSyncsDuringFull = true;
  /** What was last written per family, and what else its rules depend on (familyRest). */
  private readonly programmed = new Map<Family, { value: ProgrammedFamily; rest: string }>();
  /**
   * iptables-nft: per family, a ruleset generation at which the nat table held exactly what
   * `programmed` says, carried forward through commits that were ours alone; absent: verify.
   */
  private readonly trustedAt = new Map<Family, number>();
  /** Bumped by every write of ours: a verification read that one overtook is made again. */
  private writes = 0;
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
        commit: (commands, text) => this.commit(commands, text, undefined),
        afterRepair: (family) => this.forgetPinnedFlows(family),
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
    // Written in the order asked for; a full sync then checks, without holding back the writes
    // that come meanwhile, that the kernel holds what was written.
    const result = await this.exclusive(() => this.writeFamilies(desired));
    if (options.full) {
      const failures: string[] = [];
      for (const family of FAMILIES) {
        if (result.written.has(family)) continue;
        try {
          const checked = await this.verifyFamily(family);
          if (checked === 'rewritten') {
            result.mode = 'full';
            result.fallbackReason = 'the chains were not what was last written';
          } else if (checked === 'repaired' && result.mode === 'noop') result.mode = 'partial';
        } catch (err) {
          this.forget(family);
          failures.push(`${family}: ${(err as Error).message}`);
        }
      }
      if (failures.length > 0) {
        throw new BackendError(`iptables-${this.variant} sync failed: ${failures.join('; ')}`, 'iptables');
      }
    }
    this.reportRejections(result.rejected);
    this.jumpGuard?.start();
    const { written: _written, ...reported } = result;
    return reported;
  }

  /** After our jump was displaced and put back: the flows it left untranslated go (forgetUntranslatedFlows). */
  private async forgetPinnedFlows(family: Family): Promise<void> {
    const programmed = this.programmed.get(family)?.value;
    if (!programmed) return;
    const keys = new Set(programmed.entries.map((e) => `${e.externalIp} ${e.protocol} ${e.port}`));
    const forget = this.options.forgetFlows ?? (this.options.runner ? undefined : forgetUntranslatedFlows);
    const deleted = forget ? await forget(family, keys).catch(() => 0) : 0;
    if (deleted > 0) {
      this.options.logger?.info(
        { family, deleted },
        'Deleted conntrack entries of connections that started untranslated while our jump was displaced',
      );
    }
  }

  private forget(family: Family): void {
    this.programmed.delete(family);
    this.trustedAt.delete(family);
  }

  /**
   * One restore of ours. With iptables-nft it also carries forward what is known of the kernel:
   * when the ruleset generation moved by exactly this commit, families trusted before it still
   * are, and `basis` says what this write leaves: 'carry' (a partial write: trusted after if it
   * was before) or the generation at which the table it was rendered from was read (a whole
   * write: trusted after if nothing committed since that read).
   */
  private async commit(commands: IptablesCommands, text: string, basis: number | 'carry' | undefined): Promise<void> {
    const family = commands.family;
    const before = await commands.generation();
    this.writes++;
    try {
      await commands.restore(text);
    } catch (err) {
      this.trustedAt.delete(family);
      throw err;
    }
    const after = await commands.generation();
    if (before === undefined || after !== before + 1) {
      this.trustedAt.clear();
      return;
    }
    const wasTrusted = this.trustedAt.get(family) === before;
    for (const [f, at] of this.trustedAt) {
      if (at === before) this.trustedAt.set(f, after);
      else this.trustedAt.delete(f);
    }
    const trusted = basis === 'carry' ? wasTrusted : basis === before;
    if (trusted) this.trustedAt.set(family, after);
    else this.trustedAt.delete(family);
  }

  private async writeFamilies(desired: DesiredState): Promise<IptablesSyncResult & { written: Set<Family> }> {
    const failures: string[] = [];
    const rejected: Rejection[] = [];
    const entries = { ipv4: 0, ipv6: 0 };
    const written = new Set<Family>();
    let mode: SyncResult['mode'] = 'noop';
    let fallbackReason: string | undefined;
    for (const family of FAMILIES) {
      const state = desired[family];
      try {
        const before = this.programmed.get(family);
        let outcome: FamilyOutcome | undefined;
        if (!before) fallbackReason ??= 'first write';
        else if (before.rest !== familyRest(state, desired.masqueradeMark)) {
          fallbackReason ??= 'the local pod match or the mark changed';
        } else {
          outcome = await this.writePartial(family, before.value, state);
          if (!outcome) fallbackReason ??= 'a partial write failed';
        }
        if (!outcome) {
          outcome = await this.writeWhole(family, state, desired.masqueradeMark);
          written.add(family);
        }
        if (outcome.wrote === 'whole') mode = 'full';
        else if (outcome.wrote === 'partial' && mode === 'noop') mode = 'partial';
        rejected.push(...outcome.rejected);
        entries[family] = outcome.programmed;
      } catch (err) {
        this.forget(family);
        failures.push(`${family}: ${(err as Error).message}`);
      }
    }
    if (failures.length > 0) {
      throw new BackendError(`iptables-${this.variant} sync failed: ${failures.join('; ')}`, 'iptables');
    }
    return { mode, entries, rejected, written, ...(mode === 'full' && fallbackReason ? { fallbackReason } : {}) };
  }

  /**
   * The rules of the entries that went and came, as one restore; undefined when it failed (the
   * chains are not what was last written: the caller writes them whole).
   */
  private async writePartial(
    family: Family,
    before: ProgrammedFamily,
    state: FamilyState,
  ): Promise<FamilyOutcome | undefined> {
    const { removed, added } = entryChanges(before.entries, state);
    const rendered = renderPartialRestore(
      family,
      removed,
      added,
      state.localPodMatch,
      before.masqueradeMark,
      before.useKubeMarkMasq,
    );
    if (rendered.text !== undefined) {
      try {
        await this.commit(this.commands(family), rendered.text, 'carry');
      } catch (err) {
        if (err instanceof IptablesToolMissing) throw err;
        this.options.logger?.debug({ family, err }, 'A partial iptables write failed, writing the chains whole');
        return undefined;
      }
    }
    const gone = new Set(removed.map(entryLabel));
    const value: ProgrammedFamily = {
      ...before,
      entries: state.entries,
      programmed: before.programmed - rendered.removedProgrammed + rendered.addedProgrammed,
      rejected: [...before.rejected.filter((r) => !gone.has(r.item)), ...rendered.rejected],
    };
    this.programmed.set(family, { value, rest: familyRest(state, before.masqueradeMark) });
    return { wrote: rendered.text === undefined ? 'nothing' : 'partial', ...value };
  }

  /** Our chains written whole (declared, so flushed) and the jumps repaired, after reading the jumps. */
  private async writeWhole(family: Family, state: FamilyState, masqueradeMark: number): Promise<FamilyOutcome> {
    const commands = this.commands(family);
    const result = await withRetries(async () => {
      const basis = await commands.generation();
      const current = await readJumpView(commands);
      const rendered = renderFamilyRestore(family, state, masqueradeMark, current);
      if (!rendered.upToDate) await this.commit(commands, rendered.text, basis);
      return { ...rendered, useKubeMarkMasq: current.chains.has(KUBE_MARK_MASQ) };
    });
    const value: ProgrammedFamily = {
      entries: state.entries,
      localPodMatch: state.localPodMatch,
      masqueradeMark,
      useKubeMarkMasq: result.useKubeMarkMasq,
      programmed: result.programmed,
      rejected: result.rejected,
    };
    this.programmed.set(family, { value, rest: familyRest(state, masqueradeMark) });
    return { wrote: result.upToDate ? 'nothing' : 'whole', ...value };
  }

  /**
   * Whether the kernel holds what was last written for a family, and if not, writes it again:
   * 'trusted' (iptables-nft: no commit but ours since it was last known to), 'held' (read and
   * compared), 'repaired' (only our jumps had been displaced), 'rewritten'. The read is made
   * without holding back our writes; one that a write of ours overtook is made again between writes.
   */
  private async verifyFamily(family: Family): Promise<'trusted' | 'held' | 'repaired' | 'rewritten'> {
    const commands = this.commands(family);
    const generation = await commands.generation();
    if (generation !== undefined && this.trustedAt.get(family) === generation) return 'trusted';
    const read = async () => {
      const writes = this.writes;
      const basis = await commands.generation();
      const view = await readVerificationView(commands);
      const settled = basis !== undefined && (await commands.generation()) === basis;
      return { writes, view, basis: settled ? basis : undefined };
    };
    let seen = this.programmed.has(family) ? await read() : undefined;
    return this.exclusive(async () => {
      const entry = this.programmed.get(family);
      if (!entry) return 'held'; // a write failed meanwhile and reported it: the next sync writes whole
      if (!seen || seen.writes !== this.writes) seen = await read();
      const programmed = entry.value;
      const { view, basis } = seen;
      const expected = renderChainRules(
        family,
        { entries: programmed.entries, localPodMatch: programmed.localPodMatch },
        programmed.masqueradeMark,
        view.chains.has(KUBE_MARK_MASQ),
      );
      if (!chainsHold(view, expected.rules)) {
        this.options.logger?.info({ family }, 'Our iptables chains were not what was last written, writing them whole');
        await this.writeWhole(
          family,
          { entries: programmed.entries, localPodMatch: programmed.localPodMatch },
          programmed.masqueradeMark,
        );
        return 'rewritten';
      }
      const repairs = renderJumpRepairs(view);
      if (repairs.length > 0) {
        await this.commit(commands, ['*nat', ...repairs, 'COMMIT', ''].join('\n'), basis);
        await this.forgetPinnedFlows(family);
        return 'repaired';
      }
      if (basis !== undefined) this.trustedAt.set(family, basis);
      return 'held';
    });
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
      this.trustedAt.clear();
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
