// Key contests: each admitted Service claims one map key per external address and port; where
// several Services claim one key (two Services asking for one address and port), the oldest holds
// it (types.ts, precedes) and the others lose it, reported as conflicts. Only the keys
// claimed by Services that came or went are decided again, and the winners are kept as the
// sorted entries of each family (sorted-entries.ts) that the desired state hands out.

import { ipSortKey } from './ip.js';
import { flat, precedes } from './types.js';
import { NO_CLAIMS, type Claim, type ServiceRecord } from './service-records.js';
import type { ServiceRequest } from './service-rules.js';
import { compareKeys, SortedEntries } from './sorted-entries.js';
import type { Steps, WorkMeter } from './time-slicing.js';
import type { Conflict, Entry, Family } from './types.js';

const NO_LOSERS: string[] = Object.freeze([]) as unknown as string[];
/** Above this many changed keys, merging them in one pass beats inserting one by one. */
const BULK_CHANGES = 64;

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

/** Winners placed and keys emptied by a bulk change of one family, merged in one pass. */
class Placements {
  readonly sets: Array<{ sortKey: string; entry: Entry }> = [];
  readonly deletes: string[] = [];

  applyTo(sorted: SortedEntries): void {
    if (this.sets.length > 0 || this.deletes.length > 0) sorted.merge(this.sets, this.deletes);
  }
}

export class KeyContests {
  /** By sort key: the one claim on the key, or the contest of several. */
  private readonly contests = new Map<string, Claim | Contest>();
  /** The winning entries of each family, sorted. */
  private entries: Record<Family, SortedEntries> = { ipv4: new SortedEntries(), ipv6: new SortedEntries() };
  /** The contests that have losers. */
  private readonly contested = new Set<Contest>();
  private conflictList: Conflict[] = [];

  constructor(
    private readonly meter: WorkMeter,
    /** What a record asks for, when its claims are made. */
    private readonly requestOf: (record: ServiceRecord) => ServiceRequest,
  ) {}

  /** Forgets every claim. */
  reset(): void {
    this.contests.clear();
    this.entries = { ipv4: new SortedEntries(), ipv6: new SortedEntries() };
    this.contested.clear();
    this.conflictList = [];
  }

  /** The winning entries of a family (SortedEntries.publish). */
  sorted(family: Family): SortedEntries {
    return this.entries[family];
  }

  /** Every loser of every contest, sorted, as of the last collectConflicts(). */
  get conflicts(): Conflict[] {
    return this.conflictList;
  }

  /**
   * Withdraws the claims of the records that `leave`, makes those of the records that `enter`,
   * and decides again each key whose claims changed. True when the losers changed (then
   * collectConflicts()).
   */
  *change(leave: ServiceRecord[], enter: ServiceRecord[]): Steps<boolean> {
    /** Keys whose claims changed, with who held each before (its winner or single claim). */
    const touched = new Map<string, Claim | Contest | undefined>();
    const touch = (sortKey: string) => {
      if (!touched.has(sortKey)) touched.set(sortKey, this.contests.get(sortKey));
    };
    for (const record of leave) {
      for (const claim of record.claims) {
        touch(claim.sortKey);
        const held = this.contests.get(claim.sortKey)!;
        if (held instanceof Contest) held.claims.splice(held.claims.indexOf(claim), 1);
        else this.contests.delete(claim.sortKey);
        if (this.meter.worked()) yield;
      }
      record.claims = NO_CLAIMS;
    }
    for (const record of enter) {
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
        if (this.meter.worked()) yield;
      }
    }

    const bulk = touched.size > BULK_CHANGES;
    const placed: Record<Family, Placements> = { ipv4: new Placements(), ipv6: new Placements() };
    let conflictsChanged = false;
    for (const [sortKey, before] of touched) {
      if (this.decide(sortKey, before, bulk ? placed : undefined)) conflictsChanged = true;
      if (this.meter.worked()) yield;
    }
    if (bulk) for (const family of ['ipv4', 'ipv6'] as const) placed[family].applyTo(this.entries[family]);
    return conflictsChanged;
  }

  /** The entries a record asks for, made when it is admitted: every address times every port. */
  private *claimsOf(record: ServiceRecord): Steps<Claim[]> {
    const { addresses, ports } = this.requestOf(record);
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
        if (address.sources) {
          entry.sourceRanges = address.sources.sourceRanges;
          if (address.sources.sourcesFromNode) entry.sourcesFromNode = true;
        }
        // Addresses and ports are distinct (service-rules.ts): every key is claimed once.
        claims[n++] = {
          entry,
          sortKey: flat([address.sortKey, '|', protocol, '|', String(port).padStart(5, '0')]),
          record,
        };
      }
      if (this.meter.worked(ports.length)) yield;
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

  /** Lists every loser of every contest, sorted (conflicts). */
  collectConflicts(): void {
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
    this.conflictList = conflicts
      .map((c) => [conflictSortKey(c), c] as const)
      .sort(([a], [b]) => compareKeys(a, b))
      .map(([, c]) => c);
  }
}

function conflictSortKey(c: Conflict): string {
  return `${c.family}|${ipSortKey(c.externalIp)}|${c.protocol}|${c.port}|${c.loser}`;
}
