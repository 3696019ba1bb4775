// A family's desired state -> what our chains must hold (layout.ts: entry chains going to bucket
// chains by the destination's last byte; rules.ts: each entry's rules), whether a nat table holds
// exactly that, and the whole write that makes it so: one `iptables-restore --noflush`
// transaction. Pure: the caller passes what the nat table holds now (parse.ts), which decides the
// jump repairs, the bucket chains to remove and whether KUBE-MARK-MASQ can be used.

import { ENTRY_CHAINS, bucketChain, bucketOf, byBucket, gotoSpec, parseBucketChain, type Bucket } from './layout.js';
import { renderJumpRepairs } from './precedence.js';
import { KUBE_MARK_MASQ, emptyNatTable, type NatTableView } from './parse.js';
import {
  asSaved,
  entryLabel,
  entryProblem,
  entryRules,
  hooksOf,
  ruleContext,
  type Rejection,
  type RuleContext,
} from './rules.js';
import type { DesiredState, Entry, Family, FamilyState } from '../../model/types.js';

export interface RenderedChains {
  /**
   * Our chains and their rule specs (without `-A CHAIN`), in the order a whole write declares and
   * fills them: the entry chains (their gotos, by bucket), then the bucket chains.
   */
  chains: Map<string, string[]>;
  /** `-A IPVS_OUTPUT -d 0.0.0.201/0.0.0.255 -g IPVS_OUTPUT_201` lines: the entry chains' gotos. */
  gotos: string[];
  /** `-A IPVS_OUTPUT_201 ...` lines: the bucket chains' rules, the translations. */
  rules: string[];
  /** The entries that have rules, by bucket. */
  buckets: Map<Bucket, Entry[]>;
  /** Entries and matches left out because a value failed validation. */
  rejected: Rejection[];
  /** The entries left out. */
  leftOut: Entry[];
  /** Entries that have rules. */
  programmed: number;
}

/** A family's entries sorted into buckets, and what their rules share. */
interface Sorted {
  family: Family;
  ctx: RuleContext;
  /** The buckets with entries, in the order of their byte. */
  order: Bucket[];
  buckets: Map<Bucket, Entry[]>;
  leftOut: Entry[];
  rejected: Rejection[];
}

function sortEntries(family: Family, state: FamilyState, masqueradeMark: number, useKubeMarkMasq: boolean): Sorted {
  const rejected: Rejection[] = [];
  const leftOut: Entry[] = [];
  const buckets = new Map<Bucket, Entry[]>();
  for (const e of state.entries) {
    const problem = entryProblem(family, e);
    if (problem) {
      rejected.push({ family, item: entryLabel(e), reason: problem });
      leftOut.push(e);
      continue;
    }
    const bucket = bucketOf(family, e.externalIp);
    const list = buckets.get(bucket);
    if (list) list.push(e);
    else buckets.set(bucket, [e]);
  }
  const ctx = ruleContext(family, state.localPodMatch, masqueradeMark, useKubeMarkMasq, rejected);
  return { family, ctx, order: [...buckets.keys()].sort(byBucket(family)), buckets, leftOut, rejected };
}

/**
 * Our chains and their rule specs, one at a time, in the order a whole write declares and fills
 * them: the entry chains (their gotos, by bucket), then the bucket chains of each hook.
 */
function* chainsOf(sorted: Sorted): Generator<[string, string[]]> {
  const { family, ctx, order, buckets } = sorted;
  const hooks = hooksOf(ctx);
  for (const entry of ENTRY_CHAINS) {
    yield [entry, hooks.some((h) => h.entry === entry) ? order.map((b) => gotoSpec(family, entry, b)) : []];
  }
  for (const { entry, of } of hooks) {
    for (const b of order) yield [bucketChain(entry, b), buckets.get(b)!.flatMap((e) => entryRules(ctx, e, of))];
  }
}

/** What our chains must hold for one family. */
export function renderChainRules(
  family: Family,
  state: FamilyState,
  masqueradeMark: number,
  useKubeMarkMasq: boolean,
): RenderedChains {
  const sorted = sortEntries(family, state, masqueradeMark, useKubeMarkMasq);
  const chains = new Map(chainsOf(sorted));
  const lines = (entries: boolean) =>
    [...chains].flatMap(([chain, specs]) =>
      ENTRY_CHAINS.includes(chain) === entries ? specs.map((spec) => `-A ${chain} ${spec}`) : [],
    );
  // The `-A` lines only when asked for: at 10,000 entries another 40,000 strings.
  return {
    chains,
    get gotos() {
      return lines(true);
    },
    get rules() {
      return lines(false);
    },
    buckets: sorted.buckets,
    rejected: sorted.rejected,
    leftOut: sorted.leftOut,
    programmed: state.entries.length - sorted.leftOut.length,
  };
}

/** The part of a rule spec before its target: a MARK rule and its DNAT rule share it. */
function headOf(spec: string): string {
  const at = spec.lastIndexOf(' -j ');
  return at < 0 ? spec : spec.slice(0, at);
}

/**
 * Whether the chains of `layout` are in `current` holding exactly their rules, in any order but
 * each entry's mark rule before its DNAT rule (DNAT ends the walk). Partial writes append, so a
 * chain that went through changes holds the rules of a fresh write in another order: the same
 * translations (the gotos match disjoint bytes; each rule of a bucket one address, protocol and
 * port). A bucket chain of ours that no goto reaches is not looked at: no packet walks it.
 */
export function chainsHold(current: NatTableView, layout: RenderedChains): boolean {
  for (const [chain, specs] of layout.chains) if (!chainHolds(current, chain, specs)) return false;
  return true;
}

/**
 * chainsHold for the chains `state` makes, rendered and compared one chain at a time, `pause()`
 * awaited every few chains: at 10,000 entries the whole comparison takes a few hundred ms of the
 * controller's thread, which a change that comes meanwhile then does not wait for.
 */
export async function stateHeld(
  current: NatTableView,
  family: Family,
  state: FamilyState,
  masqueradeMark: number,
  pause: () => Promise<void>,
): Promise<boolean> {
  const sorted = sortEntries(family, state, masqueradeMark, current.chains.has(KUBE_MARK_MASQ));
  let compared = 0;
  for (const [chain, specs] of chainsOf(sorted)) {
    if (!chainHolds(current, chain, specs)) return false;
    if (++compared % CHAINS_BETWEEN_PAUSES === 0) await pause();
  }
  return true;
}

/** About 2,500 rules at 10,000 one-port entries. */
const CHAINS_BETWEEN_PAUSES = 32;

function chainHolds(current: NatTableView, chain: string, specs: readonly string[]): boolean {
  const held = current.rules.get(chain);
  if (!current.chains.has(chain) || held === undefined || held.length !== specs.length) return false;
  // A chain written whole and not changed since holds the rendered order: no counting needed.
  return specs.every((spec, i) => asSaved(spec) === held[i]) || sameRules(held, specs);
}

/**
 * Whether `held` are `specs` as -save prints them, in another order with each mark rule before its
 * DNAT rule (the node's; a pod's DNAT rule has no mark rule).
 */
function sameRules(held: readonly string[], specs: readonly string[]): boolean {
  const wanted = new Map<string, number>();
  const withMark = new Set<string>();
  for (const spec of specs) {
    const saved = asSaved(spec);
    wanted.set(saved, (wanted.get(saved) ?? 0) + 1);
    if (!saved.includes(' -j DNAT ')) withMark.add(headOf(saved));
  }
  const marked = new Set<string>();
  for (const spec of held) {
    const left = wanted.get(spec);
    if (!left) return false;
    wanted.set(spec, left - 1);
    if (spec.includes(' -j DNAT ')) {
      if (withMark.has(headOf(spec)) && !marked.has(headOf(spec))) return false;
    } else marked.add(headOf(spec));
  }
  return true;
}

/** Bucket chains of ours in `current` that `layout` does not have: a whole write removes them. */
function staleBuckets(current: NatTableView, layout: RenderedChains): string[] {
  return [...current.chains].filter((c) => parseBucketChain(c) !== undefined && !layout.chains.has(c));
}

export interface RenderedFamily extends RenderedChains {
  /** iptables-restore --noflush input. */
  text: string;
  /**
   * The nat table already holds exactly these chains, rules and jumps, and no other bucket chain
   * of ours (known only when `current` lists them all): applying `text` would change nothing but
   * the counters.
   */
  upToDate: boolean;
}

/**
 * The whole write of one family, one transaction: our chains declared (which flushes them;
 * --noflush keeps the rest of the table), the jumps repaired, every rule written, and the bucket
 * chains of ours that `current` lists and the state no longer needs emptied and deleted. From any
 * earlier content of our chains, the flat layout of earlier versions included, packets meet the
 * old rules or the new ones, never none.
 */
export function renderFamilyRestore(
  family: Family,
  state: FamilyState,
  masqueradeMark: number,
  current: NatTableView,
): RenderedFamily {
  const layout = renderChainRules(family, state, masqueradeMark, current.chains.has(KUBE_MARK_MASQ));
  const repairs = renderJumpRepairs(current);
  const stale = staleBuckets(current, layout);
  const lines = [
    '*nat',
    ...[...layout.chains.keys(), ...stale].map((c) => `:${c} - [0:0]`),
    ...repairs,
    ...layout.gotos,
    ...layout.rules,
    ...stale.map((c) => `-X ${c}`),
    'COMMIT',
    '',
  ];
  return {
    ...layout,
    text: lines.join('\n'),
    upToDate: repairs.length === 0 && stale.length === 0 && chainsHold(current, layout),
  };
}

/** Both families as restore input, for --dry-run: assumes a nat table without our chains. */
export function renderDesiredStateRestoreText(
  desired: DesiredState,
  options: { useKubeMarkMasq?: boolean } = {},
): string {
  const current = emptyNatTable();
  if (options.useKubeMarkMasq) current.chains.add(KUBE_MARK_MASQ);
  return (['ipv4', 'ipv6'] as const)
    .map((family) => {
      const r = renderFamilyRestore(family, desired[family], desired.masqueradeMark, current);
      const tool = family === 'ipv4' ? 'iptables-restore' : 'ip6tables-restore';
      const notes = r.rejected.map((x) => `# left out: ${x.item}: ${x.reason}\n`).join('');
      const none = desired[family].localPodMatch;
      const noPrerouting = none.kind === 'none' ? `# no prerouting rules: ${none.reason}\n` : '';
      return `# ${family}: ${tool} --noflush -w\n${noPrerouting}${notes}${r.text}`;
    })
    .join('\n');
}
