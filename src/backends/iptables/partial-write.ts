// A partial write: the entries that went and came -> the lines that change our chains, as one
// `iptables-restore --noflush` transaction, bucket by bucket (layout.ts). Pure.
//
// In a bucket that keeps entries, each rule of an entry that went is deleted by its spec and each
// rule of one that came is appended; a rule both sides render (an entry whose ClusterIP alone
// changed keeps its mark rule) is neither. A bucket that gets its first entry is declared and its
// goto appended to the entry chain; one that loses its last is emptied (declared), its goto
// deleted and the chain removed. Nothing else is declared, so nothing else is flushed and the
// counters of the other rules stay. Rules appended sit at the end of their bucket: the order
// differs from a fresh write, the translations do not.
//
// A `-D` finds its rule by walking its chain (libiptc compares the rules one by one; iptables-nft
// fetches the chain and converts each rule back to compare it), so N deletes cost N walks of the
// chain while writing the chain whole costs one: past a number of deletes in one bucket chain, that
// chain is declared (so flushed) and written whole with the entries that stay and come, in the same
// restore. One transaction either way: packets see the old rules or the new ones.
//
// An entry with source ranges has the same bucket rules whatever its ranges (a goto to its
// Service's source-range chain), so a change of a Service's ranges, which the reconciler hands
// over as every entry of the Service gone and come again, changes none of them: the Service's
// source-range chains alone are written again, declared (so flushed) and filled, one rule per
// range and address. A Service's chains are declared when it gets its first entry with ranges,
// written again when what they hold changes (ranges, ClusterIP, sourcesFromNode, addresses), and
// emptied and removed with its last. Entries of one Service that do not share what its chains
// hold, or a chain name another Service has, are not written here: the plan throws, and the
// family is written whole, which leaves the odd ones out (render.ts).

import { OUTPUT_CHAIN, bucketChain, bucketOf, byBucket, gotoSpec, serviceChain, type Bucket } from './layout.js';
import type { IptablesAnnex, AnnexedService } from './annex.js';
import {
  entryLabel,
  entryProblem,
  entryRules,
  flowKey,
  hooksOf,
  rangedServiceOf,
  rangesProblem,
  ruleContext,
  sameRangedService,
  serviceRules,
  shareRangedService,
  type Rejection,
} from './rules.js';
import type { Entry, Family } from '../../model/types.js';

export interface PartialWrite {
  /** iptables-restore --noflush input; undefined when no rule changes. */
  text: string | undefined;
  /** `-D` lines: rules and gotos deleted by their spec (a chain emptied by declaring it is not counted). */
  deletes: number;
  /** Bucket chains written whole because their deletes went past the bound. */
  rewritten: number;
  /** The buckets the write touches, with their entries after it (empty: the bucket goes). */
  buckets: Map<Bucket, Map<string, Entry>>;
  /** The Services with source ranges the write touches, as it leaves them (undefined: their chains go). */
  services: Map<string, AnnexedService | undefined>;
  /** Source-range chains declared and written (whole) or removed. */
  serviceChains: number;
  /** Keys of removed entries that were left out, and added entries that are. */
  leftOut: { removed: string[]; added: Entry[] };
  /** The family's rejections after the write. */
  rejected: Rejection[];
}

/** Each entry's key, computed once per write: a write of 10,000 entries names each several times. */
type Keys = (e: Entry) => string;

function keysOnce(): Keys {
  const keys = new Map<Entry, string>();
  return (e) => {
    let key = keys.get(e);
    if (key === undefined) keys.set(e, (key = flowKey(e)));
    return key;
  };
}

/** `entries` in the order of their keys. */
function sortedByKey(entries: readonly Entry[], key: Keys): Entry[] {
  return [...entries].sort((a, b) => {
    const ka = key(a);
    const kb = key(b);
    return ka < kb ? -1 : ka > kb ? 1 : 0;
  });
}

/**
 * The write that takes the family from `annex` to `annex` less `removed` plus `added`;
 * `rewriteAboveDeletes`: deletes in one chain past which it is written whole. The order of the
 * lines does not depend on the order of the arrays.
 */
export function planPartialWrite(
  family: Family,
  annex: IptablesAnnex,
  removed: readonly Entry[],
  added: readonly Entry[],
  rewriteAboveDeletes: number,
): PartialWrite {
  const ctx = ruleContext(family, annex.localPodMatch, annex.masqueradeMark, annex.useKubeMarkMasq, annex.comments, []);
  const touched = new Map<Bucket, { gone: Entry[]; come: Entry[] }>();
  const touch = (bucket: Bucket) => {
    let t = touched.get(bucket);
    if (!t) touched.set(bucket, (t = { gone: [], come: [] }));
    return t;
  };
  const leftOut: PartialWrite['leftOut'] = { removed: [], added: [] };
  const rejections: Rejection[] = [];
  const services = new Map<string, { gone: Entry[]; come: Entry[] }>();
  const touchService = (service: string) => {
    let t = services.get(service);
    if (!t) services.set(service, (t = { gone: [], come: [] }));
    return t;
  };
  const keyOf = keysOnce();
  for (const e of sortedByKey(removed, keyOf)) {
    const key = keyOf(e);
    if (annex.leftOut.has(key)) leftOut.removed.push(key);
    else {
      // An entry that cannot have rules and was not left out is not in the kernel either.
      const bucket = entryProblem(family, e) ? undefined : bucketOf(family, e.externalIp);
      if (bucket !== undefined) touch(bucket).gone.push(e);
      if (bucket !== undefined && e.sourceRanges !== undefined) touchService(e.service).gone.push(e);
    }
  }
  for (const e of sortedByKey(added, keyOf)) {
    const problem = entryProblem(family, e);
    if (problem) {
      leftOut.added.push(e);
      rejections.push({ family, item: entryLabel(e), reason: problem });
    } else {
      touch(bucketOf(family, e.externalIp)).come.push(e);
      if (e.sourceRanges !== undefined) touchService(e.service).come.push(e);
    }
  }

  const declare: string[] = [];
  const remove: string[] = [];
  const append: string[] = [];
  const drop: string[] = [];
  let rewritten = 0;
  const buckets = new Map<Bucket, Map<string, Entry>>();
  for (const bucket of [...touched.keys()].sort(byBucket(family))) {
    const { gone, come } = touched.get(bucket)!;
    const before = annex.buckets.get(bucket);
    const after = new Map(before);
    for (const e of gone) after.delete(keyOf(e));
    for (const e of come) after.set(keyOf(e), e);
    buckets.set(bucket, after);
    if (before === undefined && after.size === 0) continue;
    for (const { entry, of } of hooksOf(ctx)) {
      const chain = bucketChain(entry, bucket);
      const rulesOf = (entries: Iterable<Entry>) => [...entries].flatMap((e) => entryRules(ctx, e, of));
      if (before === undefined) {
        declare.push(`:${chain} - [0:0]`);
        append.push(`-A ${entry} ${gotoSpec(family, entry, bucket)}`);
        for (const r of rulesOf(after.values())) append.push(`-A ${chain} ${r}`);
      } else if (after.size === 0) {
        declare.push(`:${chain} - [0:0]`);
        remove.push(`-D ${entry} ${gotoSpec(family, entry, bucket)}`);
        drop.push(`-X ${chain}`);
      } else {
        const { gone: changedGone, come: changedCome } = withoutSameRules(gone, come, keyOf);
        const goneRules = rulesOf(changedGone);
        const comeRules = rulesOf(changedCome);
        const goneSet = new Set(goneRules);
        const comeSet = new Set(comeRules);
        const deletes = goneRules.filter((r) => !comeSet.has(r));
        if (deletes.length > rewriteAboveDeletes) {
          rewritten++;
          declare.push(`:${chain} - [0:0]`);
          for (const r of rulesOf(after.values())) append.push(`-A ${chain} ${r}`);
        } else {
          // One push per line: a bucket may hold more rules than a call can take arguments.
          for (const r of deletes) remove.push(`-D ${chain} ${r}`);
          for (const r of comeRules) if (!goneSet.has(r)) append.push(`-A ${chain} ${r}`);
        }
      }
    }
  }
  const after = planServices(family, annex, services, keyOf);
  let serviceChains = 0;
  for (const [service, { recorded, rewrite }] of after) {
    if (!rewrite) continue;
    for (const { entry, of } of hooksOf(ctx)) {
      const chain = serviceChain(entry, service);
      serviceChains++;
      // Declared: created, or flushed to be written again or removed.
      declare.push(`:${chain} - [0:0]`);
      if (recorded === undefined) drop.push(`-X ${chain}`);
      else for (const r of serviceRules(ctx, recorded.shared, of)) append.push(`-A ${chain} ${r}`);
    }
  }
  const lines = [...declare, ...remove, ...append, ...drop];
  const gone = new Set(removed.map(entryLabel));
  return {
    text: lines.length > 0 ? ['*nat', ...lines, 'COMMIT', ''].join('\n') : undefined,
    deletes: remove.length,
    rewritten,
    buckets,
    services: new Map([...after].map(([service, { recorded }]) => [service, recorded])),
    serviceChains,
    leftOut,
    rejected: [...annex.rejected.filter((r) => !gone.has(r.item)), ...rejections],
  };
}

/**
 * `gone` and `come` without the entries that went and came again with the same bucket rules
 * without rendering them: both with source ranges, of the same Service (their rules go to its
 * chain whatever the ranges). A range edit hands over every entry of the Service so.
 */
function withoutSameRules(gone: Entry[], come: Entry[], keyOf: Keys): { gone: Entry[]; come: Entry[] } {
  const ranged = (e: Entry) => e.sourceRanges !== undefined;
  if (!gone.some(ranged) || !come.some(ranged)) return { gone, come };
  const comeByKey = new Map(come.filter(ranged).map((e) => [keyOf(e), e]));
  const kept = new Set<Entry>();
  const goneLeft = gone.filter((e) => {
    const again = ranged(e) ? comeByKey.get(keyOf(e)) : undefined;
    if (again?.service !== e.service) return true;
    kept.add(again);
    return false;
  });
  return { gone: goneLeft, come: come.filter((e) => !kept.has(e)) };
}

/** Why a partial write cannot be planned: the family is written whole instead. */
export class WholeWriteNeeded extends Error {}

/**
 * The Services whose entries with source ranges went or came, as the write leaves them:
 * `recorded` what the annex keeps (undefined: none left, the chains go), `rewrite` whether
 * their chains are declared (created, or flushed and written again, or removed): not when they
 * hold the same rules as before. Throws WholeWriteNeeded for entries of a Service that do not
 * share what its chains hold, ranges that fail validation, and a chain name another Service has.
 */
function planServices(
  family: Family,
  annex: IptablesAnnex,
  touched: Map<string, { gone: Entry[]; come: Entry[] }>,
  keyOf: Keys,
): Map<string, { recorded: AnnexedService | undefined; rewrite: boolean }> {
  const out = new Map<string, { recorded: AnnexedService | undefined; rewrite: boolean }>();
  let owners: Map<string, string> | undefined;
  for (const service of [...touched.keys()].sort()) {
    const { gone, come } = touched.get(service)!;
    const before = annex.services.get(service);
    const entries = new Map(before?.entries);
    for (const e of gone) entries.delete(keyOf(e));
    if (come.length > 0) {
      const first = come[0]!;
      const stays = entries.values().next();
      const shared =
        come.every((e) => shareRangedService(e, first)) &&
        (stays.done === true || shareRangedService(stays.value, first));
      const problem =
        rangesProblem(family, first.sourceRanges!) ??
        (shared
          ? undefined
          : 'the entries of the Service do not share their source ranges, ClusterIP and sourcesFromNode');
      if (problem) throw new WholeWriteNeeded(`${entryLabel(first)}: ${problem}`);
      if (before === undefined) {
        owners ??= new Map([...annex.services.keys()].map((s) => [serviceChain(OUTPUT_CHAIN, s), s]));
        const chain = serviceChain(OUTPUT_CHAIN, service);
        const owner = owners.get(chain);
        if (owner !== undefined) {
          throw new WholeWriteNeeded(
            `${entryLabel(first)}: its source-range chain ${chain} has the name of ${owner}'s`,
          );
        }
        owners.set(chain, service);
      }
      for (const e of come) entries.set(keyOf(e), e);
    }
    const recorded = entries.size > 0 ? { shared: rangedServiceOf(entries.values()), entries } : undefined;
    if (before === undefined && recorded === undefined) continue;
    const same = before !== undefined && recorded !== undefined && sameRangedService(before.shared, recorded.shared);
    out.set(service, { recorded, rewrite: !same });
  }
  return out;
}

/** Makes `annex` follow a partial write that the kernel took. */
export function annexPartialWrite(annex: IptablesAnnex, write: PartialWrite): void {
  for (const [bucket, entries] of write.buckets) annex.setBucket(bucket, entries);
  for (const [service, after] of write.services) annex.setService(service, after);
  for (const key of write.leftOut.removed) annex.leftOut.delete(key);
  for (const e of write.leftOut.added) annex.leftOut.set(flowKey(e), e);
  annex.rejected = write.rejected;
}
