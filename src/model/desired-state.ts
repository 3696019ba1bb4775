// The model: Services + this Node + config -> DesiredState. No I/O.
// The rules are those of design/semantics.md; test/unit/model.test.ts covers each row.
//
// DesiredStateModel keeps the result between syncs so that a change costs what it touches, not
// what the cluster holds: a Service's entries and skips are derived once per object (the caches
// replace an object when it changes and never modify one), and only the map keys claimed by
// changed Services are decided again. buildDesiredState is the same computation from nothing.

import { ipSortKey, parseCidr, parseIp, formatCidr, type ParsedIp } from './ip.js';
import { orderedChanges } from './ordered-changes.js';
import {
  PROTOCOLS,
  SKIP_ANNOTATION,
  type Conflict,
  type ChangeTracked,
  type DesiredState,
  type Entry,
  type EntryChanges,
  type Family,
  type FamilyState,
  type LocalPodMatch,
  type ModelConfig,
  type NodeInfo,
  type Protocol,
  type ServiceInfo,
  type Skip,
} from './types.js';

export function serviceKey(svc: Pick<ServiceInfo, 'namespace' | 'name'>): string {
  return flat([svc.namespace, '/', svc.name]);
}

/**
 * A string kept for as long as its Service: joined, it is one flat string; a template literal
 * would be a tree of pieces, several times its size.
 */
function flat(parts: unknown[]): string {
  return parts.join('');
}

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
  created: number;
  record: ServiceRecord;
}

/** What one Service object asks for. */
interface ServiceRecord {
  service: string;
  /** Order of first sight: breaks ties between two objects of one name (possible in files only). */
  seq: number;
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
    const record: ServiceRecord = { service: serviceKey(svc), seq: this.nextSeq++, seenIn: generation, claims, skips };
    for (const c of serviceCandidates(svc, this.config, skips)) {
      const key = flat([c.family, '|', c.ip.address, '|', c.protocol, '|', c.port]);
      // A port listed twice asks for the same key twice: one claim.
      if (claims.some((claim) => claim.key === key)) continue;
      claims.push({
        entry: {
          family: c.family,
          externalIp: c.ip.address,
          protocol: c.protocol,
          port: c.port,
          clusterIp: c.clusterIp,
          service: record.service,
        },
        key,
        sortKey: flat([c.ipSortKey, '|', c.protocol, '|', String(c.port).padStart(5, '0')]),
        created: c.created,
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
    for (const claim of contest.claims) if (!winner || precedes(claim, winner)) winner = claim;
    contest.winner = winner;
    const sorted = this.entries[contest.family];
    if (!winner) {
      this.contests.delete(previous!.key);
      if (placeEntry) sorted.delete(previous!.sortKey);
    } else if (placeEntry && winner !== previous) {
      sorted.set(winner.sortKey, winner.entry);
    }

    const losers = [...new Set(contest.claims.map((c) => c.record.service))]
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
    this.skips = keyed.sort(([a], [b]) => cmp(a, b)).map(([, s]) => s);
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
      .sort(([a], [b]) => cmp(a, b))
      .map(([, c]) => c);
  }
}

function isChangeTracked(services: object): services is ChangeTracked<ServiceInfo> {
  const s = services as Partial<ChangeTracked<ServiceInfo>>;
  return typeof s.changesSince === 'function' && typeof s.list === 'function' && typeof s.mark === 'number';
}

/** The holder of a key: the oldest Service, ties broken by namespace/name (then by first sight). */
function precedes(a: Claim, b: Claim): boolean {
  if (a.created !== b.created) return a.created < b.created;
  if (a.record.service !== b.record.service) return a.record.service < b.record.service;
  return a.record.seq < b.record.seq;
}

/**
 * Entries of one family sorted by sort key. A copy is handed out until the next change, with the
 * entries removed and added since the copy handed out before (unless everything was re-sorted).
 */
class SortedEntries {
  private keys: string[] = [];
  private entries: Entry[] = [];
  private published: Entry[] | undefined;
  /** What was handed out last; undefined when the changes since are not known. */
  private lastPublished: Entry[] | undefined;
  private readonly removed = new Set<Entry>();
  private readonly added = new Set<Entry>();

  publish(): { entries: Entry[]; changes?: EntryChanges } {
    if (this.published) return { entries: this.published, changes: { since: this.published, removed: [], added: [] } };
    const entries = this.entries.slice();
    const since = this.lastPublished;
    const changes = since && { since, removed: [...this.removed], added: [...this.added] };
    this.published = entries;
    this.lastPublished = entries;
    this.removed.clear();
    this.added.clear();
    return changes ? { entries, changes } : { entries };
  }

  /** Inserts, or replaces the entry of the same key. */
  set(sortKey: string, entry: Entry): void {
    const i = this.search(sortKey);
    if (this.keys[i] === sortKey) {
      this.note(this.entries[i]!, entry);
      this.entries[i] = entry;
    } else {
      this.keys.splice(i, 0, sortKey);
      this.entries.splice(i, 0, entry);
      this.note(undefined, entry);
    }
    this.published = undefined;
  }

  delete(sortKey: string): void {
    const i = this.search(sortKey);
    if (this.keys[i] !== sortKey) return;
    this.note(this.entries[i]!, undefined);
    this.keys.splice(i, 1);
    this.entries.splice(i, 1);
    this.published = undefined;
  }

  replaceAll(winners: Claim[]): void {
    winners.sort((a, b) => cmp(a.sortKey, b.sortKey));
    this.keys = winners.map((c) => c.sortKey);
    this.entries = winners.map((c) => c.entry);
    this.published = undefined;
    this.lastPublished = undefined;
    this.removed.clear();
    this.added.clear();
  }

  /** Records a change since the last hand-out; an entry added and gone again in between nets out. */
  private note(out: Entry | undefined, into: Entry | undefined): void {
    if (out && !this.added.delete(out)) this.removed.add(out);
    if (into && !this.removed.delete(into)) this.added.add(into);
  }

  /** The first index whose key is not below sortKey. */
  private search(sortKey: string): number {
    let low = 0;
    let high = this.keys.length;
    while (low < high) {
      const mid = (low + high) >>> 1;
      if (this.keys[mid]! < sortKey) low = mid + 1;
      else high = mid;
    }
    return low;
  }
}

function conflictSortKey(c: Conflict): string {
  return `${c.family}|${ipSortKey(c.externalIp)}|${c.protocol}|${c.port}|${c.loser}`;
}

function cmp(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function creationTime(svc: ServiceInfo): number {
  const t = svc.creationTimestamp ? Date.parse(svc.creationTimestamp) : NaN;
  return Number.isFinite(t) ? t : Number.POSITIVE_INFINITY;
}

interface Candidate {
  family: Family;
  ip: ParsedIp;
  ipSortKey: string;
  protocol: Protocol;
  port: number;
  clusterIp: string;
  created: number;
}

/** The entries one Service asks for, before conflicts between Services are resolved. */
function serviceCandidates(svc: ServiceInfo, config: ModelConfig, skips: Skip[]): Candidate[] {
  const service = serviceKey(svc);
  const skip = (reason: Skip['reason'], detail: string) => skips.push({ service, reason, detail });

  if (!isDnsName(svc.namespace, 63) || !isDnsName(svc.name, 63)) {
    // The name becomes a rule comment; a real API server never serves such a name.
    skip('invalidName', 'namespace or name is not a DNS label');
    return [];
  }
  // Addresses the Service exposes, in the order they appear.
  const requested: string[] = [];
  if (svc.type === 'LoadBalancer') {
    for (const ing of svc.ingress ?? []) {
      if (ing.ip === undefined || ing.ip === '') {
        if (ing.hostname) skip('hostnameOnly', `ingress hostname ${ing.hostname}`);
        continue;
      }
      if (ing.ipMode === 'Proxy') {
        skip('ipModeProxy', `ingress ${String(ing.ip)}`);
        continue;
      }
      if (ing.ipMode !== undefined && ing.ipMode !== 'VIP') {
        skip('unknownIpMode', `ingress ${String(ing.ip)} ipMode ${String(ing.ipMode)}`);
        continue;
      }
      requested.push(ing.ip);
    }
  }
  for (const ip of svc.externalIPs ?? []) requested.push(ip);
  if (requested.length === 0) return [];

  if (svc.skip === true) {
    skip('optedOut', `annotation ${SKIP_ANNOTATION}: "true"`);
    return [];
  }
  if (config.localTrafficPolicyOnly && svc.externalTrafficPolicy !== 'Local') {
    skip('notLocalTrafficPolicy', `externalTrafficPolicy ${svc.externalTrafficPolicy ?? 'Cluster'}`);
    return [];
  }
  if (svc.type === 'ExternalName') {
    skip('externalName', 'type ExternalName');
    return [];
  }
  const clusterIpTexts = svc.clusterIPs && svc.clusterIPs.length > 0 ? svc.clusterIPs : [svc.clusterIP ?? ''];
  if (clusterIpTexts.includes('None')) {
    skip('headless', 'clusterIP None');
    return [];
  }
  const clusterIps: Partial<Record<Family, string>> = {};
  for (const text of clusterIpTexts) {
    if (text === '' || text === undefined) continue;
    const ip = parseIp(text);
    if (!ip) {
      skip('invalidAddress', `clusterIP ${String(text)}`);
      continue;
    }
    clusterIps[ip.family] ??= ip.address;
  }
  if (!clusterIps.ipv4 && !clusterIps.ipv6) {
    if (clusterIpTexts.every((t) => !t)) skip('noClusterIP', 'empty clusterIP');
    return [];
  }

  const ports: Array<{ protocol: Protocol; port: number }> = [];
  for (const p of svc.ports ?? []) {
    const protocol = (p.protocol ?? 'TCP') as Protocol;
    if (!PROTOCOLS.includes(protocol)) {
      skip('unsupportedProtocol', `port ${String(p.port)} protocol ${String(p.protocol)}`);
      continue;
    }
    if (!Number.isInteger(p.port) || p.port! < 1 || p.port! > 65535) {
      skip('invalidPort', `port ${String(p.port)}`);
      continue;
    }
    ports.push({ protocol, port: p.port! });
  }
  if (ports.length === 0) return [];

  const created = creationTime(svc);
  const out: Candidate[] = [];
  const seen = new Set<string>();
  for (const text of requested) {
    const ip = parseIp(text);
    if (!ip) {
      skip('invalidAddress', `external address ${String(text)}`);
      continue;
    }
    if (seen.has(ip.address)) continue;
    seen.add(ip.address);
    const clusterIp = clusterIps[ip.family];
    if (!clusterIp) {
      skip('familyWithoutClusterIP', `${ip.address} has no ${ip.family} clusterIP`);
      continue;
    }
    const sortKey = ipSortKey(ip.address);
    for (const { protocol, port } of ports) {
      out.push({ family: ip.family, ip, ipSortKey: sortKey, protocol, port, clusterIp, created });
    }
  }
  return out;
}

function isDnsName(text: unknown, maxLength: number): boolean {
  return typeof text === 'string' && text.length <= maxLength && /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(text);
}

function localPodMatch(family: Family, node: NodeInfo | undefined, config: ModelConfig): LocalPodMatch {
  switch (config.detectLocalMode) {
    case 'NodeCIDR': {
      if (!node) return { kind: 'none', reason: 'NodeCIDR mode: the Node object was not found' };
      const texts = node.podCIDRs && node.podCIDRs.length > 0 ? node.podCIDRs : node.podCIDR ? [node.podCIDR] : [];
      const cidrs = cidrsOfFamily(texts, family);
      if (cidrs.length === 0) {
        return { kind: 'none', reason: `NodeCIDR mode: node ${node.name} has no ${family} podCIDR` };
      }
      return { kind: 'cidrs', cidrs };
    }
    case 'ClusterCIDR': {
      const cidrs = cidrsOfFamily(config.clusterCidrs, family);
      if (cidrs.length === 0) return { kind: 'none', reason: `ClusterCIDR mode: no ${family} --cluster-cidr` };
      return { kind: 'cidrs', cidrs };
    }
    case 'BridgeInterface':
      if (!config.podBridgeInterface)
        return { kind: 'none', reason: 'BridgeInterface mode: no --pod-bridge-interface' };
      return { kind: 'interface', name: config.podBridgeInterface };
    case 'InterfaceNamePrefix':
      if (!config.podInterfaceNamePrefix) {
        return { kind: 'none', reason: 'InterfaceNamePrefix mode: no --pod-interface-name-prefix' };
      }
      return { kind: 'interfacePrefix', prefix: config.podInterfaceNamePrefix };
  }
}

function cidrsOfFamily(texts: string[], family: Family): string[] {
  const out = new Set<string>();
  for (const t of texts) {
    const c = parseCidr(t);
    if (c && c.family === family) out.add(formatCidr(c));
  }
  return [...out].sort();
}
