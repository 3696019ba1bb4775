// The connections our iptables rules translated, from the kernel's rule counters: a nat chain
// sees a connection's first packet only, so a DNAT rule's packet count is a count of the
// connections it translated. The DNAT rules of our bucket and source-range chains under
// IPVS_PREROUTING count local pods' connections, those under IPVS_OUTPUT the node's.
//
// A rule's counter lives as long as the rule: a restore that declares its chain (a whole write, a
// bucket chain written whole, a Service's source-range chains written again) flushes it, a `-D`
// deletes it. So the total is kept here, per family: the last count read of each rule, and what
// rules that are gone counted (banked). Before each of our restores that flushes or deletes rules
// of ours, their counts are read (within COUNTER_READ_MS; the restore starts once the kernel's
// counts are taken, while the read's output is still coming); once the restore is committed,
// those rules' counts are banked and they count again from 0. A read between our writes that finds a
// rule gone, or counting less than it did, banks its last count (someone else's flush or -Z).
// The total never decreases within a process; what it can miss is described in docs/iptables.md.

import type { TranslatedConnections, TranslatedSource } from '../../driver/driver.js';
import { FAMILIES, type Family } from '../../model/types.js';
import type { IptablesCommands } from './executor.js';
import { PREROUTING_CHAIN, parseBucketChain } from './layout.js';
import { savedSpec } from './parse.js';

/** How long one read of a family's counters may take: a read still running then is given up. */
export const COUNTER_READ_MS = 2_000;

/** Chains a partial write's read lists one by one (iptables-nft), above which one `-save -c` reads them all. */
const MAX_LISTED_CHAINS = 16;

/** One DNAT rule's count, by `CHAIN SPEC` (the spec as -save prints it without its counters). */
export interface RuleCount {
  chain: string;
  source: TranslatedSource;
  packets: number;
}
export type RuleCounts = Map<string, RuleCount>;

/** Whose connections a chain of ours translates; undefined for a chain with no translations (entry chains, others'). */
export function sourceOfChain(chain: string): TranslatedSource | undefined {
  const bucket = parseBucketChain(chain);
  if (bucket) return bucket.entry === PREROUTING_CHAIN ? 'pods' : 'node';
  if (/^IPVS_PRE_SR_[A-Z2-7]{16}$/.test(chain)) return 'pods';
  if (/^IPVS_OUT_SR_[A-Z2-7]{16}$/.test(chain)) return 'node';
  return undefined;
}

function addCount(counts: RuleCounts, chain: string, spec: string, packets: number): void {
  const source = sourceOfChain(chain);
  if (source === undefined || !/(^|\s)-j DNAT\s/.test(spec)) return;
  const key = `${chain} ${savedSpec(chain, spec)}`;
  // Two rules of one spec in a chain (never ours) count together.
  const held = counts.get(key);
  counts.set(key, { chain, source, packets: packets + (held?.packets ?? 0) });
}

/**
 * The counts of our DNAT rules in `-save -c -t nat` output (`[PACKETS:BYTES] -A CHAIN SPEC`);
 * `chains`: of the rules of those chains only (the others' lines are passed over unparsed).
 */
export function parseSavedCounts(saveOutput: string, chains?: ReadonlySet<string>): RuleCounts {
  const counts: RuleCounts = new Map();
  let inNat = false;
  for (const line of saveOutput.split('\n')) {
    if (line.startsWith('*')) inNat = line === '*nat';
    if (!inNat || !line.startsWith('[')) continue;
    if (chains) {
      const at = line.indexOf('] -A ') + 5;
      if (at < 5 || !chains.has(line.slice(at, line.indexOf(' ', at)))) continue;
    }
    const m = /^\[(\d+):\d+\] -A (\S+) (.*)$/.exec(line);
    if (m) addCount(counts, m[2]!, m[3]!, Number(m[1]));
  }
  return counts;
}

/** The counts of our DNAT rules in `iptables -t nat -S CHAIN -v` lines (`-c PACKETS BYTES` before the target). */
export function parseListedCounts(lines: readonly string[]): RuleCounts {
  const counts: RuleCounts = new Map();
  for (const line of lines) {
    const m = /^-A (\S+) (.*?) -c (\d+) \d+( -[jg] .*)$/.exec(line);
    if (m) addCount(counts, m[1]!, `${m[2]!}${m[4]!}`, Number(m[3]));
  }
  return counts;
}

/** What a restore does to counted rules: the chains it declares (so flushes) and the rules it deletes, by key. */
export function flushedBy(restoreText: string): { chains: Set<string>; deleted: Set<string> } {
  const chains = new Set<string>();
  const deleted = new Set<string>();
  for (const line of restoreText.split('\n')) {
    if (line.startsWith(':')) {
      const chain = line.slice(1).split(' ', 1)[0]!;
      if (sourceOfChain(chain)) chains.add(chain);
    } else if (line.startsWith('-D ')) {
      const space = line.indexOf(' ', 3);
      const chain = line.slice(3, space);
      if (space > 0 && sourceOfChain(chain)) deleted.add(`${chain} ${savedSpec(chain, line.slice(space + 1))}`);
    }
  }
  return { chains, deleted };
}

/** One family's total: the last count of each rule read, and what rules now gone or flushed counted. */
export class TranslationLedger {
  private readonly banked: Record<TranslatedSource, number> = { pods: 0, node: 0 };
  private readonly last = new Map<string, RuleCount>();
  private read = false;

  /**
   * A read of the counters, of all our chains or (`scope`) of those chains only: a rule of the
   * scope that is gone, or counts less than last read, was flushed meanwhile: its last count is banked.
   */
  observe(counts: RuleCounts, scope?: ReadonlySet<string>): void {
    for (const [key, was] of this.last) {
      if (scope && !scope.has(was.chain)) continue;
      const now = counts.get(key);
      if (now === undefined || now.packets < was.packets) {
        this.banked[was.source] += was.packets;
        this.last.delete(key);
      }
    }
    for (const [key, now] of counts) this.last.set(key, now);
    this.read = true;
  }

  /** After a restore committed: the rules it flushed or deleted (flushedBy) count from 0 again. */
  wrote({ chains, deleted }: { chains: ReadonlySet<string>; deleted: ReadonlySet<string> }): void {
    if (chains.size === 0 && deleted.size === 0) return;
    for (const [key, was] of this.last) {
      if (!chains.has(was.chain) && !deleted.has(key)) continue;
      this.banked[was.source] += was.packets;
      this.last.delete(key);
    }
  }

  /** After our rules were all removed (--cleanup). */
  removedAll(): void {
    for (const was of this.last.values()) this.banked[was.source] += was.packets;
    this.last.clear();
  }

  /** The connections translated, by source; undefined before the first read. */
  totals(): Record<TranslatedSource, number> | undefined {
    if (!this.read) return undefined;
    const totals = { ...this.banked };
    for (const r of this.last.values()) totals[r.source] += r.packets;
    return totals;
  }
}

/**
 * The counts of our DNAT rules now: `chains` only, one listing each (iptables-nft, a few), or read
 * with one `-save -c -t nat` (of those chains only when named); a legacy nat table that does not
 * exist holds none (a listing would create it). The scope read, undefined: all our chains.
 * `onRead`: called once the kernel's counts have been taken, which for a `-save` is before its
 * output has all come and been parsed; not called when the read ends first (or fails).
 */
async function readCounts(
  commands: IptablesCommands,
  chains?: readonly string[],
  onRead?: () => void,
): Promise<{ counts: RuleCounts; scope?: Set<string> }> {
  if (commands.variant === 'nft' && chains !== undefined && chains.length <= MAX_LISTED_CHAINS) {
    const counts: RuleCounts = new Map();
    for (const chain of chains) {
      for (const [key, c] of parseListedCounts((await commands.listCounted(chain, COUNTER_READ_MS)) ?? [])) {
        counts.set(key, c);
      }
    }
    return { counts, scope: new Set(chains) };
  }
  if (commands.variant === 'legacy' && !(await commands.runner.legacyTables(commands.family))?.has('nat')) {
    return { counts: new Map() };
  }
  const scope = chains === undefined ? undefined : new Set(chains);
  const counts = parseSavedCounts(await commands.saveCounted(COUNTER_READ_MS, onRead), scope);
  return scope === undefined ? { counts } : { counts, scope };
}

/** The driver's translation counts, per family: read when scraped, and kept across its own restores. */
export class TranslationCounter {
  private readonly ledgers = new Map<Family, TranslationLedger>();

  constructor(
    private readonly commands: (family: Family) => IptablesCommands,
    /** Moves as each of the driver's writes starts and ends; undefined while one is under way. */
    private readonly writeMark: () => number | undefined,
  ) {}

  private ledger(family: Family): TranslationLedger {
    let ledger = this.ledgers.get(family);
    if (!ledger) this.ledgers.set(family, (ledger = new TranslationLedger()));
    return ledger;
  }

  /**
   * Restores `text` (in the driver's write turn), the counts of the rules it flushes or deletes
   * read first when their chains may hold any (`existing`: the chains that exist); a read that
   * fails or takes too long loses what they counted since the last read. The restore starts as
   * soon as the kernel's counts are taken: a `-save`'s formatting and the parse of its output run
   * beside it, off the write's path (what is counted between the two is lost, as it was while a
   * read ran before the restore: a window of the restore's start-up).
   */
  async restore(commands: IptablesCommands, text: string, existing: ReadonlySet<string>): Promise<void> {
    const ledger = this.ledger(commands.family);
    const flushed = flushedBy(text);
    const { chains, deleted } = flushed;
    const touched = new Set([...chains, ...[...deleted].map((key) => key.slice(0, key.indexOf(' ')))]);
    const read = [...touched].filter((c) => existing.has(c));
    if (read.length === 0) {
      await commands.restore(text);
      ledger.wrote(flushed);
      return;
    }
    let taken!: () => void;
    const countsTaken = new Promise<void>((resolve) => (taken = resolve));
    const reading = readCounts(commands, read, taken).finally(taken);
    const restoring = countsTaken.then(() => commands.restore(text));
    const [counts, restored] = await Promise.allSettled([reading, restoring]);
    // A failed read: what these rules counted since the last read is lost (banked as last read, below).
    if (counts.status === 'fulfilled') ledger.observe(counts.value.counts, counts.value.scope);
    if (restored.status === 'rejected') throw restored.reason;
    ledger.wrote(flushed);
  }

  /** Before our objects are removed: what they counted is read and banked. */
  async removeAll(family: Family, remove: () => Promise<void>): Promise<void> {
    const ledger = this.ledger(family);
    try {
      ledger.observe((await readCounts(this.commands(family))).counts);
    } catch {
      // Banked as last read.
    }
    await remove();
    ledger.removedAll();
  }

  /**
   * Each family's totals: its counters read (without holding back writes); a read one of our
   * writes overlapped is not taken (what the write flushed would count twice), the totals as
   * last read are; a family whose counters were never read is left out.
   */
  async read(): Promise<TranslatedConnections[]> {
    const rows: TranslatedConnections[] = [];
    for (const family of FAMILIES) {
      const ledger = this.ledger(family);
      const before = this.writeMark();
      try {
        const { counts } = await readCounts(this.commands(family));
        if (before !== undefined && this.writeMark() === before) ledger.observe(counts);
      } catch {
        // The totals as last read, if any.
      }
      const totals = ledger.totals();
      if (!totals) continue;
      for (const source of ['pods', 'node'] as const) rows.push({ family, source, connections: totals[source] });
    }
    return rows;
  }
}
