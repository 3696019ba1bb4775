// The model's record of each Service object: what it asks for (service-rules.ts), derived once per
// object (the caches replace an object when it changes and never modify one), and derived again
// only when an answer it depended on changes.
// One rule reads other Services: an external address that is any Service's ClusterIP is refused.
// The records count ClusterIPs as objects come and go, and note which record looked up which
// address; when an address starts or stops being a ClusterIP, exactly those records are derived
// again, so that the outcome never depends on the order in which Services came.

import { requestContext, type RequestContext } from './request-context.js';
import { creationTime, serviceKey, type Precedence } from './types.js';
import { forEachClusterIp, serviceRequest, type ServiceRequest } from './service-rules.js';
import type { Steps, WorkMeter } from './time-slicing.js';
import type { Entry, ModelConfig, ServiceInfo, Skip } from './types.js';

/** Shared by the many records, keys and claims that have none: an empty array is not free. */
export const NO_SKIPS: Skip[] = Object.freeze([]) as unknown as Skip[];
export const NO_CLAIMS: Claim[] = Object.freeze([]) as unknown as Claim[];

/** One Service's request for one map key (decided between Services in key-contests.ts). */
export interface Claim {
  /** What is programmed while this claim wins: the same object from sync to sync. */
  entry: Entry;
  /**
   * Orders entries by (externalIp numerically, protocol, port); also the key of the claim's
   * contest: it names one map key (an IPv4 address's part is 8 hex digits, an IPv6 one's 32).
   */
  sortKey: string;
  record: ServiceRecord;
}

/** What one Service object asks for. */
export interface ServiceRecord extends Precedence {
  /** The update that last saw this object in the input. */
  seenIn: number;
  /** The object the record was derived from. */
  svc: ServiceInfo;
  /**
   * What it asks for, until its claims are made: then dropped (the claims say it), and derived
   * again from `svc` should the record leave the contests and enter them again.
   */
  request: ServiceRequest | undefined;
  /** Entries asked for, per family. */
  asksIpv4: number;
  asksIpv6: number;
  /** Its claims while it is admitted (programmed but for conflicts); empty while it is not. */
  claims: Claim[];
  /** Within the entries the backend is given; false until decided (capacity.ts). */
  admitted: boolean;
  skips: Skip[];
  /** The overCapacity skip, while the record is not admitted. */
  capacitySkip?: Skip;
  /**
   * The addresses its request looked up (whether each is a ClusterIP): one as itself, more as an
   * array, none (most records) undefined. Kept on the record: a map of records to arrays cost
   * about 90 bytes a Service that looks one up.
   */
  lookedUp: string | string[] | undefined;
}

/** Records that came and went in one update. */
export interface RecordChanges {
  added: ServiceRecord[];
  removed: ServiceRecord[];
}

/** What reading a Service costs, in units of work: its addresses and ports. */
export function fieldsOf(svc: ServiceInfo): number {
  return 1 + (svc.externalIPs?.length ?? 0) + (svc.ingress?.length ?? 0) + (svc.ports?.length ?? 0);
}

/** The records by object, with the ClusterIPs they hold and the addresses they looked up. */
export class ServiceRecords {
  readonly byObject = new Map<ServiceInfo, ServiceRecord>();
  /**
   * How many times each address is a ClusterIP of a record (an object counts its clusterIP and
   * its clusterIPs): an external address that is one is never translated, whichever Service came
   * first. Kept with the records, a change costs what it touches. The RequestContext reads it.
   */
  readonly clusterIps = new Map<string, number>();
  /**
   * The records whose request depends on whether an address is a ClusterIP, by address: the
   * record itself while it is the only one (nearly every address), a set of them beyond (a set
   * of one cost about 150 bytes).
   */
  private readonly lookups = new Map<string, ServiceRecord | Set<ServiceRecord>>();
  private nextSeq = 0;
  /** What the rules read; replaced (with every record forgotten) when the node's addresses change. */
  private context: RequestContext;

  constructor(
    config: ModelConfig,
    private readonly meter: WorkMeter,
  ) {
    this.context = requestContext(config, undefined, [], this.clusterIps);
  }

  /** Forgets every record: each is derived anew with `context` (made with this.clusterIps). */
  reset(context: RequestContext): void {
    this.context = context;
    this.byObject.clear();
    this.clusterIps.clear();
    this.lookups.clear();
  }

  /** Forgets the records of `gone` Services and derives those of `fresh` ones. */
  *replace(gone: ServiceInfo[], fresh: ServiceInfo[], generation: number): Steps<RecordChanges> {
    const removed = gone.map((svc) => {
      const record = this.byObject.get(svc)!;
      this.byObject.delete(svc);
      return record;
    });
    const added: ServiceRecord[] = [];
    for (const svc of fresh) {
      const record = this.derive(svc, generation);
      this.byObject.set(svc, record);
      added.push(record);
      if (this.meter.worked(fieldsOf(svc))) yield;
    }
    return { added, removed };
  }

  /** `seq`: the order of first sight, kept when a record is derived anew from the same object. */
  derive(svc: ServiceInfo, generation: number, seq = this.nextSeq++): ServiceRecord {
    const skips: Skip[] = [];
    const service = serviceKey(svc);
    const lookedUp: string[] = [];
    const request = serviceRequest(svc, this.context, skips, service, lookedUp);
    const record: ServiceRecord = {
      service,
      created: creationTime(svc),
      seq,
      seenIn: generation,
      svc,
      request,
      asksIpv4: request.counts.ipv4,
      asksIpv6: request.counts.ipv6,
      claims: NO_CLAIMS,
      admitted: false,
      // Arrays grown by push keep room for more; a record keeps exact copies.
      skips: skips.length > 0 ? skips.slice() : NO_SKIPS,
      lookedUp: lookedUp.length === 0 ? undefined : lookedUp.length === 1 ? lookedUp[0]! : lookedUp.slice(),
    };
    for (const address of lookedUp) {
      const held = this.lookups.get(address);
      if (held === undefined) this.lookups.set(address, record);
      else if (held instanceof Set) held.add(record);
      else if (held !== record) this.lookups.set(address, new Set([held, record]));
    }
    return record;
  }

  /**
   * What a record asks for, to make its claims: kept since it was derived, or derived again from
   * the same object and context (a new context derives every record anew): the same request,
   * whose skips the record holds already. The record lets it go: its claims say it from now on.
   */
  takeRequest(record: ServiceRecord): ServiceRequest {
    const request = record.request ?? serviceRequest(record.svc, this.context, [], record.service);
    record.request = undefined;
    return request;
  }

  /**
   * Counts the ClusterIPs of the records that come and go, and derives anew exactly the records
   * whose addresses stopped or started being a ClusterIP: those are replaced in `changes` (the
   * old record gone, the new one added), whichever order the Services came in. The records of
   * this change were derived before the count of this change: those that looked up an address
   * whose answer changed are among the ones derived anew.
   */
  *followClusterIps(changes: RecordChanges): Steps<void> {
    /** Whether each counted address was a ClusterIP before this change. */
    const before = new Map<string, boolean>();
    const add = (address: string, by: 1 | -1) => {
      const n = this.clusterIps.get(address) ?? 0;
      if (!before.has(address)) before.set(address, n > 0);
      if (n + by > 0) this.clusterIps.set(address, n + by);
      else this.clusterIps.delete(address);
    };
    for (const record of changes.removed) {
      this.forgetLookups(record);
      forEachClusterIp(record.svc, (address) => add(address, -1));
      if (this.meter.worked()) yield;
    }
    for (const record of changes.added) {
      forEachClusterIp(record.svc, (address) => add(address, 1));
      if (this.meter.worked()) yield;
    }
    const stale = new Set<ServiceRecord>();
    for (const [address, was] of before) {
      if (was === this.clusterIps.has(address)) continue;
      const held = this.lookups.get(address);
      if (held instanceof Set) for (const record of held) stale.add(record);
      else if (held !== undefined) stale.add(held);
    }
    if (stale.size === 0) return;
    // Where each record of this change stands in `added` (the start adds every record).
    const fresh = new Map(changes.added.map((record, i) => [record, i]));
    for (const record of stale) {
      this.forgetLookups(record);
      const derived = this.derive(record.svc, record.seenIn, record.seq);
      this.byObject.set(record.svc, derived);
      const at = fresh.get(record);
      if (at !== undefined) {
        changes.added[at] = derived;
      } else {
        changes.removed.push(record);
        changes.added.push(derived);
      }
      if (this.meter.worked(fieldsOf(record.svc))) yield;
    }
  }

  private forgetLookups(record: ServiceRecord): void {
    const addresses = record.lookedUp;
    if (addresses === undefined) return;
    record.lookedUp = undefined;
    for (const address of typeof addresses === 'string' ? [addresses] : addresses) {
      const held = this.lookups.get(address);
      if (held === record) this.lookups.delete(address);
      else if (held instanceof Set) {
        held.delete(record);
        if (held.size === 1) this.lookups.set(address, held.values().next().value!);
      }
    }
  }
}
