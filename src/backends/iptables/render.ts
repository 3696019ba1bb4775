// A family's desired state -> what our chains must hold (layout.ts: entry chains going to bucket
// chains by the destination's last byte; rules.ts: each entry's rules), whether a nat table holds
// exactly that, and the whole write that makes it so: one `iptables-restore --noflush`
// transaction. Pure: the caller passes what the nat table holds now (parse.ts), which decides the
// jump repairs, the bucket chains to remove and whether KUBE-MARK-MASQ can be used.

import {
  ENTRY_CHAINS,
  OUTPUT_CHAIN,
  bucketChain,
  bucketOf,
  byBucket,
  gotoSpec,
  isServiceChain,
  parseBucketChain,
  serviceChain,
  type Bucket,
} from './layout.js';
import { renderJumpRepairs, targetOf } from './precedence.js';
import { KUBE_MARK_MASQ, emptyNatTable, type NatTableView } from './parse.js';
import {
  asSaved,
  entryLabel,
  entryProblem,
  entryRules,
  flowKey,
  hooksOf,
  rangedServiceOf,
  rangesProblem,
  ruleContext,
  serviceRules,
  shareRangedService,
  type RangedService,
  type Rejection,
  type RuleContext,
} from './rules.js';
import type { DesiredState, Entry, Family, FamilyState } from '../../model/types.js';

/** A Service with source ranges in a family: what its source-range chains hold, and its entries that have rules. */
export interface ServiceRanges {
  shared: RangedService;
  entries: Entry[];
}

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
  /** The Services whose entries with source ranges have rules, by `namespace/name`. */
  services: Map<string, ServiceRanges>;
  /** Entries and matches left out because a value failed validation. */
  rejected: Rejection[];
  /** The entries left out. */
  leftOut: Entry[];
  /** Entries that have rules. */
  programmed: number;
}

/** A family's entries sorted into buckets and Services, and what their rules share. */
interface Sorted {
  family: Family;
  ctx: RuleContext;
  /** The buckets with entries, in the order of their byte. */
  order: Bucket[];
  buckets: Map<Bucket, Entry[]>;
  /** In the order of their name. */
  services: Map<string, ServiceRanges>;
  leftOut: Entry[];
  rejected: Rejection[];
}

function byFlowKey(a: Entry, b: Entry): number {
  const ka = flowKey(a);
  const kb = flowKey(b);
  return ka < kb ? -1 : ka > kb ? 1 : 0;
}

/**
 * The entries with source ranges of each Service that can have rules, the others rejected: every
 * entry of a Service shares its ranges, ClusterIP and sourcesFromNode (the model's contract),
 * so one that does not (compared with its Service's first entry by key) is left out, as are all
 * of a Service whose ranges fail validation or whose chain name another Service (first by name)
 * already has.
 */
function sortServices(
  family: Family,
  groups: Map<string, Entry[]>,
  reject: (e: Entry, reason: string) => void,
): Map<string, ServiceRanges> {
  const services = new Map<string, ServiceRanges>();
  const owners = new Map<string, string>();
  for (const service of [...groups.keys()].sort()) {
    const group = groups.get(service)!;
    const first = group.reduce((a, b) => (byFlowKey(b, a) < 0 ? b : a));
    const chain = serviceChain(OUTPUT_CHAIN, service);
    const owner = owners.get(chain);
    const problem =
      owner !== undefined
        ? `its source-range chain ${chain} has the name of ${owner}'s`
        : rangesProblem(family, first.sourceRanges!);
    const entries: Entry[] = [];
    for (const e of group) {
      if (problem) reject(e, problem);
      else if (!shareRangedService(e, first)) {
        reject(e, `its source ranges, ClusterIP or sourcesFromNode differ from those of ${entryLabel(first)}`);
      } else entries.push(e);
    }
    if (entries.length === 0) continue;
    owners.set(chain, service);
    services.set(service, { shared: rangedServiceOf(entries), entries });
  }
  return services;
}

/** How a family's rules are written beyond its state: the mark's target, and the comments. */
interface RuleShape {
  /** The mark rules jump to KUBE-MARK-MASQ (it exists in the nat table). */
  useKubeMarkMasq: boolean;
  /** Each rule commented with its Service's `namespace/name` (--iptables-comments; default true). */
  comments?: boolean;
}

function sortEntries(family: Family, state: FamilyState, masqueradeMark: number, shape: RuleShape): Sorted {
  const rejected: Rejection[] = [];
  const leftOut = new Set<Entry>();
  const reject = (e: Entry, reason: string) => {
    rejected.push({ family, item: entryLabel(e), reason });
    leftOut.add(e);
  };
  const groups = new Map<string, Entry[]>();
  for (const e of state.entries) {
    const problem = entryProblem(family, e);
    if (problem) reject(e, problem);
    else if (e.sourceRanges !== undefined) {
      const group = groups.get(e.service);
      if (group) group.push(e);
      else groups.set(e.service, [e]);
    }
  }
  const services = groups.size > 0 ? sortServices(family, groups, reject) : new Map<string, ServiceRanges>();
  const buckets = new Map<Bucket, Entry[]>();
  for (const e of state.entries) {
    if (leftOut.has(e)) continue;
    const bucket = bucketOf(family, e.externalIp);
    const list = buckets.get(bucket);
    if (list) list.push(e);
    else buckets.set(bucket, [e]);
  }
  const { useKubeMarkMasq, comments = true } = shape;
  const ctx = ruleContext(family, state.localPodMatch, masqueradeMark, useKubeMarkMasq, comments, rejected);
  const order = [...buckets.keys()].sort(byBucket(family));
  return { family, ctx, order, buckets, services, leftOut: [...leftOut], rejected };
}

/** The names of the chains `sorted` makes, in the order chainsOf yields them. */
function* chainNamesOf(sorted: Sorted): Generator<string> {
  const hooks = hooksOf(sorted.ctx);
  yield* ENTRY_CHAINS;
  for (const { entry } of hooks) for (const b of sorted.order) yield bucketChain(entry, b);
  for (const { entry } of hooks) for (const service of sorted.services.keys()) yield serviceChain(entry, service);
}

/**
 * Our chains and their rule specs, one at a time, in the order a whole write declares and fills
 * them: the entry chains (their gotos, by bucket), then the bucket chains of each hook, then the
 * source-range chains of each hook (by Service).
 */
function* chainsOf(sorted: Sorted): Generator<[string, string[]]> {
  const { family, ctx, order, buckets, services } = sorted;
  const hooks = hooksOf(ctx);
  for (const entry of ENTRY_CHAINS) {
    yield [entry, hooks.some((h) => h.entry === entry) ? order.map((b) => gotoSpec(family, entry, b)) : []];
  }
  for (const { entry, of } of hooks) {
    for (const b of order) yield [bucketChain(entry, b), buckets.get(b)!.flatMap((e) => entryRules(ctx, e, of))];
  }
  for (const { entry, of } of hooks) {
    for (const [service, { shared }] of services) yield [serviceChain(entry, service), serviceRules(ctx, shared, of)];
  }
}

/** What our chains must hold for one family. */
export function renderChainRules(
  family: Family,
  state: FamilyState,
  masqueradeMark: number,
  useKubeMarkMasq: boolean,
  comments = true,
): RenderedChains {
  const sorted = sortEntries(family, state, masqueradeMark, { useKubeMarkMasq, comments });
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
    services: sorted.services,
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
 * Whether the chains of `layout` are in `current` holding exactly their rules. A bucket chain in
 * any order but each entry's mark rule before its DNAT rule (DNAT ends the walk): partial writes
 * append, so a chain that went through changes holds the rules of a fresh write in another order,
 * the same translations (the gotos match disjoint bytes; each rule of a bucket one address,
 * protocol and port). A source-range chain, always written whole, in its order: a RETURN of the
 * address itself must come before the range that holds it. A chain of ours that nothing of
 * `layout` reaches is not looked at here (no packet walks it): strayChains names those.
 */
export function chainsHold(current: NatTableView, layout: RenderedChains): boolean {
  for (const [chain, specs] of layout.chains) if (!chainHolds(current, chain, specs)) return false;
  return true;
}

/**
 * Whether the chains `state` makes are in `current` (chainsHold), rendered and compared one
 * chain at a time, `pause()` awaited every few chains: at 10,000 entries the whole comparison
 * takes a few hundred ms of the controller's thread, which a change that comes meanwhile then
 * does not wait for. `strays`: the chains of ours in `current` that `state` does not make and a
 * whole write can remove (strayChains).
 */
export async function compareState(
  current: NatTableView,
  family: Family,
  state: FamilyState,
  masqueradeMark: number,
  pause: () => Promise<void>,
  comments = true,
): Promise<{ held: boolean; strays: string[] }> {
  const shape = { useKubeMarkMasq: current.chains.has(KUBE_MARK_MASQ), comments };
  const sorted = sortEntries(family, state, masqueradeMark, shape);
  const strays = strayChains(current, new Set(chainNamesOf(sorted)));
  let compared = 0;
  for (const [chain, specs] of chainsOf(sorted)) {
    if (!chainHolds(current, chain, specs)) return { held: false, strays };
    if (++compared % CHAINS_BETWEEN_PAUSES === 0) await pause();
  }
  return { held: true, strays };
}

/** About 2,500 rules at 10,000 one-port entries. */
const CHAINS_BETWEEN_PAUSES = 32;

function chainHolds(current: NatTableView, chain: string, specs: readonly string[]): boolean {
  const held = current.rules.get(chain);
  if (!current.chains.has(chain) || held === undefined || held.length !== specs.length) return false;
  // A chain written whole and not changed since holds the rendered order: no counting needed.
  if (specs.every((spec, i) => asSaved(spec) === held[i])) return true;
  return !isServiceChain(chain) && sameRules(held, specs);
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

/**
 * Bucket and source-range chains of ours in `current` that `needed` does not have: a whole write
 * empties and deletes them. Those another chain still jumps to are left (deleting a chain that a
 * rule names fails the whole restore): a chain that is neither ours to delete nor one the write
 * declares (so flushes), another writer's say, or one of ours left for that reason. A chain
 * `current` lists without its rules (iptables-nft reads a few) is taken to name none.
 */
export function strayChains(current: NatTableView, needed: ReadonlySet<string>): string[] {
  const stray = new Set(
    [...current.chains].filter((c) => (parseBucketChain(c) !== undefined || isServiceChain(c)) && !needed.has(c)),
  );
  for (let kept = stray.size > 0; kept;) {
    kept = false;
    for (const [chain, specs] of current.rules) {
      if (stray.has(chain) || needed.has(chain)) continue;
      for (const spec of specs) {
        const target = targetOf(spec)?.name;
        if (target !== undefined && stray.delete(target)) kept = true;
      }
    }
  }
  return [...stray];
}

export interface RenderedFamily extends RenderedChains {
  /** iptables-restore --noflush input. */
  text: string;
  /**
   * The nat table already holds exactly these chains, rules and jumps, and no other bucket or
   * source-range chain of ours (known only when `current` lists them all): applying `text` would change nothing but
   * the counters.
   */
  upToDate: boolean;
}

/**
 * The whole write of one family, one transaction: our chains declared (which flushes them;
 * --noflush keeps the rest of the table), the jumps repaired, every rule written, and the bucket
 * and source-range chains of ours that `current` lists and the state no longer needs emptied and
 * deleted (strayChains). From any
 * earlier content of our chains, the flat layout of earlier versions included, packets meet the
 * old rules or the new ones, never none.
 */
export function renderFamilyRestore(
  family: Family,
  state: FamilyState,
  masqueradeMark: number,
  current: NatTableView,
  comments = true,
): RenderedFamily {
  const layout = renderChainRules(family, state, masqueradeMark, current.chains.has(KUBE_MARK_MASQ), comments);
  const repairs = renderJumpRepairs(current);
  const stale = strayChains(current, new Set(layout.chains.keys()));
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
  options: { useKubeMarkMasq?: boolean; comments?: boolean } = {},
): string {
  const current = emptyNatTable();
  if (options.useKubeMarkMasq) current.chains.add(KUBE_MARK_MASQ);
  return (['ipv4', 'ipv6'] as const)
    .map((family) => {
      const r = renderFamilyRestore(family, desired[family], desired.masqueradeMark, current, options.comments);
      const tool = family === 'ipv4' ? 'iptables-restore' : 'ip6tables-restore';
      const notes = r.rejected.map((x) => `# left out: ${x.item}: ${x.reason}\n`).join('');
      const none = desired[family].localPodMatch;
      const noPrerouting = none.kind === 'none' ? `# no prerouting rules: ${none.reason}\n` : '';
      return `# ${family}: ${tool} --noflush -w\n${noPrerouting}${notes}${r.text}`;
    })
    .join('\n');
}
