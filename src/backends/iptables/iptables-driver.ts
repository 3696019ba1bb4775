// The iptables driver: chains IPVS_PREROUTING and IPVS_OUTPUT in the nat table of one iptables
// variant (legacy or nft), for IPv4 (iptables) and IPv6 (ip6tables), each write one
// `-restore --noflush` transaction per family; the xtables lock (-w) keeps kube-proxy's own
// restores and ours from interleaving.
//
// - A family written whole declares our chains (so flushes them), writes their rules and repairs
//   the jump rules. With iptables-legacy the whole nat table is read anyway, so a table that
//   already holds exactly our rules is left as it is (no rewrite, counters kept).
// - Element changes are single-rule deletes and appends (render.ts renderPartialRestore); past
//   REWRITE_ABOVE_DELETES deletes, our chains written whole in the same restore instead.
// - A read back lists our chains and the jumps and names what differs: 'chains' (written whole
//   again) or 'jumps' (moved back to rule 1).
// - With iptables-nft every commit bumps the nf_tables ruleset generation, read around each of
//   ours: the reconciler trusts a family while every commit since it was exact was ours.
// Between syncs a jump guard (jump-guard.ts) keeps our jumps at rule 1 when another writer
// prepends its own, unless what it prepends cannot take packets away from ours (precedence.ts).
// After a repair the driver tells its bypass listeners which translations new connections may
// have passed by; it never runs conntrack itself, so no write waits for a flow clean-up.

import type { Logger } from 'pino';
import { FAMILIES, type Entry, type Family, type FamilyState, type LocalPodMatch } from '../../model/types.js';
import type {
  Applied,
  Driver,
  DriverCapabilities,
  DriverOperation,
  EntryCapacity,
  FamilyShape,
  ProbeResult,
  ReadBack,
} from '../../driver/driver.js';
import type { TranslationsBypassed } from '../../driver/kernel-change.js';
import { IptablesCommands, type IptablesRunner, type IptablesVariant } from './executor.js';
import { KUBE_MARK_MASQ, OUR_CHAINS, emptyNatTable, parseNatSave, type NatTableView } from './parse.js';
import {
  assembleRestore,
  chainsHold,
  entryLabel,
  renderChainRules,
  renderFamilyRestore,
  renderJumpRepairs,
  renderPartialRestore,
  type Rejection,
} from './render.js';
import { JumpGuard } from './jump-guard.js';
import { readChains, readJumpView, removeIptablesObjects, withRetries } from './nat-view.js';

export interface IptablesDriverOptions {
  /** Rejections (once per change) and jump repairs are logged here. */
  logger?: Logger | undefined;
  /** How often rule 1 of nat PREROUTING/OUTPUT is checked between syncs; 0: never. Default 1 s. */
  jumpCheckIntervalMs?: number;
  /** Runs the iptables commands; the real ones by default. */
  runner?: IptablesRunner;
  /**
   * Rule deletes in one partial write above which our chains are written whole instead
   * (REWRITE_ABOVE_DELETES by default; Infinity: never, 0: on every delete).
   */
  rewriteAboveDeletes?: number;
}

/**
 * Rule deletes in one partial write above which the chains are written whole instead: a `-D`
 * finds its rule by walking the chain (libiptc compares the rules one by one; iptables-nft
 * converts every rule of the chain back to compare it), so N deletes cost N walks of the chain,
 * while a write of the chain whole costs one. Chosen from `npm run bench -- --only
 * iptables-removal` (docs/iptables.md, "Large removals"), with the removed rules at the end of
 * 40,000-rule chains: legacy's deletes cost less than a rewrite up to 256 and ten times more at
 * 1,024; iptables-nft's cost more than a rewrite from 16 on (and as much at 4, one entry's rules).
 */
export const REWRITE_ABOVE_DELETES: Readonly<Record<IptablesVariant, number>> = { legacy: 256, nft: 4 };

/** How a write names an (external IP, protocol, port). */
function flowKey(e: Pick<Entry, 'externalIp' | 'protocol' | 'port'>): string {
  return `${e.externalIp} ${e.protocol} ${e.port}`;
}

/** Two rules per entry, walked one by one by every new connection that leaves the node. */
export const IPTABLES_CAPACITY: EntryCapacity = {
  defaultEntries: 20_000,
  why: 'every new connection walks two rules per entry',
};

/** What the rules of a family were last written with, besides the entries. */
interface WrittenFamily {
  localPodMatch: LocalPodMatch;
  masqueradeMark: number;
  /** Whether the mark rules jump to KUBE-MARK-MASQ (it existed when the chains were written). */
  useKubeMarkMasq: boolean;
  /** The entries written, by (external IP, protocol, port) (flowKey): a chain written whole again holds them. */
  entries: Map<string, Entry>;
  /** Entries with rules. */
  programmed: number;
  rejected: Rejection[];
}

/**
 * Our chains and the jumps as a verification needs them: legacy reads the whole nat table (one
 * -save, what any listing costs there); iptables-nft lists the four chains it needs.
 */
async function readVerificationView(commands: IptablesCommands): Promise<NatTableView> {
  if (commands.variant === 'legacy') return parseNatSave(await commands.save('nat'));
  return readChains(commands, OUR_CHAINS, await readJumpView(commands));
}

export class IptablesDriver implements Driver {
  readonly name = 'iptables' as const;
  readonly label: string;
  readonly capacity = IPTABLES_CAPACITY;
  readonly capabilities: DriverCapabilities;
  private readonly written = new Map<Family, WrittenFamily>();
  private readonly rewriteAboveDeletes: number;
  /** Writes, removals and jump repairs write the same rules: one at a time. */
  private queue: Promise<unknown> = Promise.resolve();
  private readonly jumpGuard: JumpGuard | undefined;
  /** Our writes under way, and a count that moves as each starts and ends: a read alongside them sees one it overlapped. */
  private writesUnderWay = 0;
  private writeEvents = 0;
  /** Per family, the rejections last logged. */
  private readonly reportedRejections = new Map<Family, string>();
  private readonly bypassListeners: Array<(bypass: TranslationsBypassed) => void> = [];

  constructor(
    readonly variant: IptablesVariant,
    private readonly options: IptablesDriverOptions = {},
  ) {
    this.label = `iptables-${variant}`;
    this.rewriteAboveDeletes = options.rewriteAboveDeletes ?? REWRITE_ABOVE_DELETES[variant];
    this.capabilities = {
      ordersOwnWrites: true,
      conntrackMatters: true,
      atomicWrites: false,
      replacesFamilies: false,
      readsAlongsideWrites: true,
      filtersSources: true,
    };
    const interval = options.jumpCheckIntervalMs ?? 1000;
    if (interval > 0) {
      this.jumpGuard = new JumpGuard({
        variant,
        intervalMs: interval,
        logger: options.logger,
        // Its repairs touch only the jumps, which a verification reads again before it repairs
        // them: they do not make a listing alongside our writes unfinished.
        exclusive: (work) => this.exclusive(work, false),
        families: () => this.written.keys(),
        runner: options.runner,
        onRepair: (family) => this.bypassed(family),
      });
    }
  }

  /** Entries and matches left out because a value failed validation; the rest was programmed. */
  get rejected(): Rejection[] {
    return FAMILIES.flatMap((f) => this.written.get(f)?.rejected ?? []);
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

  /** Runs `work` after the writes before it; `tracked`: a write of our chains, which a listing alongside must not overlap. */
  private exclusive<T>(work: () => Promise<T>, tracked = true): Promise<T> {
    const next = tracked ? () => this.tracked(work) : work;
    const run = this.queue.then(next, next);
    this.queue = run.catch(() => undefined);
    return run;
  }

  /**
   * Listeners told when our jump was displaced and put back: new connections to the family's
   * translations may have passed them by meanwhile (the controller forgets their flows).
   */
  watchBypasses(listener: (bypass: TranslationsBypassed) => void): void {
    this.bypassListeners.push(listener);
  }

  /** Tells the listeners, outside the queue of writes; what they do is not waited for. */
  private bypassed(family: Family): void {
    const entries = this.written.get(family)?.entries;
    if (!entries || entries.size === 0) return;
    const bypass: TranslationsBypassed = { family, entries: [...entries.values()] };
    for (const listener of this.bypassListeners) listener(bypass);
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

  generation(): Promise<number | undefined> {
    return this.commands('ipv4').generation();
  }

  /** One restore per operation; the jump guard runs once a family is written. */
  async apply(operations: readonly DriverOperation[]): Promise<Applied> {
    const before = await this.generation();
    let restores = 0;
    const leftOut: Partial<Record<Family, number>> = {};
    const count = (family: Family, entries: number, wrote: boolean) => {
      if (wrote) restores++;
      leftOut[family] = entries - (this.written.get(family)?.programmed ?? 0);
    };
    for (const op of operations) {
      switch (op.kind) {
        case 'writeFamily':
        case 'replaceFamily':
          count(op.family, op.state.entries.length, await this.writeWhole(op.family, op.state, op.masqueradeMark));
          break;
        case 'writeShape':
        case 'elements': {
          const wrote = await this.writeChanges(op.family, op.remove as readonly Entry[], op.add);
          if (wrote) restores++;
          break;
        }
        case 'repairShape':
          if (op.parts.includes('chains')) {
            const state = { entries: [...op.entries], localPodMatch: op.shape.state.localPodMatch };
            this.options.logger?.info(
              { family: op.family },
              'Our iptables chains were not what was last written, writing them whole',
            );
            count(op.family, op.entries.length, await this.writeWhole(op.family, state, op.shape.masqueradeMark));
          } else if (op.parts.includes('jumps')) {
            const commands = this.commands(op.family);
            // Read and written in one turn of the queue: the jump guard may have repaired the
            // jumps since the read back, and deletes computed from an older view would fail.
            const repaired = await this.exclusive(async () => {
              const repairs = renderJumpRepairs(await readJumpView(commands));
              if (repairs.length === 0) return false;
              await commands.restore(['*nat', ...repairs, 'COMMIT', ''].join('\n'));
              return true;
            });
            if (repaired) {
              restores++;
              this.bypassed(op.family);
            }
          }
          break;
        case 'removeAll':
          await this.removeAll();
          restores++;
          break;
      }
    }
    if (this.written.size > 0) this.jumpGuard?.start();
    const rejected: NonNullable<Applied['rejected']> = {};
    for (const op of operations) {
      for (const family of op.kind === 'removeAll' ? FAMILIES : [op.family]) {
        rejected[family] = this.written.get(family)?.rejected ?? [];
      }
    }
    const applied: Applied = { leftOut, rejected };
    if (restores === 0) applied.unchanged = true;
    const after = restores === 1 ? await this.generation() : undefined;
    if (before !== undefined && after !== undefined) applied.generations = { before, after };
    return applied;
  }

  /** Our chains written whole (declared, so flushed) and the jumps repaired; false: the kernel held them already. */
  private async writeWhole(family: Family, state: FamilyState, masqueradeMark: number): Promise<boolean> {
    this.written.delete(family);
    const commands = this.commands(family);
    const result = await this.exclusive(() =>
      withRetries(async () => {
        const current = await readJumpView(commands);
        const rendered = renderFamilyRestore(family, state, masqueradeMark, current);
        if (!rendered.upToDate) await commands.restore(rendered.text);
        return { ...rendered, useKubeMarkMasq: current.chains.has(KUBE_MARK_MASQ) };
      }),
    );
    this.written.set(family, {
      localPodMatch: state.localPodMatch,
      masqueradeMark,
      useKubeMarkMasq: result.useKubeMarkMasq,
      entries: new Map(state.entries.map((e) => [flowKey(e), e])),
      programmed: result.programmed,
      rejected: result.rejected,
    });
    this.reportRejections(family, result.rejected);
    return !result.upToDate;
  }

  /**
   * The rules of the entries that went and came, as one restore; false when no rule changes.
   * Above the variant's REWRITE_ABOVE_DELETES, our chains are declared (so flushed) and written
   * with the entries that stay and come, in the same restore instead: one transaction either way
   * (iptables-legacy replaces the table in one step; iptables-nft commits the restore as one
   * nf_tables batch), so packets see the old rules or the new ones. The jumps are not touched.
   */
  private async writeChanges(family: Family, removed: readonly Entry[], added: readonly Entry[]): Promise<boolean> {
    const before = this.written.get(family);
    if (!before) throw new Error('our chains were never written');
    const rendered = renderPartialRestore(
      family,
      removed,
      added,
      before.localPodMatch,
      before.masqueradeMark,
      before.useKubeMarkMasq,
    );
    const entries = new Map(before.entries);
    for (const e of removed) entries.delete(flowKey(e));
    for (const e of added) entries.set(flowKey(e), e);
    let text = rendered.text;
    let programmed = before.programmed - rendered.removedProgrammed + rendered.addedProgrammed;
    if (text !== undefined && rendered.deletes > this.rewriteAboveDeletes) {
      const whole = renderChainRules(
        family,
        { entries: [...entries.values()], localPodMatch: before.localPodMatch },
        before.masqueradeMark,
        before.useKubeMarkMasq,
      );
      text = assembleRestore(whole.rules, []);
      programmed = whole.programmed;
    }
    if (text !== undefined) {
      const input = text;
      try {
        await this.exclusive(() => this.commands(family).restore(input));
      } catch (err) {
        this.written.delete(family);
        throw err;
      }
    }
    const gone = new Set(removed.map(entryLabel));
    const rejected = [...before.rejected.filter((r) => !gone.has(r.item)), ...rendered.rejected];
    this.written.set(family, { ...before, entries, programmed, rejected });
    this.reportRejections(family, rejected);
    return text !== undefined;
  }

  /**
   * Our chains and jumps read back and compared with the rules `expected` and `shape` make:
   * 'chains' when our chains differ, else 'jumps' when a jump is not at rule 1.
   * 'alongside-writes': read while our writes go on (a change does not wait for the listing, which
   * takes a few hundred ms at 10,000 entries); a read that one of our writes overlapped, or whose
   * `expected` is not what was last written, is 'unfinished' and the verification is skipped.
   */
  async readBack(
    family: Family,
    expected: readonly Entry[],
    shape: FamilyShape,
    how: 'alongside-writes' | 'between-writes',
  ): Promise<ReadBack | 'unfinished'> {
    const alongside = how === 'alongside-writes';
    const events = this.writeEvents;
    if (alongside && (this.writesUnderWay > 0 || !this.lastWritten(family, expected))) return 'unfinished';
    const commands = this.commands(family);
    const basis = await commands.generation();
    const view = await readVerificationView(commands);
    if (alongside && this.writeEvents !== events) return 'unfinished';
    const settled = basis !== undefined && (await commands.generation()) === basis;
    // KUBE-MARK-MASQ as it is now: kube-proxy may have created it since our chains were written.
    const rules = renderChainRules(
      family,
      { entries: [...expected], localPodMatch: shape.state.localPodMatch },
      shape.masqueradeMark,
      view.chains.has(KUBE_MARK_MASQ),
    );
    const shapeDrift = !chainsHold(view, rules.rules)
      ? ['chains']
      : renderJumpRepairs(view).length > 0
        ? ['jumps']
        : [];
    const read: ReadBack = { missing: [], foreign: [], shapeDrift };
    if (settled) read.generation = basis;
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

  /** Whether `expected` are the entries (by address, protocol and port) our last write of the family left. */
  private lastWritten(family: Family, expected: readonly Entry[]): boolean {
    const keys = this.written.get(family)?.entries;
    if (!keys || keys.size !== expected.length) return false;
    return expected.every((e) => keys.has(flowKey(e)));
  }

  /** Each rejection is logged once, when the set of them for its family changes. */
  private reportRejections(family: Family, rejected: Rejection[]): void {
    const key = JSON.stringify(rejected);
    if (key === (this.reportedRejections.get(family) ?? '[]')) return;
    this.reportedRejections.set(family, key);
    for (const r of rejected) {
      this.options.logger?.warn({ family: r.family, item: r.item, reason: r.reason }, 'Left out of the iptables rules');
    }
  }

  private async removeAll(): Promise<void> {
    await this.jumpGuard?.stop();
    await this.exclusive(async () => {
      this.written.clear();
      for (const family of FAMILIES) await removeIptablesObjects(this.variant, family, this.options.runner);
    });
  }

  /** Stops the jump checks; the rules stay. */
  async close(): Promise<void> {
    await this.jumpGuard?.stop();
  }
}
