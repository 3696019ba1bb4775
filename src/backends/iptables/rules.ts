// The rules of one entry, and the checks every value passes before it is written into one. Pure.
//
// The rules keep the original controller's shape: per entry a DNAT rule, commented
// `namespace/name`, in the prerouting chain (traffic from local pods), and a masquerade-mark rule
// then a DNAT rule in the output chain (traffic whose source is local to the node), with changes
// the contract asks for: pod traffic is not marked (the original marked it too, before kube-proxy
// 1.24 answered pods itself), only a destination local to the node is translated, and every rule
// also matches protocol and destination port, so that traffic to a port no Service
// lists is left alone and Services sharing an address each reach their own ClusterIP. The
// address-only shape of the original is never equivalent (no Service lists every port of every
// protocol), so it is not used. Which chain a rule goes to is layout.ts's business.
//
// Every value written into a rule is checked again here; an entry that fails is left out and
// reported, and the rest is programmed. Rule specs are written in the order `iptables-save`
// prints them, so what we render can be compared with what the kernel holds.

import { cidrContains, formatCidr, parseCidr, parseIp } from '../../model/ip.js';
import { PROTOCOLS, type Entry, type Family, type LocalPodMatch } from '../../model/types.js';
import { OUTPUT_CHAIN, PREROUTING_CHAIN } from './layout.js';
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
  for (const range of e.sourceRanges ?? []) {
    const cidr = parseCidr(range);
    if (!cidr || cidr.family !== family || formatCidr(cidr) !== range) {
      return `source range ${JSON.stringify(range)} is not a canonical ${family} CIDR`;
    }
  }
  return undefined;
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

/**
 * The prerouting source match of a local pod match (`-s CIDR` or `-i name`) within each source
 * range: a pod CIDR and a range meet in the narrower of the two, or not at all; an interface
 * match takes the range beside it. Without ranges, the pod match alone.
 */
function rangedSources(podMatch: string, ranges: readonly string[] | undefined): string[] {
  if (!ranges) return [podMatch];
  if (!podMatch.startsWith('-s ')) return ranges.map((r) => `-s ${r} ${podMatch}`);
  const pods = parseCidr(podMatch.slice(3))!;
  const out: string[] = [];
  for (const text of ranges) {
    const range = parseCidr(text)!;
    if (cidrContains(pods, range) && range.prefixLength >= pods.prefixLength) out.push(`-s ${text}`);
    else if (cidrContains(range, pods) && pods.prefixLength >= range.prefixLength) out.push(podMatch);
  }
  return out;
}

/** What the rules of a family's entries share: its local pod match and its mark target. */
export interface RuleContext {
  family: Family;
  /** The prerouting source matches; none: no prerouting rules (the local pods cannot be recognised). */
  sources: string[];
  markTarget: string;
}

/** The context of a family's rules; a local pod match that fails validation goes to `rejected`. */
export function ruleContext(
  family: Family,
  localPodMatch: LocalPodMatch,
  masqueradeMark: number,
  useKubeMarkMasq: boolean,
  rejected: Rejection[],
): RuleContext {
  const markTarget = useKubeMarkMasq ? `-j ${KUBE_MARK_MASQ}` : `-j MARK --or-mark ${formatMark(masqueradeMark)}`;
  return { family, sources: sourceMatches(family, localPodMatch, rejected), markTarget };
}

/** The hooks an entry has rules in. */
export type HookName = 'prerouting' | 'output';

/**
 * The rules of one entry that passed entryProblem in one hook, specs without `-A CHAIN`: in
 * prerouting (pods) a DNAT rule per source match, the pod's source kept as kube-proxy 1.24+ keeps
 * it; in output (the node) a mark rule then a DNAT rule, the node's source being a local address
 * that a reply from another node cannot find. Both translate only a destination bound on the node
 * (`--dst-type LOCAL`: what IPVS would capture), so that rules left behind go inert once kube-proxy
 * unbinds the address.
 */
export function entryRules(ctx: RuleContext, e: Entry, hook: HookName): string[] {
  const prefix = ctx.family === 'ipv4' ? 32 : 128;
  const proto = e.protocol.toLowerCase();
  const comment = `-m comment --comment "${e.service}"`;
  const destination = `-d ${e.externalIp}/${prefix}`;
  const dnat = `-j DNAT --to-destination ${e.clusterIp}`;
  const rules: string[] = [];
  if (hook === 'prerouting') {
    for (const source of ctx.sources) {
      // An entry with source ranges: one rule per range (kube-proxy's firewall lets those
      // sources through), within the local pod match.
      for (const addresses of rangedSources(source, e.sourceRanges)) {
        const head = `${withDestination(addresses, destination)} -p ${proto} ${comment}`;
        rules.push(`${head} -m addrtype --dst-type LOCAL -m ${proto} --dport ${e.port} ${dnat}`);
      }
    }
  } else {
    for (const range of e.sourceRanges ?? ['']) {
      const from = range === '' ? '' : `-s ${range} `;
      const head = `${from}${destination} -p ${proto} ${comment} -m addrtype --src-type LOCAL --dst-type LOCAL -m ${proto} --dport ${e.port}`;
      rules.push(`${head} ${ctx.markTarget}`, `${head} ${dnat}`);
    }
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
