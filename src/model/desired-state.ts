// The model: Services + this Node + config -> DesiredState. No I/O.
// The rules for one Service are in service-rules.ts, local-pod detection in local-pods.ts.
//
// DesiredStateModel keeps the result between syncs so that a change costs what it touches, not
// what the cluster holds: a Service's request and skips are derived once per object (the caches
// replace an object when it changes and never modify one), and only the map keys claimed by
// changed Services are decided again. buildDesiredState is the same computation from nothing.
// One rule reads other Services: an external address that is any Service's ClusterIP is refused.
// The model counts ClusterIPs as records come and go, and notes which records looked up which
// address; when an address starts or stops being a ClusterIP, exactly those records are derived
// again, so that the outcome never depends on the order in which Services came.
//
// Every step is linear (or n log n) in what one Service asks for, and what one Service may ask
// for is bounded: past --max-entries-per-service it is skipped whole, and Services that do not fit
// in the entries the backend is given (--max-entries) are skipped whole, the youngest first (the
// order that settles conflicts). Entries are made only for Services that are programmed.
// update() runs to the end at once; updateCooperatively() gives the event loop a turn every few
// milliseconds, so that /healthz and the watches are served while a large change is derived.

import { ipSortKey } from './ip.js';
import { localPodMatch } from './local-pods.js';
import { orderedChanges } from './ordered-changes.js';
import {
  creationTime,
  flat,
  forEachClusterIp,
  precedes,
  requestContext,
  serviceKey,
  serviceRequest,
  type Precedence,
  type RequestContext,
  type ServiceRequest,
} from './service-rules.js';
import { compareKeys, SortedEntries } from './sorted-entries.js';
import { FAMILIES } from './types.js';
import type {
  Conflict,
  ChangeTracked,
  DesiredState,
  Entry,
  Family,
  FamilyState,
  ModelConfig,
  NodeInfo,
  ServiceInfo,
  Skip,
} from './types.js';

export { serviceKey };

/** Shared by the many records, keys and claims that have none: an empty array is not free. */
const NO_SKIPS: Skip[] = Object.freeze([]) as unknown as Skip[];
const NO_LOSERS: string[] = Object.freeze([]) as unknown as string[];

/** Computes what must be programmed. Output order is deterministic whatever the input order. */
export function buildDesiredState(
  services: Iterable<ServiceInfo>,
  node: NodeInfo | undefined,
  config: ModelConfig,
): DesiredState {
  // Built from nothing, outside any model's sequence: without a generation, which the
  // reconciler takes for the newest state (a tool's or a test's state, given in any order).
  const { generation: _generation, ...state } = new DesiredStateModel(config).update(services, node);
  return state;
}

/** One Service's request for one map key. */
interface Claim {
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
interface ServiceRecord extends Precedence {
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
  /** Within the entries the backend is given; false until decided. */
  admitted: boolean;
  skips: Skip[];
  /** The overCapacity skip, while the record is not admitted. */
  capacitySkip?: Skip;
}

/**
 * Every claim on a map key several Services claim, and who holds it. A key one Service claims
 * (nearly every key) has no contest: the claim stands for itself, its own winner.
 */
class Contest {
  winner: Claim | undefined = undefined;
  /** Services that claim the key and lose, sorted. */
  losers: string[] = NO_LOSERS;

  constructor(readonly claims: Claim[]) {}
}

/** Above this many changed keys, merging them in one pass beats inserting one by one. */
const BULK_CHANGES = 64;
/** Units of work (claims, records, keys) between looks at the clock in a cooperative update. */
const WORK_PER_LOOK = 2048;
/** A cooperative update gives the event loop a turn after this much work. */
const SLICE_MS = 10;

const NO_CLAIMS: Claim[] = Object.freeze([]) as unknown as Claim[];

/** A step of the computation: yields where it may pause, returns its result. */
type Steps<T> = Generator<void, T, void>;

/** The last generation given to any state in this process. */
let lastGeneration = 0;

/**
 * The next generation, after `after` and after every one given before in this process: the
 * reconciler takes a state with an older generation for an older state, whichever model made it.
 */
function nextGeneration(after: number): number {
  lastGeneration = Math.max(lastGeneration, after) + 1;
  return lastGeneration;
}

/**
 * The desired state kept across syncs. update() gives exactly what buildDesiredState gives for
 * the same input; the arrays it returns are shared with later results and must not be modified.
 */
export class DesiredStateModel {
  private readonly records = new Map<ServiceInfo, ServiceRecord>();
  /** By sort key: the one claim on the key, or the contest of several. */
  private readonly contests = new Map<string, Claim | Contest>();
  private entries: Record<Family, SortedEntries> = { ipv4: new SortedEntries(), ipv6: new SortedEntries() };
  private readonly withSkips = new Set<ServiceRecord>();
  private readonly contested = new Set<Contest>();
  /** Records left out because they do not fit in maxEntries. */
  private readonly overCapacity = new Set<ServiceRecord>();
  /** Entries asked for by all records, per family (admitted or not). */
  private readonly requested: Record<Family, number> = { ipv4: 0, ipv6: 0 };
  /** The records in order of precedence, as the last admission pass sorted them. */
  private byPrecedence: ServiceRecord[] | undefined;
  /**
   * How many times each address is a ClusterIP of a record (an object counts its clusterIP and
   * its clusterIPs): an external address that is one is never translated, whichever Service came
   * first. Kept with the records, a change costs what it touches.
   */
  private readonly clusterIps = new Map<string, number>();
  /** The records whose request depends on whether an address is a ClusterIP, by address. */
  private readonly lookups = new Map<string, Set<ServiceRecord>>();
  /** The addresses each such record looked up (most records look up none and are not here). */
  private readonly lookedUp = new Map<ServiceRecord, string[]>();
  private readonly maxEntries: number;
  private context: RequestContext;
  /** The node's own addresses the records were derived with. */
  private nodeAddressKey = '';
  private skips: Skip[] = [];
  private conflicts: Conflict[] = [];
  private generation = 0;
  /** The previous input, when it held each object once. */
  private lastInput: ServiceInfo[] | undefined;
  /** The mark of a change-tracked input at the last update. */
  private trackedMark: number | undefined;
  private nextSeq = 0;
  /** The cooperative update under way: updates never interleave. */
  private running: Promise<unknown> = Promise.resolve();
  private work = 0;
  /** The generation of the last update asked for (DesiredState.generation). */
  private updates: number;

  /**
   * `after`: the last generation of a model this one replaces. Generations are numbered for the
   * whole process, so a model's come after every state any model gave before, `after` or not.
   */
  constructor(
    private readonly config: ModelConfig,
    after = 0,
  ) {
    this.updates = after;
    this.maxEntries = config.maxEntries ?? Number.POSITIVE_INFINITY;
    this.context = requestContext(config, undefined, [], this.clusterIps);
  }

  /** The generation of the last update asked for: a model replacing this one starts after it. */
  get lastGeneration(): number {
    return this.updates;
  }

  /**
   * The desired state for these Services. Given a collection that tracks its changes (the
   * informer), only what changed since the last update is read. `interfaceAddresses`: the
   * addresses of the node's interfaces, its own as much as those of its Node object.
   */
  update(
    services: Iterable<ServiceInfo> | ChangeTracked<ServiceInfo>,
    node: NodeInfo | undefined,
    interfaceAddresses: readonly string[] = [],
  ): DesiredState {
    const steps = this.steps(services, node, interfaceAddresses, (this.updates = nextGeneration(this.updates)));
    for (;;) {
      const step = steps.next();
      if (step.done) return step.value;
    }
  }

  /**
   * update(), giving the event loop a turn every SLICE_MS of work. Calls are served one after
   * the other; the input is read when the call's turn comes.
   */
  updateCooperatively(
    services: Iterable<ServiceInfo> | ChangeTracked<ServiceInfo>,
    node: NodeInfo | undefined,
    interfaceAddresses: readonly string[] = [],
  ): Promise<DesiredState> {
    // Numbered when asked for: calls are served, and their input read, in that order.
    const generation = (this.updates = nextGeneration(this.updates));
    const run = this.running.then(async () => {
      const steps = this.steps(services, node, interfaceAddresses, generation);
      let sliceStart = performance.now();
      for (;;) {
        const step = steps.next();
        if (step.done) return step.value;
        if (performance.now() - sliceStart >= SLICE_MS) {
          await new Promise((resolve) => setImmediate(resolve));
          sliceStart = performance.now();
        }
      }
    });
    this.running = run.catch(() => undefined);
    return run;
  }

  /** True every WORK_PER_LOOK units of work: the moment to yield. */
  private worked(units = 1): boolean {
    this.work += units;
    if (this.work < WORK_PER_LOOK) return false;
    this.work = 0;
    return true;
  }

  private *steps(
    services: Iterable<ServiceInfo> | ChangeTracked<ServiceInfo>,
    node: NodeInfo | undefined,
    interfaceAddresses: readonly string[],
    generation: number,
  ): Steps<DesiredState> {
    this.followNode(node, interfaceAddresses);
    let changes: { added: ServiceRecord[]; removed: ServiceRecord[] };
    if (isChangeTracked(services)) changes = yield* this.trackedChanges(services);
    else {
      this.trackedMark = undefined;
      changes = yield* this.listChanges(Array.isArray(services) ? (services as ServiceInfo[]) : [...services]);
    }
    yield* this.followClusterIps(changes);
    const { added, removed } = changes;

    let skipsChanged = false;
    for (const record of removed) {
      this.count(record, -1);
      if (this.withSkips.delete(record)) skipsChanged = true;
    }
    for (const record of added) {
      this.count(record, 1);
      if (record.skips.length > 0) {
        this.withSkips.add(record);
        skipsChanged = true;
      }
    }
    const admission = this.admit(added, removed);
    if (admission.capacityChanged) skipsChanged = true;

    /** Keys whose claims changed, with who held each before (its winner or single claim). */
    const touched = new Map<string, Claim | Contest | undefined>();
    const touch = (sortKey: string) => {
      if (!touched.has(sortKey)) touched.set(sortKey, this.contests.get(sortKey));
    };
    for (const record of admission.leave) {
      for (const claim of record.claims) {
        touch(claim.sortKey);
        const held = this.contests.get(claim.sortKey)!;
        if (held instanceof Contest) held.claims.splice(held.claims.indexOf(claim), 1);
        else this.contests.delete(claim.sortKey);
        if (this.worked()) yield;
      }
      record.claims = NO_CLAIMS;
    }
    for (const record of admission.enter) {
      record.claims = yield* this.claimsOf(record);
      for (const claim of record.claims) {
        touch(claim.sortKey);
        const held = this.contests.get(claim.sortKey);
        if (held === undefined) this.contests.set(claim.sortKey, claim);
        else if (held instanceof Contest) held.claims.push(claim);
        else {
          const contest = new Contest([held, claim]);
          // The single claim held the key: the contest starts with it as the winner.
          contest.winner = held;
          this.contests.set(claim.sortKey, contest);
        }
        if (this.worked()) yield;
      }
    }

    const bulk = touched.size > BULK_CHANGES;
    const placed: Record<Family, Placements> = { ipv4: new Placements(), ipv6: new Placements() };
    let conflictsChanged = false;
    for (const [sortKey, before] of touched) {
      if (this.decide(sortKey, before, bulk ? placed : undefined)) conflictsChanged = true;
      if (this.worked()) yield;
    }
    if (bulk) for (const family of ['ipv4', 'ipv6'] as const) placed[family].applyTo(this.entries[family]);
    yield;
    if (skipsChanged) this.collectSkips();
    if (conflictsChanged) this.collectConflicts();

    const state = (family: Family): FamilyState => {
      const sorted = this.entries[family];
      const { entries, changes } = sorted.publish();
      const out: FamilyState = { entries, localPodMatch: localPodMatch(family, node, this.config) };
      if (sorted.ranged > 0) out.sourceRanged = true;
      if (changes) out.changes = changes;
      return out;
    };
    return {
      ipv4: state('ipv4'),
      ipv6: state('ipv6'),
      masqueradeMark: 2 ** this.config.masqueradeBit,
      skips: this.skips,
      conflicts: this.conflicts,
      generation,
    };
  }

  /**
   * The node's own addresses decide which addresses are skipped: when they change (rarely: an
   * address added to the node), every record is derived again.
   */
  private followNode(node: NodeInfo | undefined, interfaceAddresses: readonly string[]): void {
    const context = requestContext(this.config, node, interfaceAddresses, this.clusterIps);
    const key = [...[...context.nodeAddresses].sort(), ...FAMILIES.map((f) => context.nodeIps[f]?.address ?? '')].join(
      ',',
    );
    if (key === this.nodeAddressKey) return;
    this.nodeAddressKey = key;
    this.context = context;
    this.records.clear();
    this.contests.clear();
    this.entries = { ipv4: new SortedEntries(), ipv6: new SortedEntries() };
    this.withSkips.clear();
    this.contested.clear();
    this.overCapacity.clear();
    this.clusterIps.clear();
    this.lookups.clear();
    this.lookedUp.clear();
    this.requested.ipv4 = 0;
    this.requested.ipv6 = 0;
    this.byPrecedence = undefined;
    this.lastInput = undefined;
    this.trackedMark = undefined;
    this.skips = [];
    this.conflicts = [];
  }

  /**
   * Counts the ClusterIPs of the records that come and go, and derives anew exactly the records
   * whose addresses stopped or started being a ClusterIP: those are replaced in `changes` (the
   * old record gone, the new one added), whichever order the Services came in. The records of
   * this change were derived before the count of this change: those that looked up an address
   * whose answer changed are among the ones derived anew.
   */
  private *followClusterIps(changes: { added: ServiceRecord[]; removed: ServiceRecord[] }): Steps<void> {
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
      if (this.worked()) yield;
    }
    for (const record of changes.added) {
      forEachClusterIp(record.svc, (address) => add(address, 1));
      if (this.worked()) yield;
    }
    const stale = new Set<ServiceRecord>();
    for (const [address, was] of before) {
      if (was === this.clusterIps.has(address)) continue;
      for (const record of this.lookups.get(address) ?? []) stale.add(record);
    }
    if (stale.size === 0) return;
    // Where each record of this change stands in `added` (the start adds every record).
    const fresh = new Map(changes.added.map((record, i) => [record, i]));
    for (const record of stale) {
      this.forgetLookups(record);
      const derived = this.deriveRecord(record.svc, record.seenIn, record.seq);
      this.records.set(record.svc, derived);
      const at = fresh.get(record);
      if (at !== undefined) {
        changes.added[at] = derived;
      } else {
        changes.removed.push(record);
        changes.added.push(derived);
      }
      if (this.worked(fieldsOf(record.svc))) yield;
    }
  }

  private forgetLookups(record: ServiceRecord): void {
    const addresses = this.lookedUp.get(record);
    if (!addresses) return;
    this.lookedUp.delete(record);
    for (const address of addresses) {
      const records = this.lookups.get(address)!;
      records.delete(record);
      if (records.size === 0) this.lookups.delete(address);
    }
  }

  private count(record: ServiceRecord, sign: 1 | -1): void {
    this.requested.ipv4 += sign * record.asksIpv4;
    this.requested.ipv6 += sign * record.asksIpv6;
  }

  /**
   * Which records enter the contests and which leave them. While everything asked for fits, every
   * record is admitted, at no cost beyond the changes. Otherwise records are admitted in order of
   * precedence (oldest first), each whole or not at all, while they fit: one that does not fit is
   * skipped, and younger, smaller ones may still fit after it.
   */
  private admit(
    added: ServiceRecord[],
    removed: ServiceRecord[],
  ): { enter: ServiceRecord[]; leave: ServiceRecord[]; capacityChanged: boolean } {
    const max = this.maxEntries;
    const leave = removed.filter((r) => r.admitted);
    let capacityChanged = false;
    for (const r of removed) if (this.overCapacity.delete(r)) capacityChanged = true;
    if (this.requested.ipv4 <= max && this.requested.ipv6 <= max) {
      const enter = [...added, ...this.overCapacity];
      if (this.overCapacity.size > 0) capacityChanged = true;
      for (const r of this.overCapacity) r.capacitySkip = undefined;
      this.overCapacity.clear();
      for (const r of enter) r.admitted = true;
      this.byPrecedence = undefined;
      return { enter, leave, capacityChanged };
    }
    // Records that ask for nothing always fit (most Services have no external address): only the
    // others are ordered. Sorted last time and changed little since: TimSort takes a nearly
    // sorted array in one pass.
    const enter: ServiceRecord[] = [];
    const asks = (r: ServiceRecord) => r.asksIpv4 + r.asksIpv6 > 0;
    let order: ServiceRecord[];
    if (this.byPrecedence) {
      const gone = new Set(removed);
      order = this.byPrecedence.filter((r) => !gone.has(r));
      for (const r of added) order.push(r);
    } else {
      order = [...this.records.values()];
    }
    order = order.filter((r) => {
      if (asks(r)) return true;
      if (!r.admitted) {
        r.admitted = true;
        enter.push(r);
      }
      return false;
    });
    order.sort((a, b) => (precedes(a, b) ? -1 : precedes(b, a) ? 1 : 0));
    this.byPrecedence = order;
    const used: Record<Family, number> = { ipv4: 0, ipv6: 0 };
    for (const r of order) {
      const ipv4 = r.asksIpv4;
      const ipv6 = r.asksIpv6;
      const fits = used.ipv4 + ipv4 <= max && used.ipv6 + ipv6 <= max;
      if (fits) {
        used.ipv4 += ipv4;
        used.ipv6 += ipv6;
        if (!r.admitted) {
          r.admitted = true;
          enter.push(r);
          if (this.overCapacity.delete(r)) {
            r.capacitySkip = undefined;
            capacityChanged = true;
          }
        }
      } else if (!this.overCapacity.has(r)) {
        if (r.admitted) leave.push(r);
        r.admitted = false;
        const asked = ipv4 + ipv6;
        r.capacitySkip = {
          service: r.service,
          reason: 'overCapacity',
          detail: `its ${asked} entries do not fit in the ${max} per family this node programs (--max-entries): older Services hold them`,
        };
        this.overCapacity.add(r);
        capacityChanged = true;
      }
    }
    return { enter, leave, capacityChanged };
  }

  /** The changes the collection reports since the last update, or all of it anew. */
  private *trackedChanges(
    services: ChangeTracked<ServiceInfo>,
  ): Steps<{ added: ServiceRecord[]; removed: ServiceRecord[] }> {
    const since = this.trackedMark;
    const mark = services.mark;
    const changes = since === undefined ? undefined : services.changesSince(since);
    this.trackedMark = mark;
    // Anything the model does not hold as the collection says it should: read it all.
    if (
      !changes ||
      changes.removed.some((svc) => !this.records.has(svc)) ||
      changes.added.some((svc) => this.records.has(svc))
    ) {
      return yield* this.listChanges(services.list());
    }
    this.lastInput = undefined; // the last list no longer describes what the model holds
    return yield* this.replaceRecords(changes.removed, changes.added, ++this.generation);
  }

  /** Forgets the records of `gone` Services and derives those of `fresh` ones. */
  private *replaceRecords(
    gone: ServiceInfo[],
    fresh: ServiceInfo[],
    generation: number,
  ): Steps<{ added: ServiceRecord[]; removed: ServiceRecord[] }> {
    const removed = gone.map((svc) => {
      const record = this.records.get(svc)!;
      this.records.delete(svc);
      return record;
    });
    const added: ServiceRecord[] = [];
    for (const svc of fresh) {
      const record = this.deriveRecord(svc, generation);
      this.records.set(svc, record);
      added.push(record);
      if (this.worked(fieldsOf(svc))) yield;
    }
    return { added, removed };
  }

  /** Which Service objects of the list are new, and which known ones it no longer holds. */
  private *listChanges(input: ServiceInfo[]): Steps<{ added: ServiceRecord[]; removed: ServiceRecord[] }> {
    const changes = yield* this.serviceChanges(input);
    // Compared by identity next time: kept as a copy, the caller may reuse its array.
    this.lastInput = this.records.size === input.length ? input.slice() : undefined;
    return changes;
  }

  /**
   * Which Service objects are new and which are gone since the last update. The caches list
   * their objects in a stable order, an object replaced where it stood: walking the last input
   * and this one side by side finds the changes without a lookup per Service.
   */
  private *serviceChanges(input: ServiceInfo[]): Steps<{ added: ServiceRecord[]; removed: ServiceRecord[] }> {
    const generation = ++this.generation;
    const walked = this.lastInput && orderedChanges(this.lastInput, input, (svc) => this.records.has(svc));
    if (walked && new Set(walked.fresh).size === walked.fresh.length) {
      return yield* this.replaceRecords(walked.gone, walked.fresh, generation);
    }
    const added: ServiceRecord[] = [];
    let kept = 0;
    for (const svc of input) {
      const known = this.records.get(svc);
      if (known) {
        if (known.seenIn !== generation) kept++;
        known.seenIn = generation;
        if (this.worked()) yield;
        continue;
      }
      const record = this.deriveRecord(svc, generation);
      this.records.set(svc, record);
      added.push(record);
      if (this.worked(fieldsOf(svc))) yield;
    }
    const removed: ServiceRecord[] = [];
    if (kept + added.length < this.records.size) {
      for (const [svc, record] of this.records) {
        if (record.seenIn === generation) continue;
        this.records.delete(svc);
        removed.push(record);
      }
    }
    return { added, removed };
  }

  /** `seq`: the order of first sight, kept when a record is derived anew from the same object. */
  private deriveRecord(svc: ServiceInfo, generation: number, seq = this.nextSeq++): ServiceRecord {
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
    };
    if (lookedUp.length > 0) {
      this.lookedUp.set(record, lookedUp.slice());
      for (const address of lookedUp) {
        const records = this.lookups.get(address);
        if (records) records.add(record);
        else this.lookups.set(address, new Set([record]));
      }
    }
    return record;
  }

  /** The entries a record asks for, made when it is admitted: every address times every port. */
  private *claimsOf(record: ServiceRecord): Steps<Claim[]> {
    // Derived again from the same object and context (a new context derives every record anew):
    // the same request, whose skips the record holds already.
    const { addresses, ports } = record.request ?? serviceRequest(record.svc, this.context, [], record.service);
    record.request = undefined;
    if (addresses.length === 0) return NO_CLAIMS;
    // Exactly as long as it must be: an array grown by push keeps room for 17 elements.
    const claims = new Array<Claim>(addresses.length * ports.length);
    let n = 0;
    for (const address of addresses) {
      for (const { protocol, port } of ports) {
        const entry: Entry = {
          family: address.ip.family,
          externalIp: address.ip.address,
          protocol,
          port,
          clusterIp: address.clusterIp,
          service: record.service,
        };
        if (address.sourceRanges) entry.sourceRanges = address.sourceRanges;
        // Addresses and ports are distinct (service-rules.ts): every key is claimed once.
        claims[n++] = {
          entry,
          sortKey: flat([address.sortKey, '|', protocol, '|', String(port).padStart(5, '0')]),
          record,
        };
      }
      if (this.worked(ports.length)) yield;
    }
    return claims;
  }

  /**
   * Decides who holds a key after its claims changed (`before`: what held it before the change);
   * true when its losers changed. The entry is placed in the sorted entries at once, or, for a
   * bulk change, noted in `bulk`. A contest left with one claim gives way to it.
   */
  private decide(
    sortKey: string,
    before: Claim | Contest | undefined,
    bulk: Record<Family, Placements> | undefined,
  ): boolean {
    const previous = before instanceof Contest ? before.winner : before;
    const oldLosers = before instanceof Contest ? before.losers : NO_LOSERS;
    let held = this.contests.get(sortKey);
    if (held instanceof Contest && held.claims.length <= 1) {
      this.contested.delete(held);
      held = held.claims[0];
      if (held) this.contests.set(sortKey, held);
      else this.contests.delete(sortKey);
    }
    let winner: Claim | undefined;
    if (held instanceof Contest) {
      for (const claim of held.claims) if (!winner || precedes(claim.record, winner.record)) winner = claim;
      held.winner = winner;
    } else {
      winner = held;
    }
    if (!winner) {
      if (previous) {
        const family = previous.entry.family;
        if (bulk) bulk[family].deletes.push(sortKey);
        else this.entries[family].delete(sortKey);
      }
    } else if (winner !== previous) {
      const family = winner.entry.family;
      if (bulk) bulk[family].sets.push(winner);
      else this.entries[family].set(winner.sortKey, winner.entry);
    }

    // Most keys have one claim, and no losers: no arrays to make for them.
    const losers =
      held instanceof Contest
        ? [...new Set(held.claims.map((c) => c.record.service))]
            .filter((service) => service !== winner?.record.service)
            .sort()
        : NO_LOSERS;
    if (losers.length === oldLosers.length && losers.every((l, i) => l === oldLosers[i])) return false;
    if (held instanceof Contest) {
      held.losers = losers.length > 0 ? losers.slice() : NO_LOSERS;
      if (losers.length > 0) this.contested.add(held);
      else this.contested.delete(held);
    }
    return true;
  }

  private collectSkips(): void {
    const keyed: Array<[string, Skip]> = [];
    const add = (s: Skip) => keyed.push([`${s.service}|${s.reason}|${s.detail}`, s]);
    for (const record of this.withSkips) for (const s of record.skips) add(s);
    for (const record of this.overCapacity) add(record.capacitySkip!);
    this.skips = keyed.sort(([a], [b]) => compareKeys(a, b)).map(([, s]) => s);
  }

  private collectConflicts(): void {
    const conflicts: Conflict[] = [];
    for (const contest of this.contested) {
      const won = contest.winner!.entry;
      for (const loser of contest.losers) {
        conflicts.push({
          family: won.family,
          externalIp: won.externalIp,
          protocol: won.protocol,
          port: won.port,
          winner: won.service,
          loser,
        });
      }
    }
    this.conflicts = conflicts
      .map((c) => [conflictSortKey(c), c] as const)
      .sort(([a], [b]) => compareKeys(a, b))
      .map(([, c]) => c);
  }
}

/** Winners placed and keys emptied by a bulk change of one family, merged in one pass. */
class Placements {
  readonly sets: Array<{ sortKey: string; entry: Entry }> = [];
  readonly deletes: string[] = [];

  applyTo(sorted: SortedEntries): void {
    if (this.sets.length > 0 || this.deletes.length > 0) sorted.merge(this.sets, this.deletes);
  }
}

/** What reading a Service costs, in units of work: its addresses and ports. */
function fieldsOf(svc: ServiceInfo): number {
  return 1 + (svc.externalIPs?.length ?? 0) + (svc.ingress?.length ?? 0) + (svc.ports?.length ?? 0);
}

function isChangeTracked(services: object): services is ChangeTracked<ServiceInfo> {
  const s = services as Partial<ChangeTracked<ServiceInfo>>;
  return typeof s.changesSince === 'function' && typeof s.list === 'function' && typeof s.mark === 'number';
}

function conflictSortKey(c: Conflict): string {
  return `${c.family}|${ipSortKey(c.externalIp)}|${c.protocol}|${c.port}|${c.loser}`;
}
