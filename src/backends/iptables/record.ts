// What the driver last wrote of a family, beside the reconciler's own record of the entries. It
// keeps only what a write needs and the reconciler does not hand it:
// - the shape a partial write renders its rules with, KUBE-MARK-MASQ's presence included (a fact
//   of the nat table when the chains were written whole, not of the desired state);
// - the entries that have rules, by bucket: a partial write hands over only the entries that go
//   and come, but must know whether a bucket chain is created or emptied, and the entries that
//   stay in a bucket it writes whole (past the bound on deletes);
// - the Services with source ranges, what their source-range chains hold and their entries with
//   ranges: whether a change creates, rewrites or removes those chains;
// - the entries left out, and the rejections, which the sync result repeats;
// and serves the jump guard, which runs outside the reconciler's syncs: the translations a
// displaced jump may have let new connections pass by.

import type { Entry, LocalPodMatch } from '../../model/types.js';
import { ENTRY_CHAINS, bucketChain, serviceChain, type Bucket } from './layout.js';
import type { RenderedChains } from './render.js';
import { flowKey, type RangedService, type Rejection } from './rules.js';

/** A Service with source ranges as a write left it: what its chains hold, and its entries with ranges by key. */
export interface RecordedService {
  shared: RangedService;
  entries: Map<string, Entry>;
}

export class FamilyRecord {
  /** Entries that have rules, by bucket and key; a bucket chain exists while its bucket is here. */
  readonly buckets = new Map<Bucket, Map<string, Entry>>();
  /** Services whose entries with source ranges have rules, by `namespace/name`; their chains exist while they are here. */
  readonly services = new Map<string, RecordedService>();
  /** Entries left out (a value failed validation), by key. */
  readonly leftOut = new Map<string, Entry>();
  /** Entries that have rules. */
  programmed = 0;

  constructor(
    readonly localPodMatch: LocalPodMatch,
    readonly masqueradeMark: number,
    /** Whether the mark rules jump to KUBE-MARK-MASQ (it existed when the chains were written whole). */
    readonly useKubeMarkMasq: boolean,
    public rejected: Rejection[],
  ) {}

  /** The record of a whole write of `layout`. */
  static of(
    layout: RenderedChains,
    shape: { localPodMatch: LocalPodMatch; masqueradeMark: number; useKubeMarkMasq: boolean },
  ): FamilyRecord {
    const record = new FamilyRecord(shape.localPodMatch, shape.masqueradeMark, shape.useKubeMarkMasq, layout.rejected);
    for (const [bucket, entries] of layout.buckets)
      record.setBucket(bucket, new Map(entries.map((e) => [flowKey(e), e])));
    for (const [service, { shared, entries }] of layout.services) {
      record.services.set(service, { shared, entries: new Map(entries.map((e) => [flowKey(e), e])) });
    }
    for (const e of layout.leftOut) record.leftOut.set(flowKey(e), e);
    return record;
  }

  /** A Service's entries with source ranges after a write; undefined: its chains were removed. */
  setService(service: string, after: RecordedService | undefined): void {
    if (after) this.services.set(service, after);
    else this.services.delete(service);
  }

  /** The bucket and source-range chains this record says exist, in both hooks (whether or not prerouting has them). */
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

  /** The entries that have rules. */
  programmedEntries(): Entry[] {
    return [...this.buckets.values()].flatMap((entries) => [...entries.values()]);
  }

  /** Whether `expected` are the entries (by address, protocol and port) this record was written with. */
  holds(expected: readonly Entry[], bucketOf: (e: Entry) => Bucket): boolean {
    if (expected.length !== this.programmed + this.leftOut.size) return false;
    return expected.every((e) => {
      const key = flowKey(e);
      if (this.leftOut.has(key)) return true;
      return this.buckets.get(bucketOf(e))?.has(key) === true;
    });
  }
}
