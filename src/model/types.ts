// Types shared by the model, the backends and the controller, and who a Service is (serviceKey,
// precedes). The model never sees a Kubernetes client object: only these stripped shapes.

export type Family = 'ipv4' | 'ipv6';
export const FAMILIES: readonly Family[] = ['ipv4', 'ipv6'];

export type Protocol = 'TCP' | 'UDP' | 'SCTP';
export const PROTOCOLS: readonly Protocol[] = ['TCP', 'UDP', 'SCTP'];

/** The fields of a core/v1 Service the controller reads; everything else is stripped before caching. */
export interface ServiceInfo {
  namespace: string;
  name: string;
  uid?: string;
  /** RFC 3339 timestamp (metadata.creationTimestamp); missing sorts last. */
  creationTimestamp?: string;
  type?: string;
  clusterIP?: string;
  clusterIPs?: string[];
  externalIPs?: string[];
  externalTrafficPolicy?: string;
  ports?: Array<{ protocol?: string; port?: number }>;
  ingress?: Array<{ ip?: string; hostname?: string; ipMode?: string }>;
  /** `spec.loadBalancerSourceRanges`, as the API object has them (the model parses them). */
  loadBalancerSourceRanges?: string[];
  /** The annotation `ipvs-node-controller/skip: "true"` (the operator's opt-out); no other annotation is kept but `probe`. */
  skip?: boolean;
  /** The annotation `ipvs-node-controller/probe: "true"`: its owner asks every node to probe it (src/probe/). */
  probe?: boolean;
}

/** The annotation that leaves a Service untranslated when its value is "true". */
export const SKIP_ANNOTATION = 'ipvs-node-controller/skip';
/** The annotation by which a Service's owner opts in to the continuous probe, when its value is "true". */
export const PROBE_ANNOTATION = 'ipvs-node-controller/probe';

/** The fields of this node's core/v1 Node the controller reads. */
export interface NodeInfo {
  name: string;
  podCIDR?: string;
  podCIDRs?: string[];
  /**
   * Addresses that are the node's own: `status.addresses` of type InternalIP and ExternalIP, and
   * the controller adds those of the node's interfaces. Never translated (semantics.md).
   */
  addresses?: string[];
  /**
   * `status.addresses` of type InternalIP, then those of type ExternalIP, in order: the first of
   * each family is the node IP kube-proxy takes for that family (its allowFromNode).
   */
  hostIPs?: string[];
}

export type DetectLocalMode = 'NodeCIDR' | 'ClusterCIDR' | 'BridgeInterface' | 'InterfaceNamePrefix';
export const DETECT_LOCAL_MODES: readonly DetectLocalMode[] = [
  'NodeCIDR',
  'ClusterCIDR',
  'BridgeInterface',
  'InterfaceNamePrefix',
];

export interface ModelConfig {
  detectLocalMode: DetectLocalMode;
  /** --cluster-cidr (ClusterCIDR mode), already validated CIDRs of either family. */
  clusterCidrs: string[];
  /** --pod-bridge-interface (BridgeInterface mode). */
  podBridgeInterface?: string;
  /** --pod-interface-name-prefix (InterfaceNamePrefix mode). */
  podInterfaceNamePrefix?: string;
  /** --masquerade-bit: the mark is 1 << bit. */
  masqueradeBit: number;
  /** --local-traffic-policy-only */
  localTrafficPolicyOnly: boolean;
  /**
   * --max-entries-per-service: a Service asking for more entries is skipped whole
   * (`tooManyEntries`). Default DEFAULT_MAX_ENTRIES_PER_SERVICE.
   */
  maxEntriesPerService?: number;
  /**
   * Entries per family the backend is given at most (--max-entries, capped by what the backend
   * holds): Services that do not fit are skipped whole (`overCapacity`), the youngest first.
   * Default: no limit.
   */
  maxEntries?: number;
  /**
   * --service-external-ip-range: canonical CIDRs `spec.externalIPs` must fall in; an address
   * outside is skipped (`externalIpNotAllowed`). Undefined: any address.
   */
  externalIpRanges?: string[];
  /**
   * kube-proxy's AllowServiceExternalIPs feature gate, where its configuration is read: false
   * skips every `spec.externalIPs` address (`externalIpsDisabled`). Default true.
   */
  allowServiceExternalIPs?: boolean;
  /**
   * --service-cluster-ip-range: canonical CIDRs the cluster allocates ClusterIPs from; an external
   * address inside is skipped (`clusterAddress`). The ClusterIPs of the Services are skipped
   * whatever this says.
   */
  serviceCidrs?: string[];
  /**
   * --node-address-ranges: canonical CIDRs the cluster's Nodes have their addresses in; an
   * external address inside is skipped (`clusterAddress`).
   */
  nodeAddressRanges?: string[];
  /**
   * Whether the backend can translate only some sources of an address (loadBalancerSourceRanges).
   * False (the eBPF backend): LoadBalancer addresses whose family has source ranges are skipped
   * (`sourceRangesUnsupported`). Default true.
   */
  sourceRangesSupported?: boolean;
}

/** Source ranges one Service may carry (both families); beyond, its ranged addresses are skipped. */
export const MAX_SOURCE_RANGES_PER_SERVICE = 64;

/**
 * Beyond any ordinary Service (a few addresses times a few ports; a port range of a media server
 * is a few thousand), and small enough that one Service costs a node little: see
 * docs/operations.md, "Limits".
 */
export const DEFAULT_MAX_ENTRIES_PER_SERVICE = 10_000;

/** One translation: traffic to (externalIp, protocol, port) goes to (clusterIp, port). */
export interface Entry {
  family: Family;
  externalIp: string;
  protocol: Protocol;
  port: number;
  clusterIp: string;
  /** `namespace/name` of the owning Service. */
  service: string;
  /**
   * Only packets whose source is inside one of these (canonical CIDRs of the entry's family,
   * disjoint, sorted) are translated: the Service's loadBalancerSourceRanges of the family as
   * kube-proxy filters them (semantics.md), the same for every ranged entry of the Service in the
   * family, never split around its address. A packet whose source is the entry's externalIp
   * itself is the exception: see sourcesFromNode. Absent: every source. Part of the entry: other
   * ranges are another entry.
   */
  sourceRanges?: readonly string[];
  /**
   * With sourceRanges: a packet whose source is the entry's externalIp itself (a node process's
   * connection to an address bound on kube-ipvs0) is translated, because a range holds the
   * node IP of the family (kube-proxy's allowFromNode). Absent: it is not, even when a range
   * holds that address.
   */
  sourcesFromNode?: true;
}

/** How packets from local pods are recognised in the prerouting hook, per family. */
export type LocalPodMatch =
  | { kind: 'cidrs'; cidrs: string[] }
  | { kind: 'interface'; name: string }
  | { kind: 'interfacePrefix'; prefix: string }
  /** Prerouting rules are not programmed for this family; `reason` says why. */
  | { kind: 'none'; reason: string };

export type SkipReason =
  | 'ipModeProxy'
  | 'unknownIpMode'
  | 'hostnameOnly'
  | 'headless'
  | 'noClusterIP'
  | 'externalName'
  | 'familyWithoutClusterIP'
  | 'invalidAddress'
  | 'invalidName'
  | 'invalidPort'
  | 'unsupportedProtocol'
  | 'notLocalTrafficPolicy'
  | 'optedOut'
  | 'pointsAtNode'
  | 'clusterAddress'
  | 'externalIpNotAllowed'
  | 'externalIpsDisabled'
  | 'tooManyEntries'
  | 'overCapacity'
  | 'tooManySourceRanges'
  | 'sourceRangesUnsupported';

export const SKIP_REASONS: readonly SkipReason[] = [
  'ipModeProxy',
  'unknownIpMode',
  'hostnameOnly',
  'headless',
  'noClusterIP',
  'externalName',
  'familyWithoutClusterIP',
  'invalidAddress',
  'invalidName',
  'invalidPort',
  'unsupportedProtocol',
  'notLocalTrafficPolicy',
  'optedOut',
  'pointsAtNode',
  'clusterAddress',
  'externalIpNotAllowed',
  'externalIpsDisabled',
  'tooManyEntries',
  'overCapacity',
  'tooManySourceRanges',
  'sourceRangesUnsupported',
];

export interface Skip {
  service: string;
  reason: SkipReason;
  /** The address, port or field that was skipped, for logs. */
  detail: string;
  /**
   * How many addresses or ports this skip stands for (default 1): past a few of one reason, a
   * Service's further ones are folded into one skip, so that what one Service writes cannot
   * flood the logs, the Events or the metrics.
   */
  count?: number;
}

export interface Conflict {
  family: Family;
  externalIp: string;
  protocol: Protocol;
  port: number;
  winner: string;
  loser: string;
}

export interface FamilyState {
  /**
   * Sorted by (externalIp, protocol, port); keys are unique. A model's state makes the array when
   * it is first read (a whole write, a difference by comparison): a change that is written from
   * `changes` never makes it, so that a change costs what it changes, not the table.
   */
  entries: Entry[];
  /**
   * The model's hand-out these entries are: the same object for the same entries, named by a
   * later state's `changes.since`; the number of entries without making the array. Absent in a
   * state made by hand.
   */
  snapshot?: EntrySnapshot;
  localPodMatch: LocalPodMatch;
  /**
   * True when some entry has source ranges: the backend's objects then include what filters
   * sources (part of the family's shape, not of its entries).
   */
  sourceRanged?: boolean;
  /**
   * Per Service (Entry.service), how many of `entries` have source ranges; absent when none do.
   * A backend whose objects are per Service with ranges (nft's and iptables' source-range
   * chains) knows from it whether a change leaves a Service's objects wanted, without a record
   * of its own.
   */
  rangedByService?: ReadonlyMap<string, number>;
  /**
   * How `entries` came from an earlier hand-out of the same DesiredStateModel, when it knows: a
   * backend that programmed `since` can apply these changes without comparing lists.
   */
  changes?: EntryChanges;
}

/** One hand-out of a family's entries by the model (model/sorted-entries.ts). */
export interface EntrySnapshot {
  readonly length: number;
  /** The entries as one array, made on the first call; the same array every time. */
  entries(): Entry[];
}

/** `entries` = `since`'s without `removed`, with `added` (entries compared as objects). */
export interface EntryChanges {
  /** A hand-out the model gave earlier; the model never changes the entries it gave. */
  since: EntrySnapshot;
  removed: Entry[];
  added: Entry[];
}

/** How many entries a state holds, without making a model's array. */
export function entryCount(state: Pick<FamilyState, 'entries' | 'snapshot'>): number {
  return state.snapshot ? state.snapshot.length : state.entries.length;
}

/** What names a state's entries: its snapshot, or its array for a state made by hand. */
export function entriesIdentity(state: Pick<FamilyState, 'entries' | 'snapshot'>): object {
  return state.snapshot ?? state.entries;
}

/**
 * The state without entries, for what depends on its shape alone (which entries must not make
 * a model's array): `entries` empty, no `changes` nor `snapshot`.
 */
export function withoutEntries(state: FamilyState): FamilyState {
  const out: FamilyState = { entries: [], localPodMatch: state.localPodMatch };
  if (state.sourceRanged !== undefined) out.sourceRanged = state.sourceRanged;
  if (state.rangedByService !== undefined) out.rangedByService = state.rangedByService;
  return out;
}

export interface DesiredState {
  ipv4: FamilyState;
  ipv6: FamilyState;
  /** 1 << masqueradeBit */
  masqueradeMark: number;
  skips: Skip[];
  conflicts: Conflict[];
  /**
   * Which update of the model gave it: a later update has a higher number, also across a model
   * that replaces another (the controller's, when kube-proxy's configuration changes). Writes of
   * an older state never take the kernel back from a newer one. Absent: as new as the newest.
   */
  generation?: number;
}

/** The fields of an entry's match; a protocol read back from a kernel map may be a number. */
export type EntryKeyFields = Pick<Entry, 'family' | 'externalIp' | 'port'> & { protocol: Protocol | number };

/** A stable identity of an entry's match: one kernel map key. */
export function entryKey(e: EntryKeyFields): string {
  // join() builds one flat string: the model keeps a key per claim for as long as a Service lives.
  return [e.family, e.externalIp, e.protocol, e.port].join('|');
}

/** Whether two entries filter sources alike (both unranged, or the same ranges and node rule). */
export function sameSourceRanges(
  a: Pick<Entry, 'sourceRanges' | 'sourcesFromNode'>,
  b: Pick<Entry, 'sourceRanges' | 'sourcesFromNode'>,
): boolean {
  const x = a.sourceRanges;
  const y = b.sourceRanges;
  if (a.sourcesFromNode !== b.sourcesFromNode) return false;
  if (x === y) return true;
  if (!x || !y || x.length !== y.length) return false;
  return x.every((r, i) => r === y[i]);
}

// Who a Service is, and which of two Services comes first where both ask for one thing (a map
// key, or room in the entries the backend is given): the oldest, then by namespace/name.

export function serviceKey(svc: Pick<ServiceInfo, 'namespace' | 'name'>): string {
  return flat([svc.namespace, '/', svc.name]);
}

/**
 * A string kept for as long as its Service: joined, it is one flat string; a template literal
 * would be a tree of pieces, several times its size.
 */
export function flat(parts: unknown[]): string {
  return parts.join('');
}

/** What decides which of several Services claiming one map key holds it. */
export interface Precedence {
  created: number;
  service: string;
  /** Order of first sight: breaks ties between two objects of one name (possible in files only). */
  seq: number;
}

/** The holder of a key: the oldest Service, ties broken by namespace/name (then by first sight). */
export function precedes(a: Precedence, b: Precedence): boolean {
  if (a.created !== b.created) return a.created < b.created;
  if (a.service !== b.service) return a.service < b.service;
  return a.seq < b.seq;
}

/** Milliseconds since the epoch; a Service without a valid time is the youngest. */
export function creationTime(svc: ServiceInfo): number {
  const t = svc.creationTimestamp ? Date.parse(svc.creationTimestamp) : NaN;
  return Number.isFinite(t) ? t : Number.POSITIVE_INFINITY;
}
