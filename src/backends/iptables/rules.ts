// The rules of one entry, and the checks every value passes before it is written into one. Pure.
//
// The rules keep the original controller's shape: per entry a DNAT rule, commented
// `namespace/name` (unless --iptables-comments=false: RuleContext.comments), in the prerouting
// chain (traffic from local pods), and a masquerade-mark rule then a DNAT rule in the output
// chain (traffic whose source is local to the node), with changes the contract asks for: pod traffic is not marked (the original marked it too, before kube-proxy
// 1.24 answered pods itself), only a destination local to the node is translated, and every rule
// also matches protocol and destination port, so that traffic to a port no Service
// lists is left alone and Services sharing an address each reach their own ClusterIP. The
// address-only shape of the original is never equivalent (no Service lists every port of every
// protocol), so it is not used. Which chain a rule goes to is layout.ts's business.
//
// An entry with source ranges has the same bucket rules but for their target: a goto to its
// Service's source-range chain of the hook, whose rules (serviceRules) hold the Service's ranges
// once, decide by the source and translate.
//
// Every value written into a rule is checked again here; an entry that fails is left out and
// reported, and the rest is programmed. Rule specs are written in the order `iptables-save`
// prints them, so what we render can be compared with what the kernel holds.

import { cidrContains, formatCidr, parseCidr, parseIp, type ParsedCidr } from '../../model/ip.js';
import { PROTOCOLS, type Entry, type Family, type LocalPodMatch } from '../../model/types.js';
import { OUTPUT_CHAIN, PREROUTING_CHAIN, serviceChain } from './layout.js';
import { KUBE_MARK_MASQ } from './parse.js';

/** xt_comment keeps 255 bytes. */
const MAX_COMMENT_LENGTH = 255;
/** IFNAMSIZ is 16 with the terminating NUL. */
const MAX_INTERFACE_NAME_LENGTH = 15;

export interface Rejection {
  family: Family;
  /** The entry or match that was left out, for logs (`default/svc 192.0.2.1 tcp/80`). */
  item: string;
  reason: string;
}

/** The mark as iptables writes it; the model's `1 << 31` is negative in JavaScript. */
export function formatMark(mark: number): string {
  const unsigned = mark >>> 0;
  if (!Number.isInteger(mark) || unsigned === 0 || (unsigned & (unsigned - 1)) !== 0) {
    throw new RangeError(`the masquerade mark must be a single bit, got ${mark}`);
  }
  return `0x${unsigned.toString(16)}`;
}

function addressProblem(family: Family, what: string, text: string): string | undefined {
  const ip = parseIp(text);
  if (!ip) return `${what} ${JSON.stringify(text)} is not an IP address`;
  if (ip.family !== family) return `${what} ${text} is not ${family}`;
  if (ip.address !== text) return `${what} ${text} is not in canonical form`;
  return undefined;
}

/** Why an entry cannot be written into a rule of `family`; undefined when it can. */
export function entryProblem(family: Family, e: Entry): string | undefined {
  if (e.family !== family) return `entry of ${e.family} in the ${family} state`;
  const external = addressProblem(family, 'external IP', e.externalIp);
  if (external) return external;
  const cluster = addressProblem(family, 'ClusterIP', e.clusterIp);
  if (cluster) return cluster;
  if (!PROTOCOLS.includes(e.protocol)) return `protocol ${JSON.stringify(e.protocol)} is not TCP, UDP or SCTP`;
  if (!Number.isInteger(e.port) || e.port < 1 || e.port > 65535) return `port ${String(e.port)} is not in 1..65535`;
  if (typeof e.service !== 'string' || !/^[a-z0-9./-]+$/.test(e.service)) {
    return `comment ${JSON.stringify(e.service)} has characters other than a-z 0-9 - . /`;
  }
  if (e.service.length > MAX_COMMENT_LENGTH) return `comment is longer than ${MAX_COMMENT_LENGTH} characters`;
  if (e.sourceRanges !== undefined && !Array.isArray(e.sourceRanges)) return 'source ranges are not a list';
  // The ranges themselves are checked once per Service (rangesProblem), not once per entry.
  return undefined;
}

/** Why a Service's source ranges cannot be written into rules of `family`; undefined when they can. */
export function rangesProblem(family: Family, ranges: readonly string[]): string | undefined {
  for (const range of ranges) {
    const cidr = parseCidr(range);
    if (!cidr || cidr.family !== family || formatCidr(cidr) !== range) {
      return `source range ${JSON.stringify(range)} is not a canonical ${family} CIDR`;
    }
  }
  return undefined;
}

/** Entry.sourcesFromNode: the external IP itself as the source is translated. */
function fromNode(e: Entry): boolean {
  return e.sourcesFromNode === true;
}

/**
 * Whether two entries with source ranges (of one Service) share what its source-range chains
 * hold: the ClusterIP, the ranges and sourcesFromNode.
 */
export function shareRangedService(a: Entry, b: Entry): boolean {
  if (a.clusterIp !== b.clusterIp || fromNode(a) !== fromNode(b)) return false;
  const x = a.sourceRanges!;
  const y = b.sourceRanges!;
  return x === y || (x.length === y.length && x.every((r, i) => r === y[i]));
}

/**
 * Linux's rules for interface names (1..15 bytes, not `.` or `..`, no `/`, `:` or whitespace),
 * narrowed to printable ASCII without the characters iptables-restore would not take literally.
 */
export function interfaceNameProblem(name: unknown, wildcard: boolean): string | undefined {
  const max = wildcard ? MAX_INTERFACE_NAME_LENGTH - 1 : MAX_INTERFACE_NAME_LENGTH;
  if (typeof name !== 'string' || name.length === 0 || name.length > max) {
    return `interface ${wildcard ? 'prefix' : 'name'} ${JSON.stringify(name)} must be 1 to ${max} characters`;
  }
  if (name === '.' || name === '..') return `interface name ${JSON.stringify(name)} is not allowed by Linux`;
  if (!/^[\x21-\x7e]+$/.test(name) || /[/:]/.test(name)) {
    return `interface name ${JSON.stringify(name)} has a character Linux does not allow`;
  }
  if (/["'\\!+*#]/.test(name) || name.startsWith('-')) {
    return `interface name ${JSON.stringify(name)} has a character iptables would not read literally`;
  }
  return undefined;
}

/** How a write names an (external IP, protocol, port): one entry per key and family. */
export function flowKey(e: Pick<Entry, 'externalIp' | 'protocol' | 'port'>): string {
  return `${e.externalIp} ${e.protocol} ${e.port}`;
}

export function entryLabel(e: Entry): string {
  return `${String(e.service)} ${String(e.externalIp)} ${String(e.protocol).toLowerCase()}/${String(e.port)}`;
}

/** The prerouting source matches for local pods: `-s CIDR` each, or one `-i` match; none for 'none'. */
function sourceMatches(family: Family, match: LocalPodMatch, rejected: Rejection[]): string[] {
  switch (match.kind) {
    case 'none':
      return [];
    case 'cidrs': {
      const out: string[] = [];
      for (const cidr of match.cidrs) {
        const parsed = parseCidr(cidr);
        if (!parsed || parsed.family !== family) {
          rejected.push({ family, item: `local pod CIDR ${JSON.stringify(cidr)}`, reason: `not an ${family} CIDR` });
        } else {
          out.push(`-s ${formatCidr(parsed)}`);
        }
      }
      return out;
    }
    case 'interface': {
      const problem = interfaceNameProblem(match.name, false);
      if (problem) {
        rejected.push({ family, item: 'pod bridge interface', reason: problem });
        return [];
      }
      return [`-i ${match.name}`];
    }
    case 'interfacePrefix': {
      const problem = interfaceNameProblem(match.prefix, true);
      if (problem) {
        rejected.push({ family, item: 'pod interface name prefix', reason: problem });
        return [];
      }
      return [`-i ${match.prefix}+`];
    }
  }
}

/** `-s` comes before `-d` and `-i` after it in -save's order. */
function withDestination(source: string, destination: string): string {
  if (!source.startsWith('-s ')) return `${destination} ${source}`;
  const i = source.indexOf(' -i ');
  return i < 0 ? `${source} ${destination}` : `${source.slice(0, i)} ${destination}${source.slice(i)}`;
}

/** What the rules of a family's entries share: its local pod match and its mark target. */
export interface RuleContext {
  family: Family;
  /** The prerouting source matches; none: no prerouting rules (the local pods cannot be recognised). */
  sources: string[];
  /** The local pod CIDRs when pods are recognised by them; undefined for an interface match. */
  podCidrs?: ParsedCidr[];
  markTarget: string;
  /** Whether each rule carries its Service's `namespace/name` as a comment (--iptables-comments). */
  comments: boolean;
}

/** A rule's comment match with the space before it; none without comments. */
function commentOf(ctx: RuleContext, service: string): string {
  return ctx.comments ? ` -m comment --comment "${service}"` : '';
}

/** The context of a family's rules; a local pod match that fails validation goes to `rejected`. */
export function ruleContext(
  family: Family,
  localPodMatch: LocalPodMatch,
  masqueradeMark: number,
  useKubeMarkMasq: boolean,
  comments: boolean,
  rejected: Rejection[],
): RuleContext {
  const markTarget = useKubeMarkMasq ? `-j ${KUBE_MARK_MASQ}` : `-j MARK --or-mark ${formatMark(masqueradeMark)}`;
  const sources = sourceMatches(family, localPodMatch, rejected);
  const ctx: RuleContext = { family, sources, markTarget, comments };
  if (localPodMatch.kind === 'cidrs') ctx.podCidrs = sources.map((s) => parseCidr(s.slice('-s '.length))!);
  return ctx;
}

/** The hooks an entry has rules in. */
export type HookName = 'prerouting' | 'output';

/**
 * The rules of one entry that passed entryProblem in one hook, specs without `-A CHAIN`: in
 * prerouting (pods) a DNAT rule per source match, the pod's source kept as kube-proxy 1.24+ keeps
 * it; in output (the node) a mark rule then a DNAT rule, the node's source being a local address
 * that a reply from another node cannot find. Both translate only a destination bound on the node
 * (`--dst-type LOCAL`: what IPVS would capture), so that rules left behind go inert once kube-proxy
 * unbinds the address. An entry with source ranges has one rule per source match in either hook,
 * with the same matches: a goto to its Service's source-range chain (serviceRules), which decides
 * by the source and translates, whatever the number of ranges.
 */
export function entryRules(ctx: RuleContext, e: Entry, hook: HookName): string[] {
  const prefix = ctx.family === 'ipv4' ? 32 : 128;
  const proto = e.protocol.toLowerCase();
  const comment = commentOf(ctx, e.service);
  const destination = `-d ${e.externalIp}/${prefix}`;
  const ranged = e.sourceRanges !== undefined;
  const entryChain = hook === 'prerouting' ? PREROUTING_CHAIN : OUTPUT_CHAIN;
  const target = ranged ? `-g ${serviceChain(entryChain, e.service)}` : `-j DNAT --to-destination ${e.clusterIp}`;
  const rules: string[] = [];
  if (hook === 'prerouting') {
    for (const source of ctx.sources) {
      const head = `${withDestination(source, destination)} -p ${proto}${comment}`;
      rules.push(`${head} -m addrtype --dst-type LOCAL -m ${proto} --dport ${e.port} ${target}`);
    }
  } else {
    const head = `${destination} -p ${proto}${comment} -m addrtype --src-type LOCAL --dst-type LOCAL -m ${proto} --dport ${e.port}`;
    if (ranged) rules.push(`${head} ${target}`);
    else rules.push(`${head} ${ctx.markTarget}`, `${head} ${target}`);
  }
  return rules;
}

/**
 * What the source-range chains of a Service are made of: what all its entries with source ranges
 * in the family share (the model gives them the same), and their addresses.
 */
export interface RangedService {
  /** `namespace/name`. */
  service: string;
  clusterIp: string;
  sourceRanges: readonly string[];
  /** Entry.sourcesFromNode. */
  sourcesFromNode: boolean;
  /** The external IPs of its entries with source ranges, sorted. */
  addresses: readonly string[];
}

/** What the source-range chains of a Service hold, from its entries with source ranges (at least one, sharing them). */
export function rangedServiceOf(entries: Iterable<Entry>): RangedService {
  let first: Entry | undefined;
  const addresses = new Set<string>();
  for (const e of entries) {
    first ??= e;
    addresses.add(e.externalIp);
  }
  if (!first) throw new Error('a Service with source ranges has entries');
  return {
    service: first.service,
    clusterIp: first.clusterIp,
    sourceRanges: first.sourceRanges!,
    sourcesFromNode: fromNode(first),
    addresses: [...addresses].sort(),
  };
}

/** Whether two Services' source-range chains hold the same rules (whatever the hook and the context). */
export function sameRangedService(a: RangedService, b: RangedService): boolean {
  const same = (x: readonly string[], y: readonly string[]) =>
    x === y || (x.length === y.length && x.every((v, i) => v === y[i]));
  return (
    a.service === b.service &&
    a.clusterIp === b.clusterIp &&
    a.sourcesFromNode === b.sourcesFromNode &&
    same(a.sourceRanges, b.sourceRanges) &&
    same(a.addresses, b.addresses)
  );
}

/** Whether two CIDRs share an address: the wider holds the narrower's network. */
function overlaps(a: ParsedCidr, b: ParsedCidr): boolean {
  return a.prefixLength <= b.prefixLength ? cidrContains(a, b) : cidrContains(b, a);
}

/**
 * The rules of a Service's source-range chain in one hook, specs without `-A CHAIN`, in order;
 * its entries' bucket rules have matched destination, protocol, port, address types and, in
 * prerouting, the local pod source. First, for each address of the Service, the packets whose
 * source is that address itself (a node process's connection to an address bound on kube-ipvs0):
 * translated only with sourcesFromNode, so a RETURN (not translated) where a range holds the
 * address and sourcesFromNode is not set, a translation where no range holds it and it is. Then
 * one translation per range. In output a translation is a mark rule then a DNAT rule, in
 * prerouting a DNAT rule; DNAT keeps the port. In prerouting, where pods are recognised by their
 * CIDRs, a range (or address) that no pod CIDR meets has no rule: no pod's packet has that source.
 */
export function serviceRules(ctx: RuleContext, s: RangedService, hook: HookName): string[] {
  const prefix = ctx.family === 'ipv4' ? 32 : 128;
  const comment = commentOf(ctx, s.service);
  const dnat = `-j DNAT --to-destination ${s.clusterIp}`;
  const ranges = s.sourceRanges.map((r) => parseCidr(r)!);
  const pods = hook === 'prerouting' ? ctx.podCidrs : undefined;
  const fromPods = (c: ParsedCidr) => pods === undefined || pods.some((p) => overlaps(p, c));
  const translate = (head: string) =>
    hook === 'prerouting' ? [`${head} ${dnat}`] : [`${head} ${ctx.markTarget}`, `${head} ${dnat}`];
  const rules: string[] = [];
  for (const address of s.addresses) {
    const own = parseCidr(`${address}/${prefix}`)!;
    if (!fromPods(own)) continue;
    const held = ranges.some((r) => cidrContains(r, own));
    const head = `-s ${address}/${prefix} -d ${address}/${prefix}${comment}`;
    if (held && !s.sourcesFromNode) rules.push(`${head} -j RETURN`);
    else if (!held && s.sourcesFromNode) rules.push(...translate(head));
  }
  for (let i = 0; i < ranges.length; i++) {
    if (fromPods(ranges[i]!)) rules.push(...translate(`-s ${s.sourceRanges[i]!}${comment}`));
  }
  return rules;
}

/** A rendered rule as `-save` prints it back: `--or-mark X` is kept as `--set-xmark X/X`. */
export function asSaved(rule: string): string {
  const at = rule.lastIndexOf(' --or-mark ');
  if (at < 0) return rule;
  const mark = rule.slice(at + ' --or-mark '.length);
  return `${rule.slice(0, at)} --set-xmark ${mark}/${mark}`;
}

/** An entry chain that gets bucket chains, and which of an entry's rules its buckets hold. */
export interface Hook {
  entry: string;
  of: HookName;
}

const BOTH_HOOKS: readonly Hook[] = [
  { entry: PREROUTING_CHAIN, of: 'prerouting' },
  { entry: OUTPUT_CHAIN, of: 'output' },
];

/**
 * The hooks whose entry chains get bucket chains: output always, prerouting only when local pods
 * can be recognised (otherwise IPVS_PREROUTING stays, empty). A bucket chain exists in each of
 * them while its bucket has entries, even one whose entries give it no rule (a source range
 * disjoint from the pod CIDRs), so that whether it exists depends on the entries alone.
 */
export function hooksOf(ctx: RuleContext): readonly Hook[] {
  return ctx.sources.length > 0 ? BOTH_HOOKS : BOTH_HOOKS.slice(1);
}
