// The model: Services + this Node + config -> DesiredState. No I/O.
//
// DesiredStateModel keeps the result between syncs so that a change costs what it touches, not
// what the cluster holds. An update goes through these parts, each in its own module:
// - reading changes (change-reading.ts): which Service objects came and went, from the informer's
//   change feed (change-feed.ts) or by comparing lists;
// - the records (service-records.ts): what each object asks for (the rules of service-rules.ts,
//   reading the request-context.ts), derived once per object, and again only when a ClusterIP it
//   looked up comes or goes;
// - capacity admission (capacity.ts): which Services fit in --max-entries;
// - key contests (key-contests.ts): which Service holds a map key several claim, and the sorted
//   entries of the winners;
// - time slicing (time-slicing.ts): update() runs to the end at once; updateCooperatively() gives
//   the event loop a turn every few milliseconds, so that /healthz and the watches are served
//   while a large change is derived.
// buildDesiredState is the same computation from nothing.
//
// Every step is linear (or n log n) in what one Service asks for, and what one Service may ask
// for is bounded: past --max-entries-per-service it is skipped whole, and Services that do not fit
// in the entries the backend is given (--max-entries) are skipped whole, the youngest first (the
// order that settles conflicts). Entries are made only for Services that are programmed.

import { CapacityAdmission } from './capacity.js';
import { ChangeReader, type ServiceSource } from './change-reading.js';
import { KeyContests } from './key-contests.js';
import { localPodMatch } from './request-context.js';
import { requestContext } from './request-context.js';
import { ServiceRecords, type ServiceRecord } from './service-records.js';
import { compareKeys } from './sorted-entries.js';
import { runInSlices, runToEnd, WorkMeter, type Steps } from './time-slicing.js';
import { FAMILIES } from './types.js';
import type {
  DesiredState,
  Family,
  FamilyState,
  LocalPodMatch,
  ModelConfig,
  NodeInfo,
  ServiceInfo,
  Skip,
} from './types.js';

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
  private readonly meter = new WorkMeter();
  private nodeAddressChanges = 0;
  private readonly records: ServiceRecords;
  private readonly reader: ChangeReader;
  private readonly capacity: CapacityAdmission;
  private readonly contests: KeyContests;
  /** The records that have skips of their own. */
  private readonly withSkips = new Set<ServiceRecord>();
  /** The node's own addresses the records were derived with. */
  private nodeAddressKey = '';
  /** The node and interface addresses followed last (by identity: the caches keep an unchanged one), and their local-pod match. */
  private followed:
    | {
        node: NodeInfo | undefined;
        interfaceAddresses: readonly string[];
        localPodMatch: Record<Family, LocalPodMatch>;
      }
    | undefined;
  private skips: Skip[] = [];
  /** The cooperative update under way: updates never interleave. */
  private running: Promise<unknown> = Promise.resolve();
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
    this.records = new ServiceRecords(config, this.meter);
    this.reader = new ChangeReader(this.records, this.meter);
    this.capacity = new CapacityAdmission(config.maxEntries ?? Number.POSITIVE_INFINITY);
    this.contests = new KeyContests(this.meter, (record) => this.records.takeRequest(record));
  }

  /** The generation of the last update asked for: a model replacing this one starts after it. */
  /** How often the node's addresses changed, each time deriving every record again (the first included). */
  get rebuilds(): number {
    return this.nodeAddressChanges;
  }

  get lastGeneration(): number {
    return this.updates;
  }

  /**
   * The desired state for these Services. Given a feed of changes (the informer), only what
   * changed since the last update is read. `interfaceAddresses`: the addresses of the node's
   * interfaces, its own as much as those of its Node object.
   */
  update(
    services: ServiceSource,
    node: NodeInfo | undefined,
    interfaceAddresses: readonly string[] = [],
  ): DesiredState {
    return runToEnd(this.steps(services, node, interfaceAddresses, (this.updates = nextGeneration(this.updates))));
  }

  /**
   * update(), giving the event loop a turn every few milliseconds of work. Calls are served one
   * after the other; the input is read when the call's turn comes.
   */
  updateCooperatively(
    services: ServiceSource,
    node: NodeInfo | undefined,
    interfaceAddresses: readonly string[] = [],
  ): Promise<DesiredState> {
    // Numbered when asked for: calls are served, and their input read, in that order.
    const generation = (this.updates = nextGeneration(this.updates));
    const run = this.running.then(() => runInSlices(this.steps(services, node, interfaceAddresses, generation)));
    this.running = run.catch(() => undefined);
    return run;
  }

  private *steps(
    services: ServiceSource,
    node: NodeInfo | undefined,
    interfaceAddresses: readonly string[],
    generation: number,
  ): Steps<DesiredState> {
    this.followNode(node, interfaceAddresses);
    const changes = yield* this.reader.read(services);
    yield* this.records.followClusterIps(changes);
    const { added, removed } = changes;

    let skipsChanged = false;
    for (const record of removed) if (this.withSkips.delete(record)) skipsChanged = true;
    for (const record of added) {
      if (record.skips.length > 0) {
        this.withSkips.add(record);
        skipsChanged = true;
      }
    }
    const admission = this.capacity.admit(added, removed, () => this.records.byObject.values());
    if (admission.capacityChanged) skipsChanged = true;
    const conflictsChanged = yield* this.contests.change(admission.leave, admission.enter);
    yield;
    if (skipsChanged) this.collectSkips();
    if (conflictsChanged) this.contests.collectConflicts();

    const state = (family: Family): FamilyState => {
      const sorted = this.contests.sorted(family);
      const { snapshot, changes } = sorted.publish();
      const out: FamilyState = {
        // Made when first read (EntryHandOut): a change written from `changes` never reads it.
        get entries() {
          return snapshot.entries();
        },
        localPodMatch: this.followed!.localPodMatch[family],
        snapshot,
      };
      const ranged = sorted.rangedByService();
      if (ranged.size > 0) {
        out.sourceRanged = true;
        out.rangedByService = ranged;
      }
      if (changes) out.changes = changes;
      return out;
    };
    return {
      ipv4: state('ipv4'),
      ipv6: state('ipv6'),
      masqueradeMark: 2 ** this.config.masqueradeBit,
      skips: this.skips,
      conflicts: this.contests.conflicts,
      generation,
    };
  }

  /**
   * The node's own addresses decide which addresses are skipped: when they change (rarely: an
   * address added to the node), every record is derived again.
   */
  private followNode(node: NodeInfo | undefined, interfaceAddresses: readonly string[]): void {
    // The caches hand the same objects while nothing changed: a Service change costs no node work.
    const last = this.followed;
    if (last && last.node === node && last.interfaceAddresses === interfaceAddresses) return;
    this.followed = {
      node,
      interfaceAddresses,
      localPodMatch: { ipv4: localPodMatch('ipv4', node, this.config), ipv6: localPodMatch('ipv6', node, this.config) },
    };
    const context = requestContext(this.config, node, interfaceAddresses, this.records.clusterIps);
    const key = [...[...context.nodeAddresses].sort(), ...FAMILIES.map((f) => context.nodeIps[f]?.address ?? '')].join(
      ',',
    );
    if (key === this.nodeAddressKey) return;
    this.nodeAddressKey = key;
    this.nodeAddressChanges++;
    this.records.reset(context);
    this.reader.reset();
    this.capacity.reset();
    this.contests.reset();
    this.withSkips.clear();
    this.skips = [];
  }

  private collectSkips(): void {
    const keyed: Array<[string, Skip]> = [];
    const add = (s: Skip) => keyed.push([`${s.service}|${s.reason}|${s.detail}`, s]);
    for (const record of this.withSkips) for (const s of record.skips) add(s);
    for (const s of this.capacity.skips()) add(s);
    this.skips = keyed.sort(([a], [b]) => compareKeys(a, b)).map(([, s]) => s);
  }
}
