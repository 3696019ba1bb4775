// The iptables driver: chains IPVS_PREROUTING and IPVS_OUTPUT in the nat table of one iptables
// variant (legacy or nft), for IPv4 (iptables) and IPv6 (ip6tables), each write one
// `-restore --noflush` transaction per family; the xtables lock (-w) keeps kube-proxy's own
// restores and ours from interleaving.
//
// - A family written whole declares our chains (so flushes them), writes their rules and repairs
//   the jump rules. With iptables-legacy the whole nat table is read anyway, so a table that
//   already holds exactly our rules is left as it is (no rewrite, counters kept).
// - Element changes are single-rule deletes and appends (render.ts renderPartialRestore).
// - A read back lists our chains and the jumps and names what differs: 'chains' (written whole
//   again) or 'jumps' (moved back to rule 1).
// - With iptables-nft every commit bumps the nf_tables ruleset generation, read around each of
//   ours: the reconciler trusts a family while every commit since it was exact was ours.
// Between syncs a jump guard (jump-guard.ts) keeps our jumps at rule 1 when another writer
// prepends its own.

import { execa } from 'execa';
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
} from '../../reconciler/driver.js';
import { IptablesCommands, type IptablesRunner, type IptablesVariant } from './executor.js';
import { KUBE_MARK_MASQ, OUR_CHAINS, emptyNatTable, parseNatSave, type NatTableView } from './parse.js';
import {
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
   * Deletes the flows a displacement of our jumps left untranslated (forgetUntranslatedFlows);
   * by default the conntrack command with the real iptables commands, nothing with a stand-in runner.
   */
  forgetFlows?: (family: Family, keys: ReadonlySet<string>) => Promise<number>;
}

/** Conntrack entries deleted after one repair at most: the window is short, a flood is not ours to clear. */
const MAX_FORGOTTEN_FLOWS = 512;
const CONNTRACK_TIMEOUT_MS = 5000;
/** `conntrack -L` output read: at most this much (a busy node's table can be far larger). */
const MAX_CONNTRACK_LISTING_BYTES = 32 << 20;
/** An unanswered flow: protocol, original source, destination and ports, then the reply's source. */
const UNREPLIED_FLOW =
  /^(tcp|udp)\s+\d+\s+\d+\s+(?:[A-Z_]+\s+)?src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+) \[UNREPLIED\] src=(\S+) /;

/** How forgetUntranslatedFlows names an (external IP, protocol, port). */
function flowKey(e: Pick<Entry, 'externalIp' | 'protocol' | 'port'>): string {
  return `${e.externalIp} ${e.protocol} ${e.port}`;
}

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
  /** The (external IP, protocol, port) of the entries written (flowKey), for forgetting pinned flows. */
  keys: Set<string>;
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
  /** Writes, removals and jump repairs write the same rules: one at a time. */
  private queue: Promise<unknown> = Promise.resolve();
  private readonly jumpGuard: JumpGuard | undefined;
  /** Our writes under way, and a count that moves as each starts and ends: a read alongside them sees one it overlapped. */
  private writesUnderWay = 0;
  private writeEvents = 0;
  /** Per family, the rejections last logged. */
  private readonly reportedRejections = new Map<Family, string>();

  constructor(
    readonly variant: IptablesVariant,
    private readonly options: IptablesDriverOptions = {},
  ) {
    this.label = `iptables-${variant}`;
    this.capabilities = {
      ordersOwnWrites: true,
      conntrackMatters: true,
      hasGeneration: variant === 'nft',
      atomicWrites: false,
      replacesFamilies: false,
      readsAlongsideWrites: true,
      writesElements: true,
      readsBack: true,
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
        afterRepair: (family) => this.forgetPinnedFlows(family),
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

  /** After our jump was displaced and put back: the flows it left untranslated go (forgetUntranslatedFlows). */
  private async forgetPinnedFlows(family: Family): Promise<void> {
    const keys = this.written.get(family)?.keys;
    if (!keys) return;
    const forget = this.options.forgetFlows ?? (this.options.runner ? undefined : forgetUntranslatedFlows);
    const deleted = forget ? await forget(family, keys).catch(() => 0) : 0;
    if (deleted > 0) {
      this.options.logger?.info(
        { family, deleted },
        'Deleted conntrack entries of connections that started untranslated while our jump was displaced',
      );
    }
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
              await this.forgetPinnedFlows(op.family);
              return true;
            });
            if (repaired) restores++;
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
      keys: new Set(state.entries.map(flowKey)),
      programmed: result.programmed,
      rejected: result.rejected,
    });
    this.reportRejections(family, result.rejected);
    return !result.upToDate;
  }

  /** The rules of the entries that went and came, as one restore; false when no rule changes. */
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
    if (rendered.text !== undefined) {
      const text = rendered.text;
      try {
        await this.exclusive(() => this.commands(family).restore(text));
      } catch (err) {
        this.written.delete(family);
        throw err;
      }
    }
    for (const e of removed) before.keys.delete(flowKey(e));
    for (const e of added) before.keys.add(flowKey(e));
    const gone = new Set(removed.map(entryLabel));
    const rejected = [...before.rejected.filter((r) => !gone.has(r.item)), ...rendered.rejected];
    this.written.set(family, {
      ...before,
      programmed: before.programmed - rendered.removedProgrammed + rendered.addedProgrammed,
      rejected,
    });
    this.reportRejections(family, rejected);
    return rendered.text !== undefined;
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
    const keys = this.written.get(family)?.keys;
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
