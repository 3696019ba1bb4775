// The iptables driver's annex of a family (driver.ts, DriverAnnex): what its last write of the
// family tells of the kernel beyond the reconciler's annex of the entries, returned with each
// apply, kept by the reconciler with that annex (and forgotten with it) and handed back with the
// next operation on the family. The driver keeps none between its applies. It holds what a write
// needs and the reconciler's annex does not say:
// - the shape a partial write renders its rules with, KUBE-MARK-MASQ's presence included (a fact
//   of the nat table when the chains were written whole, not of the desired state), and whether
//   the rules carry comments;
// - the entries that have rules, by bucket: a partial write hands over only the entries that go
//   and come, but must know whether a bucket chain is created or emptied, and the entries that
//   stay in a bucket it writes whole (past the bound on deletes), at the cost of the buckets it
//   touches (a walk of the reconciler's entries would cost the table);
// - the Services with source ranges, what their source-range chains hold and their entries with
//   ranges: whether a change creates, rewrites or removes those chains;
// - the entries left out, and the rejections, which the sync result repeats.
// A partial write changes it where the write changed the chains (annexPartialWrite), once the
// kernel took the write.

import type { Entry, LocalPodMatch } from '../../model/types.js';
import { ENTRY_CHAINS, bucketChain, serviceChain, type Bucket } from './layout.js';
import type { RenderedChains } from './render.js';
import { flowKey, type RangedService, type Rejection } from './rules.js';

/** A Service with source ranges as a write left it: what its chains hold, and its entries with ranges by key. */
export interface AnnexedService {
  shared: RangedService;
  entries: Map<string, Entry>;
}

export class IptablesAnnex {
  /** Entries that have rules, by bucket and key; a bucket chain exists while its bucket is here. */
  readonly buckets = new Map<Bucket, Map<string, Entry>>();
  /** Services whose entries with source ranges have rules, by `namespace/name`; their chains exist while they are here. */
  readonly services = new Map<string, AnnexedService>();
  /** Entries left out (a value failed validation), by key. */
  readonly leftOut = new Map<string, Entry>();
  /** Entries that have rules. */
  programmed = 0;

  constructor(
    readonly localPodMatch: LocalPodMatch,
    readonly masqueradeMark: number,
    /** Whether the mark rules jump to KUBE-MARK-MASQ (it existed when the chains were written whole). */
    readonly useKubeMarkMasq: boolean,
    /** Whether the rules carry comments (--iptables-comments). */
    readonly comments: boolean,
    public rejected: Rejection[],
  ) {}

  /** The annex of a whole write of `layout`. */
  static of(
    layout: RenderedChains,
    shape: { localPodMatch: LocalPodMatch; masqueradeMark: number; useKubeMarkMasq: boolean; comments?: boolean },
  ): IptablesAnnex {
    const { localPodMatch, masqueradeMark, useKubeMarkMasq, comments = true } = shape;
    const annex = new IptablesAnnex(localPodMatch, masqueradeMark, useKubeMarkMasq, comments, layout.rejected);
    for (const [bucket, entries] of layout.buckets)
      annex.setBucket(bucket, new Map(entries.map((e) => [flowKey(e), e])));
    for (const [service, { shared, entries }] of layout.services) {
      annex.services.set(service, { shared, entries: new Map(entries.map((e) => [flowKey(e), e])) });
    }
    for (const e of layout.leftOut) annex.leftOut.set(flowKey(e), e);
    return annex;
  }

  /** A Service's entries with source ranges after a write; undefined: its chains were removed. */
  setService(service: string, after: AnnexedService | undefined): void {
    if (after) this.services.set(service, after);
    else this.services.delete(service);
  }

  /** The bucket and source-range chains this annex says exist, in both hooks (whether or not prerouting has them). */
  chainNames(): string[] {
    const names: string[] = [];
    for (const entry of ENTRY_CHAINS) {
      for (const bucket of this.buckets.keys()) names.push(bucketChain(entry, bucket));
      for (const service of this.services.keys()) names.push(serviceChain(entry, service));
    }
    return names;
  }

  /** A bucket's entries after a write; an empty map: the bucket chain was removed. */
  setBucket(bucket: Bucket, entries: Map<string, Entry>): void {
    this.programmed += entries.size - (this.buckets.get(bucket)?.size ?? 0);
    if (entries.size === 0) this.buckets.delete(bucket);
    else this.buckets.set(bucket, entries);
  }
}
