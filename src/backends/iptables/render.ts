// Desired state -> `iptables-restore --noflush` input for the nat table of one family. Pure: the
// caller passes what the nat table holds now (`-save` output read by parse.ts), which decides the jump
// repairs and whether KUBE-MARK-MASQ can be used.
//
// The chains keep the original controller's names and shape (IPVS_PREROUTING, IPVS_OUTPUT; per
// entry a masquerade-mark rule then a DNAT rule, commented `namespace/name`), with one change the
// contract asks for: every rule also matches protocol and destination port, so that traffic to a
// port no Service lists is left alone and Services sharing an address each reach their own ClusterIP.
// The address-only shape of the original is never equivalent (no Service lists every port of
// every protocol), so it is not used.
//
// Every value written into a rule is checked again here; an entry that fails is left out and
// reported, and the rest is programmed. Rule lines are written in the order `iptables-save`
// prints them, so what we render can be compared with what the kernel holds.

import { cidrContains, formatCidr, parseCidr, parseIp } from '../../model/ip.js';
import { ourJumpFirstInEffect } from './precedence.js';
import {
  JUMPS,
  KUBE_MARK_MASQ,
  OUR_CHAINS,
  OUTPUT_CHAIN,
  PREROUTING_CHAIN,
  TARGET_IS,
  emptyNatTable,
  hasOurObjects,
  jumpsToOurChain,
  type NatTableView,
} from './parse.js';
import {
  PROTOCOLS,
  type DesiredState,
  type Entry,
  type Family,
  type FamilyState,
  type LocalPodMatch,
} from '../../model/types.js';

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

// ---- values -------------------------------------------------------------------------------

/** The mark as iptables writes it; the model's `1 << 31` is negative in JavaScript. */
export function formatMark(mark: number): string {
  const unsigned = mark >>> 0;
  if (!Number.isInteger(mark) || unsigned === 0 || (unsigned & (unsigned - 1)) !== 0) {
    throw new RangeError(`the masquerade mark must be a single bit, got ${mark}`);
  }
  return `0x${unsigned.toString(16)}`;
}

function hostPrefix(family: Family): number {
  return family === 'ipv4' ? 32 : 128;
}

function addressProblem(family: Family, what: string, text: string): string | undefined {
  const ip = parseIp(text);
  if (!ip) return `${what} ${JSON.stringify(text)} is not an IP address`;
  if (ip.family !== family) return `${what} ${text} is not ${family}`;
  if (ip.address !== text) return `${what} ${text} is not in canonical form`;
  return undefined;
}

function entryProblem(family: Family, e: Entry): string | undefined {
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

export interface RenderedChains {
  /** `-A IPVS_PREROUTING ...` then `-A IPVS_OUTPUT ...` lines. */
  rules: string[];
  rejected: Rejection[];
  /** Entries that have rules. */
  programmed: number;
}

/** The rules of our two chains for one family. */
export function renderChainRules(
  family: Family,
  state: FamilyState,
  masqueradeMark: number,
  useKubeMarkMasq: boolean,
): RenderedChains {
  const markTarget = useKubeMarkMasq ? `-j ${KUBE_MARK_MASQ}` : `-j MARK --or-mark ${formatMark(masqueradeMark)}`;
  const rejected: Rejection[] = [];
  const valid: Entry[] = [];
  for (const e of state.entries) {
    const problem = entryProblem(family, e);
    if (problem) rejected.push({ family, item: entryLabel(e), reason: problem });
    else valid.push(e);
  }
  const sources = sourceMatches(family, state.localPodMatch, rejected);
  const prefix = hostPrefix(family);
  const match = (e: Entry, chainAndAddresses: string, extra: string) => {
    const proto = e.protocol.toLowerCase();
    const comment = `-m comment --comment "${e.service}"`;
    return `-A ${chainAndAddresses} -p ${proto} ${comment}${extra} -m ${proto} --dport ${e.port}`;
  };
  const rules: string[] = [];
  for (const source of sources) {
    for (const e of valid) {
      // An entry with source ranges: one rule pair per range (kube-proxy's firewall lets those
      // sources through), within the local pod match.
      for (const addresses of rangedSources(source, e.sourceRanges)) {
        const head = match(e, `${PREROUTING_CHAIN} ${withDestination(addresses, `-d ${e.externalIp}/${prefix}`)}`, '');
        rules.push(`${head} ${markTarget}`, `${head} -j DNAT --to-destination ${e.clusterIp}`);
      }
    }
  }
  for (const e of valid) {
    for (const range of e.sourceRanges ?? ['']) {
      const from = range === '' ? '' : `-s ${range} `;
      const head = match(e, `${OUTPUT_CHAIN} ${from}-d ${e.externalIp}/${prefix}`, ' -m addrtype --src-type LOCAL');
      rules.push(`${head} ${markTarget}`, `${head} -j DNAT --to-destination ${e.clusterIp}`);
    }
  }
  return { rules, rejected, programmed: valid.length };
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

/**
 * Lines that make rule 1 of PREROUTING / OUTPUT the only jump to our chain: nothing when it is
 * already so, or when only rules that cannot take a packet away from it are above it
 * (precedence.ts); otherwise every jump to it is deleted (by its exact spec) and one is inserted at 1.
 */
export function renderJumpRepairs(current: NatTableView): string[] {
  const lines: string[] = [];
  for (const { from, to } of JUMPS) {
    if (ourJumpFirstInEffect(current, from, to)) continue;
    const specs = current.rules.get(from) ?? [];
    const pattern = TARGET_IS.get(to)!;
    const ours = specs.filter((s) => pattern.test(s));
    for (const spec of ours) lines.push(`-D ${from} ${spec}`);
    lines.push(`-I ${from} 1 -j ${to}`);
  }
  return lines;
}

/** The whole transaction for one family: declaring our chains flushes them (--noflush keeps the rest). */
export function assembleRestore(chainRules: string[], jumpRepairs: string[]): string {
  const lines = ['*nat', ...OUR_CHAINS.map((c) => `:${c} - [0:0]`), ...jumpRepairs, ...chainRules, 'COMMIT', ''];
  return lines.join('\n');
}

export interface RenderedFamily extends RenderedChains {
  /** iptables-restore --noflush input. */
  text: string;
  /**
   * The nat table already holds exactly these rules and jumps (known only when `current` lists
   * our chains): applying `text` would change nothing but the counters.
   */
  upToDate: boolean;
}

/** A rendered rule as `-save` prints it back: `--or-mark X` is kept as `--set-xmark X/X`. */
export function asSaved(rule: string): string {
  return rule.replace(/ --or-mark (0x[0-9a-f]+)$/, ' --set-xmark $1/$1');
}

/** The part of a rule spec before its target: a MARK rule and its DNAT rule share it. */
function headOf(spec: string): string {
  const at = spec.lastIndexOf(' -j ');
  return at < 0 ? spec : spec.slice(0, at);
}

/**
 * Whether our chains in `current` hold exactly `rules`, in any order but each entry's mark rule
 * before its DNAT rule (DNAT ends the walk). Partial syncs append, so a chain that went through
 * changes holds the rules of a fresh write in another order: the same translations.
 */
export function chainsHold(current: NatTableView, rules: readonly string[]): boolean {
  for (const chain of OUR_CHAINS) {
    const held = current.rules.get(chain);
    if (!current.chains.has(chain) || held === undefined) return false;
    const prefix = `-A ${chain} `;
    const wanted = new Map<string, number>();
    let count = 0;
    for (const r of rules) {
      if (!r.startsWith(prefix)) continue;
      const spec = asSaved(r).slice(prefix.length);
      wanted.set(spec, (wanted.get(spec) ?? 0) + 1);
      count++;
    }
    if (held.length !== count) return false;
    const marked = new Set<string>();
    for (const spec of held) {
      const left = wanted.get(spec);
      if (!left) return false;
      wanted.set(spec, left - 1);
      if (/ -j DNAT /.test(spec)) {
        if (!marked.has(headOf(spec))) return false;
      } else marked.add(headOf(spec));
    }
  }
  return true;
}

/** Desired state of one family + what the nat table holds now -> one restore transaction. */
export function renderFamilyRestore(
  family: Family,
  state: FamilyState,
  masqueradeMark: number,
  current: NatTableView,
): RenderedFamily {
  const chains = renderChainRules(family, state, masqueradeMark, current.chains.has(KUBE_MARK_MASQ));
  const repairs = renderJumpRepairs(current);
  return {
    ...chains,
    text: assembleRestore(chains.rules, repairs),
    upToDate: repairs.length === 0 && chainsHold(current, chains.rules),
  };
}

export interface RenderedPartial {
  /** iptables-restore --noflush input; undefined when no rule changes. */
  text: string | undefined;
  deletes: number;
  appends: number;
  /** The added entries that were left out. */
  rejected: Rejection[];
  /** Removed entries that had rules (valid ones) and added entries that get them. */
  removedProgrammed: number;
  addedProgrammed: number;
}

function byKey(a: Entry, b: Entry): number {
  const ka = `${String(a.externalIp)} ${String(a.protocol)} ${String(a.port)}`;
  const kb = `${String(b.externalIp)} ${String(b.protocol)} ${String(b.port)}`;
  return ka < kb ? -1 : ka > kb ? 1 : 0;
}

/**
 * The rules that change when `removed` entries go and `added` ones come, as one restore: every
 * rule of a removed entry deleted by its spec, then every rule of an added entry appended, a
 * rule both sides render (an entry whose ClusterIP alone changed keeps its mark rule) neither.
 * Nothing is declared, so nothing is flushed. Deletes name the rule by its spec, not its
 * number: no position is assumed, and on both variants the cost is the same (finding a rule
 * means reading the chain either way). Appended pairs keep the mark rule before the DNAT rule.
 * Pure; the order of the lines does not depend on the order of the arrays.
 */
export function renderPartialRestore(
  family: Family,
  removed: readonly Entry[],
  added: readonly Entry[],
  localPodMatch: LocalPodMatch,
  masqueradeMark: number,
  useKubeMarkMasq: boolean,
): RenderedPartial {
  const gone = renderChainRules(
    family,
    { entries: [...removed].sort(byKey), localPodMatch },
    masqueradeMark,
    useKubeMarkMasq,
  );
  const sortedAdded = [...added].sort(byKey);
  const come = renderChainRules(family, { entries: sortedAdded, localPodMatch }, masqueradeMark, useKubeMarkMasq);
  const goneSet = new Set(gone.rules);
  const comeSet = new Set(come.rules);
  const lines = ['*nat'];
  let deletes = 0;
  let appends = 0;
  for (const rule of gone.rules) {
    if (comeSet.has(rule)) continue;
    lines.push(`-D ${rule.slice(3)}`);
    deletes++;
  }
  for (const rule of come.rules) {
    if (goneSet.has(rule)) continue;
    lines.push(rule);
    appends++;
  }
  lines.push('COMMIT', '');
  const rejected: Rejection[] = [];
  for (const e of sortedAdded) {
    const problem = entryProblem(family, e);
    if (problem) rejected.push({ family, item: entryLabel(e), reason: problem });
  }
  return {
    text: deletes + appends > 0 ? lines.join('\n') : undefined,
    deletes,
    appends,
    rejected,
    removedProgrammed: gone.programmed,
    addedProgrammed: come.programmed,
  };
}

/**
 * Removes every object of ours from the nat table: jumps to our chains (wherever they are),
 * then the chains. Undefined when there is nothing of ours.
 */
export function renderCleanupRestore(current: NatTableView): string | undefined {
  if (!hasOurObjects(current)) return undefined;
  const lines = ['*nat'];
  for (const [chain, specs] of current.rules) {
    if (OUR_CHAINS.includes(chain)) continue;
    for (const spec of specs) if (jumpsToOurChain(spec)) lines.push(`-D ${chain} ${spec}`);
  }
  for (const chain of OUR_CHAINS) if (current.chains.has(chain)) lines.push(`:${chain} - [0:0]`);
  for (const chain of OUR_CHAINS) if (current.chains.has(chain)) lines.push(`-X ${chain}`);
  lines.push('COMMIT', '');
  return lines.join('\n');
}

/** Both families as restore input, for --dry-run: assumes fresh chains in a nat table without KUBE-MARK-MASQ. */
export function renderDesiredStateRestoreText(
  desired: DesiredState,
  options: { useKubeMarkMasq?: boolean } = {},
): string {
  const current = emptyNatTable();
  if (options.useKubeMarkMasq) current.chains.add(KUBE_MARK_MASQ);
  return (['ipv4', 'ipv6'] as const)
    .map((family) => {
      const r = renderFamilyRestore(family, desired[family], desired.masqueradeMark, current);
      const tool = family === 'ipv4' ? 'iptables-restore' : 'ip6tables-restore';
      const notes = r.rejected.map((x) => `# left out: ${x.item}: ${x.reason}\n`).join('');
      const none = desired[family].localPodMatch;
      const noPrerouting = none.kind === 'none' ? `# no prerouting rules: ${none.reason}\n` : '';
      return `# ${family}: ${tool} --noflush -w\n${noPrerouting}${notes}${r.text}`;
    })
    .join('\n');
}
