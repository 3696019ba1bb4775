// The iptables driver: our chains in the nat table of one iptables variant (legacy or nft), for
// IPv4 (iptables) and IPv6 (ip6tables), each write one `-restore --noflush` transaction per
// family; the xtables lock (-w) keeps kube-proxy's own restores and ours from interleaving.
//
// - Where the rules sit: layout.ts (entry chains IPVS_PREROUTING / IPVS_OUTPUT going to bucket
//   chains by the destination's last byte, and a Service's source-range chains); what they are:
//   rules.ts.
// - A family written whole (render.ts) declares our chains (so flushes them), writes their rules,
//   removes the bucket and source-range chains no longer needed and repairs the jump rules. With iptables-legacy
//   the whole nat table is read anyway, so a table that already holds exactly our rules is left
//   as it is (no rewrite, counters kept).
// - Element changes are deletes and appends in the buckets they touch (partial-write.ts).
// - A read back (verify.ts) reads the nat table and names what differs: 'chains' (written whole
//   again; chains of ours nothing wants among them) or 'jumps' (moved back to rule 1).
// - With iptables-nft every commit bumps the nf_tables ruleset generation, read around each of
//   ours: the reconciler trusts a family while every commit since it was exact was ours.
// Between syncs a jump guard (jump-guard.ts) keeps our jumps at rule 1 when another writer
// prepends its own, unless what it prepends cannot take packets away from ours (precedence.ts).
// The connections translated are our DNAT rules' packet counters, kept across the rules our own
// restores flush or delete (counters.ts).
// After a repair the driver tells its bypass listeners which family's translations new
// connections may have passed by; it never runs conntrack, so no write waits for a clean-up.
// The driver keeps no record of the kernel between its applies: what a write tells that the
// reconciler's record does not (annex.ts: the rules by chain, KUBE-MARK-MASQ at the whole write,
// the entries left out) is its annex (driver.ts, DriverAnnex), returned with each apply, kept by
// the reconciler with its record of the family and handed back with the next operation on it.

import type { Logger } from 'pino';
import { FAMILIES, type Entry, type Family, type FamilyState } from '../../model/types.js';
import type {
  Applied,
  Driver,
  DriverAnnex,
  DriverCapabilities,
  DriverOperation,
  EntryCapacity,
  FamilyShape,
  ProbeResult,
  ReadBack,
  TranslatedConnections,
} from '../../driver/driver.js';
import { IptablesCommands, type IptablesRunner, type IptablesVariant } from './executor.js';
import { TranslationCounter } from './counters.js';
import { KUBE_MARK_MASQ, parseNatSave } from './parse.js';
import { planPartialWrite, annexPartialWrite, type PartialWrite } from './partial-write.js';
import { renderJumpRepairs } from './precedence.js';
import { IptablesAnnex } from './annex.js';
import { probeVariant } from './probe.js';
import { renderFamilyRestore } from './render.js';
import type { Rejection } from './rules.js';
import { readVerificationView, shapeDrift } from './verify.js';
import { JumpGuard } from './jump-guard.js';
import { hasIptablesObjects, readJumpView, readWriteView, removeIptablesObjects, withRetries } from './nat-view.js';

export interface IptablesDriverOptions {
  /** Rejections (once per change) and jump repairs are logged here. */
  logger?: Logger | undefined;
  /** How often rule 1 of nat PREROUTING/OUTPUT is checked between syncs; 0: never. Default 1 s. */
  jumpCheckIntervalMs?: number;
  /** Runs the iptables commands; the real ones by default. */
  runner?: IptablesRunner;
  /**
   * Rule deletes in one chain of one partial write above which that chain is written whole
   * instead (REWRITE_ABOVE_DELETES by default; Infinity: never, 0: on every delete).
   */
  rewriteAboveDeletes?: number;
  /** Rules commented `namespace/name` as the original's (--iptables-comments; docs/iptables.md, "Comments"). */
  comments?: boolean;
}

/**
 * Rule deletes in one chain of a partial write above which the chain is written whole instead: a
 * `-D` finds its rule by walking the chain, so N deletes cost N walks of it, while a write of the
 * chain whole costs one. Chosen from bench/iptables-removal.ts (up to 6a3e56e; docs/iptables.md,
 * "Large removals"), with the removed rules at the end of 40,000-rule chains (one Service of
 * 10,000 ports on one address: one bucket chain per hook holds them all): legacy's deletes cost
 * less than a rewrite up to 256 and ten times more at 1,024; iptables-nft's cost more than a
 * rewrite from 16 on (and as much at 4).
 */
export const REWRITE_ABOVE_DELETES: Readonly<Record<IptablesVariant, number>> = { legacy: 256, nft: 4 };

/** Two rules per entry and hook; a new connection walks at most 256 gotos and the rules of one bucket. */
export const IPTABLES_CAPACITY: EntryCapacity = {
  defaultEntries: 20_000,
  why: 'each write of iptables-legacy replaces the whole table, whose size grows with the rules',
};

export class IptablesDriver implements Driver {
  readonly name = 'iptables' as const;
  readonly label: string;
  readonly capacity = IPTABLES_CAPACITY;
  readonly capabilities: DriverCapabilities;
  private readonly rewriteAboveDeletes: number;
  private readonly comments: boolean;
  /**
   * The reconciler runs its writes one at a time, but the jump guard repairs our jumps on a timer,
   * outside its syncs; both delete jump rules by their spec, computed from a listing. So a repair
   * and an apply() take turns here: neither deletes a jump the other just moved (which would fail
   * the restore), and a verification's jump repair reads and writes in one turn.
   */
  private turns: Promise<unknown> = Promise.resolve();
  private readonly jumpGuard: JumpGuard | undefined;
  /** Applies under way, and a count that moves as each starts and ends: a read alongside them sees one it overlapped. */
  private writesUnderWay = 0;
  private writeEvents = 0;
  private readonly bypassListeners: Array<(family: Family) => void> = [];
  /** The connections our rules translated, kept across our own writes (counters.ts). */
  private readonly counter = new TranslationCounter(
    (family) => this.commands(family),
    () => (this.writesUnderWay > 0 ? undefined : this.writeEvents),
  );

  constructor(
    readonly variant: IptablesVariant,
    private readonly options: IptablesDriverOptions = {},
  ) {
    this.label = `iptables-${variant}`;
    this.rewriteAboveDeletes = options.rewriteAboveDeletes ?? REWRITE_ABOVE_DELETES[variant];
    this.comments = options.comments ?? true;
    this.capabilities = { transactional: false, translates: 'packets', filtersSources: true };
    const interval = options.jumpCheckIntervalMs ?? 1000;
    if (interval > 0) {
      this.jumpGuard = new JumpGuard({
        variant,
        intervalMs: interval,
        logger: options.logger,
        // Its repairs touch only the jumps, which a verification reads again before it repairs
        // them: they do not make a listing alongside our writes unfinished.
        exclusive: (work) => this.turn(work),
        runner: options.runner,
        onRepair: (family) => this.bypassed(family),
      });
    }
  }

  /** Jump repairs made between syncs since the start. */
  get jumpRepairs(): number {
    return this.jumpGuard?.repairs ?? 0;
  }

  familyLabel(family: Family): string {
    return family;
  }

  shapeKey(shape: FamilyShape): string {
    return JSON.stringify([shape.state.localPodMatch, shape.masqueradeMark]);
  }

  /** Runs `work` once the turn before it has ended. */
  private turn<T>(work: () => Promise<T>): Promise<T> {
    const run = this.turns.then(work, work);
    this.turns = run.catch(() => undefined);
    return run;
  }

  /**
   * Listeners told when our jump was displaced and put back: new connections to the family's
   * translations may have passed them by meanwhile (the reconciler's subscribers forget their flows).
   */
  watchBypasses(listener: (family: Family) => void): void {
    this.bypassListeners.push(listener);
  }

  /** Tells the listeners, outside the turns of writes; what they do is not waited for. */
  private bypassed(family: Family): void {
    for (const listener of this.bypassListeners) listener(family);
  }

  private commands(family: Family): IptablesCommands {
    return new IptablesCommands(this.variant, family, this.options.runner);
  }

  probe(): Promise<ProbeResult> {
    return probeVariant(this.variant, (family) => this.commands(family));
  }

  generation(): Promise<number | undefined> {
    return this.commands('ipv4').generation();
  }

  /** Chains are not declared with a size. */
  roomFor(): number {
    return Number.POSITIVE_INFINITY;
  }

  /** Nothing to put back before a sync: the jump guard keeps our jumps first between syncs. */
  async prepare(): Promise<void> {}

  /** Whether the nat table holds any chain or jump of ours, in either family. */
  hasState(): Promise<boolean> {
    return hasIptablesObjects(this.variant, (family) => this.commands(family));
  }

  /** Nothing of its own outside V8's heap: the restores run in other processes. */
  async releaseMemory(): Promise<void> {}

  /** One restore per operation, all in one turn; the jump guard runs once a family is written. */
  async apply(operations: readonly DriverOperation[]): Promise<Applied> {
    // Stopped before the turn: a round under way may be waiting for one.
    if (operations.some((op) => op.kind === 'removeAll')) await this.jumpGuard?.stop();
    const { applied, repairedJumps } = await this.turn(() => this.tracked(() => this.applyInTurn(operations)));
    for (const family of repairedJumps) this.bypassed(family);
    if (applied.generations) this.jumpGuard?.ownCommit(applied.generations.before, applied.generations.after);
    // Our jumps are in place once a family is written; the guard looks only where our chains are.
    if (operations.some((op) => op.kind !== 'removeAll')) this.jumpGuard?.start();
    return applied;
  }

  private async applyInTurn(
    operations: readonly DriverOperation[],
  ): Promise<{ applied: Applied; repairedJumps: Family[] }> {
    const before = await this.generation();
    let restores = 0;
    const leftOut: Partial<Record<Family, number>> = {};
    const repairedJumps: Family[] = [];
    // This apply's annexes, each family's as its last operation left it; none survives the apply.
    const annexes = new Map<Family, IptablesAnnex | undefined>();
    const annexOf = (family: Family, annex: DriverAnnex) =>
      annexes.has(family) ? annexes.get(family) : annex instanceof IptablesAnnex ? annex : undefined;
    const whole = async (family: Family, state: FamilyState, mark: number, prev?: IptablesAnnex, all = true) => {
      annexes.set(family, undefined);
      const { annex, wrote } = await this.writeWhole(family, state, mark, prev, all);
      annexes.set(family, annex);
      if (wrote) restores++;
      leftOut[family] = state.entries.length - annex.programmed;
    };
    for (const op of operations) {
      switch (op.kind) {
        case 'writeFamily':
        case 'replaceFamily': {
          const annex = op.kind === 'writeFamily' ? annexOf(op.family, op.annex) : undefined;
          await whole(op.family, op.state, op.masqueradeMark, annex, annex === undefined);
          break;
        }
        case 'writeShape':
        case 'elements': {
          const annex = annexOf(op.family, op.annex);
          if (!annex) throw new Error('our chains were never written');
          if (await this.writeChanges(op.family, annex, op.remove as readonly Entry[], op.add)) restores++;
          annexes.set(op.family, annex);
          break;
        }
        case 'repairShape':
          if (op.parts.includes('chains')) {
            const state = { entries: [...op.entries], localPodMatch: op.shape.state.localPodMatch };
            this.options.logger?.info(
              { family: op.family },
              'Our iptables chains were not what was last written, writing them whole',
            );
            // Read whole (iptables-nft too): the chains of ours the read back found and nothing
            // wants are removed, which the write view of iptables-nft does not list.
            await whole(op.family, state, op.shape.masqueradeMark, annexOf(op.family, op.annex));
          } else if (op.parts.includes('jumps')) {
            // Read again in this turn: the jump guard may have repaired the jumps since the read
            // back, and deletes computed from an older view would fail.
            const commands = this.commands(op.family);
            const repairs = renderJumpRepairs(await readJumpView(commands));
            if (repairs.length > 0) {
              await commands.restore(['*nat', ...repairs, 'COMMIT', ''].join('\n'));
              restores++;
              repairedJumps.push(op.family);
            }
          }
          break;
        case 'removeAll':
          await this.removeAll();
          restores++;
          break;
      }
    }
    const rejected: NonNullable<Applied['rejected']> = {};
    const handed: NonNullable<Applied['annex']> = {};
    for (const op of operations) {
      for (const family of op.kind === 'removeAll' ? FAMILIES : [op.family]) {
        const annex = op.kind === 'removeAll' ? undefined : annexOf(family, 'annex' in op ? op.annex : undefined);
        rejected[family] = annex?.rejected ?? [];
        handed[family] = annex;
      }
    }
    const applied: Applied = { leftOut, rejected, annex: handed };
    if (restores === 0) applied.unchanged = true;
    const after = restores === 1 ? await this.generation() : undefined;
    if (before !== undefined && after !== undefined) applied.generations = { before, after };
    return { applied, repairedJumps };
  }

  /**
   * Our chains written whole (declared, so flushed) and the jumps repaired; `wrote` false: the
   * kernel held them already. `previous`: the annex of the family's last write, when known. The
   * write removes the chains of ours the state no longer needs among those its view lists:
   * iptables-legacy's is the whole table; iptables-nft's names only the chains the entry chains go
   * to, with `previous`'s (a Service's source-range chains), unless `readWhole` (no annex: at the
   * start, after a failed write; a repair), when it reads the whole table.
   */
  private async writeWhole(
    family: Family,
    state: FamilyState,
    masqueradeMark: number,
    previous: IptablesAnnex | undefined,
    readWhole: boolean,
  ): Promise<{ annex: IptablesAnnex; wrote: boolean }> {
    const commands = this.commands(family);
    const { rendered, useKubeMarkMasq } = await withRetries(async () => {
      const current =
        this.variant === 'nft' && readWhole ? parseNatSave(await commands.save('nat')) : await readWriteView(commands);
      if (this.variant === 'nft' && !readWhole)
        for (const chain of previous?.chainNames() ?? []) current.chains.add(chain);
      const rendered = renderFamilyRestore(family, state, masqueradeMark, current, this.comments);
      if (!rendered.upToDate) await this.counter.restore(commands, rendered.text, current.chains);
      return { rendered, useKubeMarkMasq: current.chains.has(KUBE_MARK_MASQ) };
    });
    const shape = { localPodMatch: state.localPodMatch, masqueradeMark, useKubeMarkMasq, comments: this.comments };
    this.reportRejections(previous?.rejected, rendered.rejected);
    return { annex: IptablesAnnex.of(rendered, shape), wrote: !rendered.upToDate };
  }

  /**
   * The rules of the entries that went and came, as one restore (partial-write.ts), `annex` (as
   * handed back) made to follow; false when no rule changes. When it throws (the chains are not
   * what the annex says, or the change cannot be written in part) `annex` is as it was, and the
   * reconciler forgets it and writes the family whole, with a read of the whole table.
   */
  private async writeChanges(
    family: Family,
    annex: IptablesAnnex,
    removed: readonly Entry[],
    added: readonly Entry[],
  ): Promise<boolean> {
    const write: PartialWrite = planPartialWrite(family, annex, removed, added, this.rewriteAboveDeletes);
    const existing = new Set(annex.chainNames());
    if (write.text !== undefined) await this.counter.restore(this.commands(family), write.text, existing);
    const before = annex.rejected;
    annexPartialWrite(annex, write);
    this.reportRejections(before, annex.rejected);
    return write.text !== undefined;
  }

  /**
   * Our chains and jumps read back and compared with the rules `expected` and `shape` make
   * (verify.ts). 'alongside-writes': read while our writes go on (a change does not wait for the
   * listing, which takes a few hundred ms at 10,000 entries); a read that one of our writes
   * overlapped is 'unfinished' and the
   * verification is skipped (a partial sync that commits between the reconciler's snapshot and
   * the read is one the read overlapped, or one the verifier leaves out by its keys).
   */
  async readBack(
    family: Family,
    expected: readonly Entry[],
    shape: FamilyShape,
    how: 'alongside-writes' | 'between-writes',
  ): Promise<ReadBack | 'unfinished'> {
    const alongside = how === 'alongside-writes';
    const events = this.writeEvents;
    if (alongside && this.writesUnderWay > 0) return 'unfinished';
    const { view, generation } = await readVerificationView(this.commands(family));
    if (alongside && this.writeEvents !== events) return 'unfinished';
    // What our writes change from now on does not make the table read untrue: compared at leisure.
    // Strays are 'chains': the repair's whole write reads the whole table, and removes them.
    const { drift } = await shapeDrift(family, view, expected, shape, this.comments);
    const read: ReadBack = { missing: [], foreign: [], shapeDrift: drift };
    if (generation !== undefined) read.generation = generation;
    return read;
  }

  private async tracked<T>(work: () => Promise<T>): Promise<T> {
    this.writesUnderWay++;
    this.writeEvents++;
    try {
      return await work();
    } finally {
      this.writesUnderWay--;
      this.writeEvents++;
    }
  }

  /** Each rejection is logged once, when the set of them for its family changes (from `before`, the last write's). */
  private reportRejections(before: readonly Rejection[] | undefined, rejected: readonly Rejection[]): void {
    if (JSON.stringify(rejected) === JSON.stringify(before ?? [])) return;
    for (const r of rejected) {
      this.options.logger?.warn({ family: r.family, item: r.item, reason: r.reason }, 'Left out of the iptables rules');
    }
  }

  /** Called in a turn, the jump guard stopped. */
  private async removeAll(): Promise<void> {
    for (const family of FAMILIES) {
      await this.counter.removeAll(family, () => removeIptablesObjects(this.variant, family, this.options.runner));
    }
  }

  /** Our DNAT rules' packet counters, read when scraped (counters.ts). */
  translatedConnections(): Promise<TranslatedConnections[]> {
    return this.counter.read();
  }

  /** Stops the jump checks; the rules stay. */
  async close(): Promise<void> {
    await this.jumpGuard?.stop();
  }
}
