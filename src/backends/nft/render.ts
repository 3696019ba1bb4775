// Desired state -> the typed nftables objects of our tables: their names, the map's size, and
// what one family's table holds for a state (desiredTable). The transactions made of them are
// transactions.ts's; the JSON the executor applies and the text --dry-run prints are both written
// from these objects (objects.ts). Pure: no I/O.

import { FAMILIES, type DesiredState, type Entry, type Family, type FamilyState } from '../../model/types.js';
import {
  tableText,
  type ChainObject,
  type ElementObject,
  type MapElement,
  type MapObject,
  type NftFamily,
  type RuleObject,
  type SetObject,
  type SourceRangeElement,
  type Statement,
  type TableContents,
  type TableObject,
} from './objects.js';

export type { NftFamily } from './objects.js';

export const TABLE_NAME = 'ipvs-node-controller';
export const MAP_NAME = 'external-ip-to-cluster-ip';
/** The map's keys again, as a set: the lookup of kernels that refuse a map looked up as a set. */
export const KEY_SET_NAME = 'external-ip-keys';
export const LOCAL_POD_SET = 'local-pod-cidrs';
/** The keys of entries that translate only some sources (loadBalancerSourceRanges). */
export const SOURCE_RANGED_KEY_SET = 'source-ranged-keys';
/** Those entries' keys, each with a source prefix translated. */
export const SOURCE_RANGE_SET = 'source-ranges';
export const PREROUTING_CHAIN = 'prerouting-from-local-pods';
export const OUTPUT_CHAIN = 'output-from-node';
export const TRANSLATE_CHAIN = 'mark-for-masquerade-and-dnat';
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
  const rangedKeys: SetObject = {
    kind: 'set',
    ...inTable,
    name: SOURCE_RANGED_KEY_SET,
    type: keyType,
    comment: 'keys translated only from their source ranges',
  };
  const sourceRanges: SetObject = {
    kind: 'set',
    ...inTable,
    name: SOURCE_RANGE_SET,
    type: [...keyType, ADDR_TYPE[family]],
    flags: ['interval'],
    comment: 'external IP . protocol . port . source range translated',
  };
  const nat = (hook: 'prerouting' | 'output') =>
    ({ type: 'nat', hook, priority: CHAIN_PRIORITY, policy: 'accept' }) as const;
  const prerouting: ChainObject = { kind: 'chain', ...inTable, name: PREROUTING_CHAIN, base: nat('prerouting') };
  const output: ChainObject = { kind: 'chain', ...inTable, name: OUTPUT_CHAIN, base: nat('output') };
  const translate: ChainObject = { kind: 'chain', ...inTable, name: TRANSLATE_CHAIN };
  return {
    table,
    map,
    keySet,
    localPods,
    rangedKeys,
    sourceRanges,
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

/** The elements of the two source-range sets for entries (those with sourceRanges). */
export function sourceRangeElements(
  family: Family,
  entries: readonly Entry[],
): { keys: ElementObject; sources: ElementObject } {
  const keys: MapElement[] = [];
  const sources: SourceRangeElement[] = [];
  for (const e of entries) {
    if (!e.sourceRanges) continue;
    const key = [e.externalIp, e.protocol.toLowerCase(), e.port];
    keys.push({ key, value: '' });
    for (const range of e.sourceRanges) {
      const [address, length] = range.split('/');
      sources.push({ key, source: { address: address!, length: Number(length) } });
    }
  }
  const inTable = { kind: 'element', family: NFT_FAMILY[family], table: TABLE_NAME } as const;
  return {
    keys: { ...inTable, set: SOURCE_RANGED_KEY_SET, keys: true, elements: keys },
    sources: { ...inTable, set: SOURCE_RANGE_SET, sources: true, elements: sources },
  };
}

/** What one family's table holds when it matches `state`. */
export interface DesiredTable extends TableContents {
  /** The map elements (also among `elements` when there are any). */
  mapElements: ElementObject;
  /** How the rules look a key up; with `set`, the key set's elements are among `elements` too. */
  lookup: KeyLookup;
  /** The key set's elements (lookup `set`), else undefined. */
  keySetElements?: ElementObject;
  /** Our objects that must not exist in this state (the pod set in interface modes, say). */
  unwanted: Array<ChainObject | SetObject>;
  /** The source-range sets' elements (state.sourceRanged), also among `elements` when any. */
  sourceRangeElements?: { keys: ElementObject; sources: ElementObject };
}

export function desiredTable(
  family: Family,
  state: FamilyState,
  masqueradeMark: number,
  lookup: KeyLookup = 'map',
  /** Whether the source-range sets may exist from an earlier state and must go when unused. */
  sourceRangeSetsMayExist = false,
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
    elements: [],
    chains: [],
    rules: [],
    notes: [],
    mapElements: mapElems,
    lookup,
    unwanted: [],
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
  // The pod set earlier versions kept: removed when the table is written.
  t.unwanted.push(o.localPods);
  if (state.entries.length > 0) t.elements.push(mapElems);
  // Entries with source ranges: a source outside them leaves the chain untranslated, before the
  // jump (kube-proxy's own source-ranges firewall then sees the packet). Only in a table that has
  // such entries: others keep the one-lookup path.
  const gate: Statement[] = [
    { kind: 'destinationIn', name: SOURCE_RANGED_KEY_SET },
    { kind: 'sourceNotInRanges', set: SOURCE_RANGE_SET },
    { kind: 'return' },
  ];
  if (state.sourceRanged) {
    t.sets.push(o.rangedKeys, o.sourceRanges);
    t.sourceRangeElements = sourceRangeElements(family, state.entries);
    if (t.sourceRangeElements.keys.elements.length > 0) t.elements.push(t.sourceRangeElements.keys);
    if (t.sourceRangeElements.sources.elements.length > 0) t.elements.push(t.sourceRangeElements.sources);
  } else if (sourceRangeSetsMayExist) {
    t.unwanted.push(o.rangedKeys, o.sourceRanges);
  }
  if (podMatches.length > 0) {
    t.chains.push(o.prerouting);
    if (state.sourceRanged) t.rules.push(rule(o.prerouting, gate));
    for (const podMatch of podMatches) t.rules.push(rule(o.prerouting, [podMatch, keyIn, toLocal, dnat]));
  } else {
    t.unwanted.push(o.prerouting);
  }
  t.chains.push(o.output, o.translate);
  if (state.sourceRanged) t.rules.push(rule(o.output, gate));
  t.rules.push(
    rule(o.output, [keyIn, { kind: 'localAddress', field: 'saddr' }, toLocal, jump]),
    // The node's own traffic: its source is a local address (the LoadBalancer IP itself, bound on
    // kube-ipvs0) that a reply from another node cannot find, so it is marked for kube-proxy's
    // masquerade, then DNAT'ed. One rule: mark, then DNAT.
    rule(o.translate, [{ kind: 'orMark', mark: masqueradeMark }, dnat]),
  );
  return t;
}

/** What --dry-run prints: both tables as `nft -f` input (what `nft list table` would show, with elements). */
export function renderDesiredStateText(desired: DesiredState, lookup: KeyLookup = 'map'): string {
  return FAMILIES.map((f) => tableText(desiredTable(f, desired[f], desired.masqueradeMark, lookup))).join('\n');
}
