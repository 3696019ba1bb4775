// Keeps our jumps at rule 1 of nat PREROUTING and OUTPUT between syncs. kube-proxy (and other
// writers) insert their own jump at rule 1 when they start or find theirs missing; if their
// chain then ACCEPTs the LoadBalancer IP, as kube-proxy's IPVS-mode chains do, our DNAT never
// runs until the next full resync (up to --sync-period). Rule 1 of each hook is looked at once a
// second (iptables-nft: `-S CHAIN 1`, and only when the ruleset generation moved by another
// commit than ours; iptables-legacy: one `-save` per family, paced to its cost); when it is not
// our jump and a rule above ours can take packets away from it (precedence.ts), a restore that
// only moves the jump back (nothing else is written) repairs it. A writer that keeps a harmless jump above ours (a chain that only marks, as
// KUBE-MARK-MASQ, or only returns) is left alone: moving ours back would only start a tug of war.
// It keeps no record of what was written: a family is looked after where the nat table holds our
// entry chains (the kernel says where our jumps belong), and a repair tells the driver the family
// alone (the reconciler knows its entries).

import type { Logger } from 'pino';
import { FAMILIES, type Family } from '../../model/types.js';
import { IptablesCommands, IptablesToolMissing, type IptablesRunner, type IptablesVariant } from './executor.js';
import { JUMPS } from './layout.js';
import { parseNatSave, type NatTableView } from './parse.js';
import { renderJumpRepairs } from './precedence.js';
import { readJumpView } from './nat-view.js';

/**
 * A round takes at most this share of the time: iptables-legacy reads and parses the whole nat
 * table for any listing (about 0.1 s per hook with 10,000 Services), so a large legacy table is
 * checked less often than every second rather than keep a core busy.
 */
const MAX_DUTY_CYCLE = 0.05;

/**
 * iptables-nft: how often the ruleset generation is read (one netlink request, no process). A
 * displacement is a commit, so rule 1 is asked for only when the generation moved: the window in
 * which new connections miss our DNAT shrinks from the interval to about this.
 */
export const GENERATION_POLL_MS = 50;

export interface JumpGuardOptions {
  variant: IptablesVariant;
  /** Between the end of one check and the start of the next (longer when a round is slow). */
  intervalMs: number;
  logger?: Logger;
  /** Runs `work` excluded from the backend's syncs (both write the same rules). */
  exclusive<T>(work: () => Promise<T>): Promise<T>;
  /** Runs the iptables commands; the real ones by default. */
  runner?: IptablesRunner | undefined;
  /**
   * Called after each repair, once the queue of writes is free again: the driver says which
   * translations new connections passed by meanwhile (their flows are forgotten elsewhere, never
   * in the write path).
   */
  onRepair?(family: Family): void;
}

export class JumpGuard {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private stopped = true;
  /** Set by stop(): a round under way ends early and repairs nothing. */
  private closed = false;
  private lastError = '';
  private lastRoundMs = 0;
  /** iptables-nft: the generation at the start of the last full round. */
  private checkedGeneration: number | undefined;
  private lastFullRoundAt = 0;
  private readsGenerations = true;
  repairs = 0;

  constructor(private readonly options: JumpGuardOptions) {}

  get active(): boolean {
    return !this.stopped;
  }

  start(): void {
    if (!this.stopped) return;
    this.stopped = false;
    this.closed = false;
    this.schedule();
  }

  /** Stops checking; waits for a check under way. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    await this.running;
  }

  private schedule(): void {
    if (this.stopped) return;
    const paced = Math.max(this.options.intervalMs, Math.round(this.lastRoundMs * (1 / MAX_DUTY_CYCLE - 1)));
    const delay = this.options.variant === 'nft' && this.readsGenerations ? GENERATION_POLL_MS : paced;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.running = this.checkAll().finally(() => {
        this.running = undefined;
        this.schedule();
      });
    }, delay);
    // The guard alone never keeps the process alive.
    this.timer.unref();
  }

  /**
   * A round when something may have moved our jumps: always for legacy; for iptables-nft when
   * the ruleset generation moved since the last round, or once per interval all the same.
   */
  private async dueRound(): Promise<boolean> {
    if (this.options.variant !== 'nft' || !this.readsGenerations) return true;
    const generation = await new IptablesCommands('nft', 'ipv4', this.options.runner).generation();
    if (generation === undefined) {
      this.readsGenerations = false;
      return true;
    }
    if (generation === this.checkedGeneration && performance.now() - this.lastFullRoundAt < this.options.intervalMs) {
      return false;
    }
    this.checkedGeneration = generation;
    this.lastFullRoundAt = performance.now();
    return true;
  }

  /** One round: every family and hook. Never throws; a failure is logged once until it changes. */
  async checkAll(): Promise<void> {
    try {
      if (!(await this.dueRound())) return;
    } catch {
      // Unreadable this time: look as if it had moved.
    }
    this.lastRoundMs = 0;
    for (const family of FAMILIES) {
      if (this.closed) return;
      try {
        await this.check(family);
        this.lastError = '';
      } catch (err) {
        // A family this variant cannot hold (ip6tables missing) has no jumps of ours to keep.
        if (err instanceof IptablesToolMissing) continue;
        const message = `${family}: ${(err as Error).message}`;
        if (message !== this.lastError) {
          this.options.logger?.warn({ family, err }, 'Failed to check or repair our jumps in nat PREROUTING/OUTPUT');
        }
        this.lastError = message;
      }
    }
  }

  /**
   * Our own commit moved the ruleset generation from `before` to `after` (iptables-nft): a write
   * of ours leaves our jumps first (a whole write repairs them, a partial one does not touch
   * them), so a table checked at `before` needs no round for it.
   */
  ownCommit(before: number, after: number): void {
    if (after === before + 1 && this.checkedGeneration === before) this.checkedGeneration = after;
  }

  /**
   * Whether rule 1 of a hook is not our jump, and, when it is read anyway, the view of the nat
   * table. iptables-nft formats one rule per hook (`-S CHAIN 1`, the chain alone is fetched).
   * iptables-legacy reads the whole table for any listing, and `iptables -S` holds the xtables
   * lock meanwhile (a write of ours or kube-proxy's would wait for it): one `-save` per family,
   * which takes no lock, gives both hooks.
   */
  private async displaced(commands: IptablesCommands): Promise<{ displaced: boolean; view?: NatTableView }> {
    if (this.options.variant === 'legacy') {
      // Looking at a nat table that does not exist would create it: it holds nothing of ours.
      if ((await commands.runner.legacyTables(commands.family))?.has('nat') !== true) return { displaced: false };
      const save = await commands.save('nat');
      const displaced = JUMPS.some(
        ({ from, to }) => firstRuleOf(save, from) !== `-j ${to}` && new RegExp(`^:${to} `, 'm').test(save),
      );
      return displaced ? { displaced, view: parseNatSave(save) } : { displaced };
    }
    for (const { from, to } of JUMPS) {
      // Not ours: rule 1 is another's, and our entry chain exists (undefined: it does not).
      if (
        (await commands.firstRule('nat', from)) !== `-j ${to}` &&
        (await commands.firstRule('nat', to)) !== undefined
      ) {
        return { displaced: true };
      }
    }
    return { displaced: false };
  }

  private async check(family: Family): Promise<void> {
    const commands = new IptablesCommands(this.options.variant, family, this.options.runner);
    const started = performance.now();
    const { displaced, view } = await this.displaced(commands);
    if (!displaced) {
      this.lastRoundMs += performance.now() - started;
      return;
    }
    // Rules above ours that cannot take a packet away from it (precedence.ts) need no repair:
    // judged on a listing outside the queue of writes, which a harmless writer's jump does not hold.
    const needed = renderJumpRepairs(view ?? (await readJumpView(commands))).length > 0;
    // Only the listings count towards the pace: a repair waiting for a long sync is no reason to look less often.
    this.lastRoundMs += performance.now() - started;
    if (!needed) return;
    const repaired = await this.options.exclusive(async () => {
      if (this.closed) return false;
      const view = await readJumpView(commands);
      const repairs = renderJumpRepairs(view);
      if (repairs.length === 0) return false;
      const text = ['*nat', ...repairs, 'COMMIT', ''].join('\n');
      await commands.restore(text);
      this.repairs++;
      return true;
    });
    if (!repaired) return;
    this.options.logger?.info(
      { family },
      'Moved our jump back to rule 1 of nat PREROUTING/OUTPUT, another writer had displaced it',
    );
    this.options.onRepair?.(family);
  }
}

/** The spec of rule 1 of `chain` in `-save` output ('' when it has none), without parsing the rest. */
function firstRuleOf(save: string, chain: string): string {
  return new RegExp(`^-A ${chain}(?: (.*))?$`, 'm').exec(save)?.[1] ?? '';
}
