// Desired state -> the typed nftables objects of our tables: their names, the map's size, and
// what one family's table holds for a state (desiredTable). The transactions made of them are
// transactions.ts's; the JSON the executor applies and the text --dry-run prints are both written
// from these objects (objects.ts). Pure: no I/O.

import { createHash } from 'node:crypto';
import { FAMILIES, type DesiredState, type Entry, type Family, type FamilyState } from '../../model/types.js';
import type { TranslatedSource } from '../../driver/driver.js';
import { tableText, type TableContents } from './text.js';
import {
  type ChainObject,
  type CounterObject,
  type ElementObject,
  type MapElement,
  type MapObject,
  type NftFamily,
  type RuleObject,
  type SetObject,
  type Statement,
  type TableObject,
} from './objects.js';

export type { NftFamily } from './objects.js';

export const TABLE_NAME = 'ipvs-node-controller';
export const MAP_NAME = 'external-ip-to-cluster-ip';
/** The map's keys again, as a set: the lookup of kernels that refuse a map looked up as a set. */
export const KEY_SET_NAME = 'external-ip-keys';
export const LOCAL_POD_SET = 'local-pod-cidrs';
/**
 * The keys of entries that translate only some sources (loadBalancerSourceRanges), each jumping
 * to its Service's source-range chain (SOURCE_CHAIN_PREFIX).
 */
export const SOURCE_CHECK_MAP = 'source-range-checks';
/** Those entries' keys, each with its own address as a source: the node's own connections. */
export const OWN_SOURCE_SET = 'source-range-own-addresses';
/** A ranged Service's chain: its ranges, once, whatever its entries (sourceChainName). */
export const SOURCE_CHAIN_PREFIX = 'source-ranges-';
/** The source-range sets of versions before 0.5, removed when a table is written whole. */
const LEGACY_SOURCE_SETS = ['source-ranged-keys', 'source-ranges'] as const;
export const PREROUTING_CHAIN = 'prerouting-from-local-pods';
export const OUTPUT_CHAIN = 'output-from-node';
export const TRANSLATE_CHAIN = 'mark-for-masquerade-and-dnat';
/**
 * The named counters of the translating rules: connections from local pods, and from the node
 * itself (its processes and host-network pods), translated (a nat chain sees a connection's
 * first packet only). They outlive rule rewrites and whole writes; only the table's removal
 * (--cleanup, a replaced table) resets them.
 */
export const TRANSLATED_COUNTERS: Record<TranslatedSource, string> = {
  pods: 'translated-from-pods',
  node: 'translated-from-node',
};
/** dstnat - 10: before kube-proxy's NAT. Written as a number: nft 1.0.6 rejects `dstnat` on output. */
export const CHAIN_PRIORITY = -110;

export const NFT_FAMILY: Record<Family, NftFamily> = { ipv4: 'ip', ipv6: 'ip6' };
const ADDR_TYPE: Record<Family, string> = { ipv4: 'ipv4_addr', ipv6: 'ipv6_addr' };

/** The smallest map size written: a few Services never cause a rewrite to grow the map. */
export const MIN_MAP_SIZE = 1024;

/**
 * The size a map of `entries` elements is declared with: a power of two, at least twice the
 * entries, so that partial syncs can add as many again before the map must be replaced. The
 * kernel allocates the buckets for it at once (8 bytes a bucket, 4/3 buckets an element:
 * 0.5 MiB at 32,768), the elements as they come.
 */
export function mapSize(entries: number): number {
  let size = MIN_MAP_SIZE;
  while (size < entries * 2) size *= 2;
  return size;
}

/**
 * How our rules ask whether a packet's (daddr, protocol, dport) has an entry:
 * - `map`: they look the key up in the map itself. One element per entry. Linux 5.10 and 6.1
 *   refuse it (nf_tables' lookup of a map without reading its data is EINVAL there); 6.12 takes it.
 * - `set`: they look it up in a set holding the map's keys (KEY_SET_NAME), which every kernel
 *   takes. Each entry is an element of both, written in the same transaction.
 * The driver probes which one the kernel takes (keyLookup in nft-driver.ts).
 */
export type KeyLookup = 'map' | 'set';

/** The map element of an entry. */
export function mapElement(e: Entry): MapElement {
  return { key: [e.externalIp, e.protocol.toLowerCase(), e.port], value: e.clusterIp, comment: e.service };
}

/**
 * The objects of one family's table, elements aside: each has a fixed name, whatever the state;
 * the map is declared with `size` for `entries` elements (mapSize).
 */
export function tableObjects(family: Family, entries = 0) {
  const keyType = [ADDR_TYPE[family], 'inet_proto', 'inet_service'];
  const nf = NFT_FAMILY[family];
  const table: TableObject = {
    kind: 'table',
    family: nf,
    name: TABLE_NAME,
    comment: 'managed by ipvs-node-controller; do not edit',
  };
  const inTable = { family: nf, table: TABLE_NAME };
  const map: MapObject = {
    kind: 'map',
    ...inTable,
    name: MAP_NAME,
    type: keyType,
    data: ADDR_TYPE[family],
    size: mapSize(entries),
    comment: 'external IP . protocol . port : ClusterIP',
  };
  const localPods: SetObject = {
    kind: 'set',
    ...inTable,
    name: LOCAL_POD_SET,
    type: ADDR_TYPE[family],
    flags: ['interval'],
    comment: 'local pod CIDRs',
  };
  const keySet: SetObject = {
    kind: 'set',
    ...inTable,
    name: KEY_SET_NAME,
    type: keyType,
    size: mapSize(entries),
    comment: `the keys of ${MAP_NAME}`,
  };
  const sourceChecks: MapObject = {
    kind: 'map',
    ...inTable,
    name: SOURCE_CHECK_MAP,
    type: keyType,
    data: 'verdict',
    comment: "keys translated only from their source ranges : their Service's source-range chain",
  };
  const ownSources: SetObject = {
    kind: 'set',
    ...inTable,
    name: OWN_SOURCE_SET,
    type: [...keyType, ADDR_TYPE[family]],
    comment: 'external IP . protocol . port . the external IP itself, as a source',
  };
  const legacySourceSets: SetObject[] = LEGACY_SOURCE_SETS.map((name) => ({
    kind: 'set',
    ...inTable,
    name,
    type: name === 'source-ranges' ? [...keyType, ADDR_TYPE[family]] : keyType,
    ...(name === 'source-ranges' ? { flags: ['interval'] as Array<'interval'> } : {}),
  }));
  const nat = (hook: 'prerouting' | 'output') =>
    ({ type: 'nat', hook, priority: CHAIN_PRIORITY, policy: 'accept' }) as const;
  const prerouting: ChainObject = { kind: 'chain', ...inTable, name: PREROUTING_CHAIN, base: nat('prerouting') };
  const output: ChainObject = { kind: 'chain', ...inTable, name: OUTPUT_CHAIN, base: nat('output') };
  const translate: ChainObject = { kind: 'chain', ...inTable, name: TRANSLATE_CHAIN };
  const counter = (name: string): CounterObject => ({ kind: 'counter', ...inTable, name });
  const counters = { pods: counter(TRANSLATED_COUNTERS.pods), node: counter(TRANSLATED_COUNTERS.node) };
  return {
    table,
    counters,
    map,
    keySet,
    localPods,
    sourceChecks,
    ownSources,
    legacySourceSets,
    prerouting,
    output,
    translate,
    chains: [prerouting, output, translate],
  };
}

export function mapElements(family: Family, elements: readonly MapElement[]): ElementObject {
  return { kind: 'element', family: NFT_FAMILY[family], table: TABLE_NAME, set: MAP_NAME, map: true, elements };
}

/** The keys of map elements as elements of the key set. */
export function keySetElements(family: Family, elements: readonly MapElement[]): ElementObject {
  return { kind: 'element', family: NFT_FAMILY[family], table: TABLE_NAME, set: KEY_SET_NAME, keys: true, elements };
}

/**
 * The chain of a ranged Service: `source-ranges-` and 16 hex digits of a hash of its
 * `namespace/name`, the same at every start (a chain name is at most 256 bytes; a Service's name
 * is no part of it).
 */
export function sourceChainName(service: string): string {
  return SOURCE_CHAIN_PREFIX + createHash('sha256').update(service).digest('hex').slice(0, 16);
}

/** What filters the sources of ranged entries: the elements, and each Service's chain. */
export interface SourceRangeObjects {
  /** Each ranged entry's key, jumping to its Service's chain. */
  checks: Extract<ElementObject, { verdicts: true }>;
  /** Each ranged entry's key with its own address as a source. */
  own: Extract<ElementObject, { keys: true }>;
  /** A chain per ranged Service, and their rules. */
  chains: ChainObject[];
  rules: RuleObject[];
}

/** The source-range check element of a ranged entry. */
function checkKey(e: Entry): Array<string | number> {
  return [e.externalIp, e.protocol.toLowerCase(), e.port];
}

/**
 * The objects that filter the sources of `entries` (those with sourceRanges). A Service's chain:
 * - a packet from the entry's own address (a node process's connection: kube-ipvs0 gives it the
 *   address itself as its source) goes on to be translated when a range holds the node IP
 *   (sourcesFromNode), else is left untranslated, whatever the ranges hold;
 * - a source inside one of the Service's ranges goes on (`return`);
 * - anything else is left untranslated (`accept`: this chain ends, kube-proxy's chains and its
 *   own source-range filter then see the packet, as without the controller).
 * The ranges are an anonymous set of the rule: a range edited replaces the rule, and with it the
 * set, atomically (packets meet the old rule or the new one), where elements changed in a named
 * interval set can be missed by a lookup while the transaction commits (rbtree sets, on the
 * kernels nodes run).
 */
export function sourceRangeObjects(family: Family, entries: readonly Entry[]): SourceRangeObjects {
  const nf = NFT_FAMILY[family];
  const inTable = { kind: 'element', family: nf, table: TABLE_NAME } as const;
  const checks: Array<{ key: Array<string | number>; chain: string }> = [];
  const own: MapElement[] = [];
  const chains: ChainObject[] = [];
  const rules: RuleObject[] = [];
  const seen = new Map<string, string>();
  for (const e of entries) {
    if (!e.sourceRanges) continue;
    let chain = seen.get(e.service);
    if (chain === undefined) {
      chain = sourceChainName(e.service);
      seen.set(e.service, chain);
      const object: ChainObject = { kind: 'chain', family: nf, table: TABLE_NAME, name: chain };
      chains.push(object);
      rules.push(...sourceChainRules(object, e));
    }
    const key = checkKey(e);
    checks.push({ key, chain });
    own.push({ key: [...key, e.externalIp], value: '' });
  }
  return {
    checks: { ...inTable, set: SOURCE_CHECK_MAP, verdicts: true, elements: checks },
    own: { ...inTable, set: OWN_SOURCE_SET, keys: true, elements: own },
    chains,
    rules,
  };
}

/** The rules of a ranged Service's chain, from one of its ranged entries (sourceRangeObjects). */
function sourceChainRules(chain: ChainObject, e: Entry): RuleObject[] {
  const rule = (statements: Statement[]): RuleObject => ({
    kind: 'rule',
    family: chain.family,
    table: chain.table,
    chain: chain.name,
    statements,
  });
  const prefixes = (e.sourceRanges ?? []).map((range) => {
    const [address, length] = range.split('/');
    return { address: address!, length: Number(length) };
  });
  return [
    rule([{ kind: 'keyAndSourceIn', set: OWN_SOURCE_SET }, { kind: e.sourcesFromNode ? 'return' : 'accept' }]),
    rule([{ kind: 'sourceInPrefixes', prefixes }, { kind: 'return' }]),
    rule([{ kind: 'accept' }]),
  ];
}

/** What one family's table holds when it matches `state`. */
export interface DesiredTable extends TableContents {
  /** The translating rules' counters (TRANSLATED_COUNTERS). */
  counters: CounterObject[];
  /** The map elements (also among `elements` when there are any). */
  mapElements: ElementObject;
  /** How the rules look a key up; with `set`, the key set's elements are among `elements` too. */
  lookup: KeyLookup;
  /** The key set's elements (lookup `set`), else undefined. */
  keySetElements?: ElementObject;
  /** Our objects that must not exist in this state (the pod set in interface modes, say). */
  unwanted: Array<ChainObject | SetObject>;
  /** What filters sources (sourceRangeObjects); its elements also among `elements` when any. */
  sourceRanges: SourceRangeObjects;
}

export function desiredTable(
  family: Family,
  state: FamilyState,
  masqueradeMark: number,
  lookup: KeyLookup = 'map',
): DesiredTable {
  const o = tableObjects(family, state.entries.length);
  const match = state.localPodMatch;
  const rule = (chain: ChainObject, statements: Statement[]): RuleObject => ({
    kind: 'rule',
    family: chain.family,
    table: chain.table,
    chain: chain.name,
    statements,
  });
  const keyIn: Statement = { kind: 'destinationIn', name: lookup === 'set' ? KEY_SET_NAME : MAP_NAME };
  // Only what IPVS would capture: a destination bound on the node (kube-ipvs0). Rules left behind
  // (a controller killed, an uninstall without --cleanup) go inert once kube-proxy unbinds the
  // address, as it does when it leaves IPVS mode. After the key, so that a new connection to
  // anything else costs no route lookup.
  const toLocal: Statement = { kind: 'localAddress', field: 'daddr' };
  const jump: Statement = { kind: 'jump', chain: TRANSLATE_CHAIN };
  // Pods: DNAT without the mark, their source kept (kube-proxy 1.24+ in IPVS mode, and its
  // iptables and nftables modes, let a pod's traffic to an external IP keep its source).
  const dnat: Statement = { kind: 'dnatByMap', map: MAP_NAME };
  const elements = state.entries.map(mapElement);
  const mapElems = mapElements(family, elements);
  const t: DesiredTable = {
    table: o.table,
    sets: [],
    maps: [o.map],
    counters: [o.counters.pods, o.counters.node],
    elements: [],
    chains: [],
    rules: [],
    notes: [],
    mapElements: mapElems,
    lookup,
    unwanted: [],
    sourceRanges: sourceRangeObjects(family, state.entries),
  };
  if (lookup === 'set') {
    t.sets.push(o.keySet);
    t.keySetElements = keySetElements(family, elements);
    if (elements.length > 0) t.elements.push(t.keySetElements);
  }
  // Pod sources are matched by prefix in the rule itself, one rule per CIDR, not looked up in an
  // interval set: a transaction that touches an interval set (even adding back an element it
  // holds) can let a packet of the commit window through unmatched on the kernels users run
  // (rbtree sets; fixed upstream in 2026), where rules swap atomically. A node has a few CIDRs.
  let podMatches: Statement[] = [];
  switch (match.kind) {
    case 'cidrs':
      podMatches = match.cidrs.map((c) => {
        const [address, length] = c.split('/');
        return { kind: 'sourceInPrefix', address: address!, length: Number(length) };
      });
      if (podMatches.length === 0) t.notes!.push('no prerouting chain: no local pod CIDR');
      break;
    case 'interface':
      podMatches = [{ kind: 'inputInterface', name: match.name }];
      break;
    case 'interfacePrefix':
      podMatches = [{ kind: 'inputInterface', name: `${match.prefix}*` }];
      break;
    case 'none':
      t.notes!.push(`no prerouting chain: ${match.reason}`);
      break;
  }
  // The pod set and the source-range sets earlier versions kept: removed when the table is written.
  t.unwanted.push(o.localPods, ...o.legacySourceSets);
  if (state.entries.length > 0) t.elements.push(mapElems);
  // Entries with source ranges: the first rule of each base chain jumps to the Service's chain,
  // where a source the Service does not let through leaves our chains untranslated (kube-proxy's
  // own source-range filter then sees the packet). Always there, whether any entry has ranges or
  // not: a Service that adds or drops its ranges changes elements and its chain, never the shape.
  const gate = rule(o.output, [{ kind: 'verdictByMap', map: SOURCE_CHECK_MAP }]);
  t.maps.push(o.sourceChecks);
  t.sets.push(o.ownSources);
  const sources = t.sourceRanges;
  if (sources.checks.elements.length > 0) t.elements.push(sources.checks, sources.own);
  if (podMatches.length > 0) {
    t.chains.push(o.prerouting);
    t.rules.push({ ...gate, chain: o.prerouting.name });
    const counted: Statement = { kind: 'counter', name: TRANSLATED_COUNTERS.pods };
    for (const podMatch of podMatches) t.rules.push(rule(o.prerouting, [podMatch, keyIn, toLocal, counted, dnat]));
  } else {
    t.unwanted.push(o.prerouting);
  }
  t.chains.push(o.output, o.translate, ...sources.chains);
  t.rules.push(gate);
  t.rules.push(...sources.rules);
  t.rules.push(
    rule(o.output, [keyIn, { kind: 'localAddress', field: 'saddr' }, toLocal, jump]),
    // The node's own traffic: its source is a local address (the LoadBalancer IP itself, bound on
    // kube-ipvs0) that a reply from another node cannot find, so it is marked for kube-proxy's
    // masquerade, then DNAT'ed. One rule: mark, then DNAT.
    rule(o.translate, [
      { kind: 'counter', name: TRANSLATED_COUNTERS.node },
      { kind: 'orMark', mark: masqueradeMark },
      dnat,
    ]),
  );
  return t;
}

/** What --dry-run prints: both tables as `nft -f` input (what `nft list table` would show, with elements). */
export function renderDesiredStateText(desired: DesiredState, lookup: KeyLookup = 'map'): string {
  return FAMILIES.map((f) => tableText(desiredTable(f, desired[f], desired.masqueradeMark, lookup))).join('\n');
}
