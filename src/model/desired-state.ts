// The model: Services + this Node + config -> DesiredState. No I/O.
// The rules for one Service are in service-rules.ts, local-pod detection in local-pods.ts.
//
// DesiredStateModel keeps the result between syncs so that a change costs what it touches, not
// what the cluster holds: a Service's entries and skips are derived once per object (the caches
// replace an object when it changes and never modify one), and only the map keys claimed by
// changed Services are decided again. buildDesiredState is the same computation from nothing.

import { ipSortKey } from './ip.js';
import { localPodMatch } from './local-pods.js';
import { orderedChanges } from './ordered-changes.js';
import { creationTime, flat, precedes, serviceCandidates, serviceKey, type Precedence } from './service-rules.js';
import { compareKeys, SortedEntries } from './sorted-entries.js';
import { entryKey } from './types.js';
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
  return new DesiredStateModel(config).update(services, node);
}

/** One Service's request for one map key. */
interface Claim {
  /** What is programmed while this claim wins: the same object from sync to sync. */
  entry: Entry;
  key: string;
  /** Orders entries by (externalIp numerically, protocol, port). */
  sortKey: string;
  record: ServiceRecord;
}

/** What one Service object asks for. */
interface ServiceRecord extends Precedence {
  /** The update that last saw this object in the input. */
  seenIn: number;
  claims: Claim[];
  skips: Skip[];
}

/** Every claim on one map key, and who holds it. */
interface Contest {
  family: Family;
  claims: Claim[];
  winner: Claim | undefined;
  /** Services that claim the key and lose, sorted. */
  losers: string[];
}

/** Above this many changed keys, sorting everything anew beats inserting one by one. */
const BULK_CHANGES = 1024;

/**
 * The desired state kept across syncs. update() gives exactly what buildDesiredState gives for
 * the same input; the arrays it returns are shared with later results and must not be modified.
 */
export class DesiredStateModel {
  private readonly records = new Map<ServiceInfo, ServiceRecord>();
  private readonly contests = new Map<string, Contest>();
  private readonly entries: Record<Family, SortedEntries> = { ipv4: new SortedEntries(), ipv6: new SortedEntries() };
  private readonly withSkips = new Set<ServiceRecord>();
  private readonly contested = new Set<Contest>();
  private skips: Skip[] = [];
  private conflicts: Conflict[] = [];
  private generation = 0;
  /** The previous input, when it held each object once. */
  private lastInput: ServiceInfo[] | undefined;
  /** The mark of a change-tracked input at the last update. */
  private trackedMark: number | undefined;
  private nextSeq = 0;

  constructor(private readonly config: ModelConfig) {}

  /**
   * The desired state for these Services. Given a collection that tracks its changes (the
   * informer), only what changed since the last update is read.
   */
  update(services: Iterable<ServiceInfo> | ChangeTracked<ServiceInfo>, node: NodeInfo | undefined): DesiredState {
    let changes: { added: ServiceRecord[]; removed: ServiceRecord[] };
    if (isChangeTracked(services)) changes = this.trackedChanges(services);
    else {
      this.trackedMark = undefined;
      changes = this.listChanges(Array.isArray(services) ? (services as ServiceInfo[]) : [...services]);
    }
    const { added, removed } = changes;

    const touched = new Set<Contest>();
    let skipsChanged = false;
    for (const record of removed) {
      for (const claim of record.claims) {
        const contest = this.contests.get(claim.key)!;
        contest.claims.splice(contest.claims.indexOf(claim), 1);
        touched.add(contest);
      }
      if (this.withSkips.delete(record)) skipsChanged = true;
    }
    for (const record of added) {
      for (const claim of record.claims) {
        let contest = this.contests.get(claim.key);
        if (!contest) {
          contest = { family: claim.entry.family, claims: [claim], winner: undefined, losers: NO_LOSERS };
          this.contests.set(claim.key, contest);
        } else {
          contest.claims.push(claim);
        }
        touched.add(contest);
      }
      if (record.skips.length > 0) {
        this.withSkips.add(record);
        skipsChanged = true;
      }
    }

    const bulk = touched.size > BULK_CHANGES;
    let conflictsChanged = false;
    for (const contest of touched) {
      if (this.decide(contest, !bulk)) conflictsChanged = true;
    }
    if (bulk) this.resortEntries();
    if (skipsChanged) this.collectSkips();
    if (conflictsChanged) this.collectConflicts();

    const state = (family: Family): FamilyState => {
      const { entries, changes } = this.entries[family].publish();
      const out: FamilyState = { entries, localPodMatch: localPodMatch(family, node, this.config) };
      if (changes) out.changes = changes;
      return out;
    };
    return {
      ipv4: state('ipv4'),
      ipv6: state('ipv6'),
      masqueradeMark: 2 ** this.config.masqueradeBit,
      skips: this.skips,
      conflicts: this.conflicts,
    };
  }

  /** The changes the collection reports since the last update, or all of it anew. */
  private trackedChanges(services: ChangeTracked<ServiceInfo>): { added: ServiceRecord[]; removed: ServiceRecord[] } {
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
      return this.listChanges(services.list());
    }
    this.lastInput = undefined; // the last list no longer describes what the model holds
    return this.replaceRecords(changes.removed, changes.added, ++this.generation);
  }

  /** Forgets the records of `gone` Services and derives those of `fresh` ones. */
  private replaceRecords(
    gone: ServiceInfo[],
    fresh: ServiceInfo[],
    generation: number,
  ): { added: ServiceRecord[]; removed: ServiceRecord[] } {
    const removed = gone.map((svc) => {
      const record = this.records.get(svc)!;
      this.records.delete(svc);
      return record;
    });
    const added = fresh.map((svc) => {
      const record = this.deriveRecord(svc, generation);
      this.records.set(svc, record);
      return record;
    });
    return { added, removed };
  }

  /** Which Service objects of the list are new, and which known ones it no longer holds. */
  private listChanges(input: ServiceInfo[]): { added: ServiceRecord[]; removed: ServiceRecord[] } {
    const changes = this.serviceChanges(input);
    // Compared by identity next time: kept as a copy, the caller may reuse its array.
    this.lastInput = this.records.size === input.length ? input.slice() : undefined;
    return changes;
  }

  /**
   * Which Service objects are new and which are gone since the last update. The caches list
   * their objects in a stable order, an object replaced where it stood: walking the last input
   * and this one side by side finds the changes without a lookup per Service.
   */
  private serviceChanges(input: ServiceInfo[]): { added: ServiceRecord[]; removed: ServiceRecord[] } {
    const generation = ++this.generation;
    const walked = this.lastInput && orderedChanges(this.lastInput, input, (svc) => this.records.has(svc));
    if (walked && new Set(walked.fresh).size === walked.fresh.length) {
      return this.replaceRecords(walked.gone, walked.fresh, generation);
    }
    const added: ServiceRecord[] = [];
    let kept = 0;
    for (const svc of input) {
      const known = this.records.get(svc);
      if (known) {
        if (known.seenIn !== generation) kept++;
        known.seenIn = generation;
        continue;
      }
      const record = this.deriveRecord(svc, generation);
      this.records.set(svc, record);
      added.push(record);
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

  private deriveRecord(svc: ServiceInfo, generation: number): ServiceRecord {
    const skips: Skip[] = [];
    const claims: Claim[] = [];
    const record: ServiceRecord = {
      service: serviceKey(svc),
      created: creationTime(svc),
      seq: this.nextSeq++,
      seenIn: generation,
      claims,
      skips,
    };
    for (const c of serviceCandidates(svc, this.config, skips, record.service)) {
      const entry: Entry = {
        family: c.family,
        externalIp: c.ip.address,
        protocol: c.protocol,
        port: c.port,
        clusterIp: c.clusterIp,
        service: record.service,
      };
      const key = entryKey(entry);
      // A port listed twice asks for the same key twice: one claim.
      if (claims.some((claim) => claim.key === key)) continue;
      claims.push({
        entry,
        key,
        sortKey: flat([c.ipSortKey, '|', c.protocol, '|', String(c.port).padStart(5, '0')]),
        record,
      });
    }
    // Arrays grown by push keep room for more; a record keeps exact copies.
    record.claims = claims.slice();
    record.skips = skips.length > 0 ? skips.slice() : NO_SKIPS;
    return record;
  }

  /** Decides who holds a key after its claims changed; true when its losers changed. */
  private decide(contest: Contest, placeEntry: boolean): boolean {
    const previous = contest.winner;
    let winner: Claim | undefined;
    for (const claim of contest.claims) if (!winner || precedes(claim.record, winner.record)) winner = claim;
    contest.winner = winner;
    const sorted = this.entries[contest.family];
    if (!winner) {
      this.contests.delete(previous!.key);
      if (placeEntry) sorted.delete(previous!.sortKey);
    } else if (placeEntry && winner !== previous) {
      sorted.set(winner.sortKey, winner.entry);
    }

    // Most keys have one claim, and no losers: no arrays to make for them.
    const losers =
      contest.claims.length <= 1
        ? NO_LOSERS
        : [...new Set(contest.claims.map((c) => c.record.service))]
            .filter((service) => service !== winner?.record.service)
            .sort();
    if (losers.length === contest.losers.length && losers.every((l, i) => l === contest.losers[i])) return false;
    contest.losers = losers.length > 0 ? losers.slice() : NO_LOSERS;
    if (losers.length > 0) this.contested.add(contest);
    else this.contested.delete(contest);
    return true;
  }

  private resortEntries(): void {
    const winners: Record<Family, Claim[]> = { ipv4: [], ipv6: [] };
    for (const contest of this.contests.values()) winners[contest.family].push(contest.winner!);
    for (const family of ['ipv4', 'ipv6'] as const) this.entries[family].replaceAll(winners[family]);
  }

  private collectSkips(): void {
    const keyed: Array<[string, Skip]> = [];
    for (const record of this.withSkips) {
      for (const s of record.skips) keyed.push([`${s.service}|${s.reason}|${s.detail}`, s]);
    }
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

function isChangeTracked(services: object): services is ChangeTracked<ServiceInfo> {
  const s = services as Partial<ChangeTracked<ServiceInfo>>;
  return typeof s.changesSince === 'function' && typeof s.list === 'function' && typeof s.mark === 'number';
}

function conflictSortKey(c: Conflict): string {
  return `${c.family}|${ipSortKey(c.externalIp)}|${c.protocol}|${c.port}|${c.loser}`;
}
