// Whether rules that another writer keeps above our jump in nat PREROUTING/OUTPUT can take a
// packet away from it, and the lines that put our jump back first when they can. The first NAT decision of a new connection wins, so only a rule that ends
// the packet's walk of the hook before our jump is reached matters. A rule whose walk always
// goes on to the next rule of the hook cannot: it is harmless, and our jump below it still sees
// every packet first among the NAT targets. Pure.
//
// Harmless, exactly (whatever a rule matches: a walk that can end for some packet is enough to
// make a rule harmful):
// - a rule without a target (a counter), or whose target never ends the walk: MARK, CONNMARK,
//   LOG, NFLOG (kube-proxy's KUBE-MARK-MASQ is one MARK rule);
// - a jump (`-j`) to a user chain of the view every rule of which is harmless, where RETURN is
//   harmless too (it goes back to the rule after the jump), followed to any depth.
// Harmful: anything else, or anything not known: ACCEPT, RETURN in the hook's own chain (the
// chain's policy decides), DNAT, SNAT, REDIRECT, MASQUERADE and every other target, a goto
// (`-g`: a RETURN there leaves the hook), a chain the view does not list, a loop.

import { JUMPS } from './layout.js';
import { TARGET_IS, type NatTableView } from './parse.js';

/** Targets that mark or log a packet and let its walk go on to the next rule. */
const PASSING_TARGETS: ReadonlySet<string> = new Set(['MARK', 'CONNMARK', 'LOG', 'NFLOG']);

/** Targets that are not chains (never listed as one). */
const BUILT_IN_TARGETS: ReadonlySet<string> = new Set([
  'ACCEPT',
  'DROP',
  'RETURN',
  'QUEUE',
  'NFQUEUE',
  'DNAT',
  'SNAT',
  'MASQUERADE',
  'REDIRECT',
  'NETMAP',
  'REJECT',
  'CT',
  'TRACE',
  'AUDIT',
]);

/** How deep jumps are followed; deeper is judged harmful. */
const MAX_DEPTH = 8;

/** The rule's target: `-j X` or `-g X`, undefined for a rule without one. Quoted text (comments) is skipped. */
export function targetOf(spec: string): { kind: 'jump' | 'goto'; name: string } | undefined {
  const unquoted = spec.replace(/"(?:[^"\\]|\\.)*"/g, '""');
  const m = /(?:^|\s)-([jg]) (\S+)/.exec(unquoted);
  if (!m) return undefined;
  return { kind: m[1] === 'g' ? 'goto' : 'jump', name: m[2]! };
}

/** The user chains a rule above ours may jump to, to list with the hook (iptables-nft reads chains one by one). */
export function chainsJumpedTo(specs: readonly string[]): string[] {
  const out: string[] = [];
  for (const spec of specs) {
    const target = targetOf(spec);
    if (target && !PASSING_TARGETS.has(target.name) && !BUILT_IN_TARGETS.has(target.name)) out.push(target.name);
  }
  return out;
}

function harmlessChain(view: NatTableView, chain: string, seen: readonly string[]): boolean {
  if (seen.includes(chain) || seen.length >= MAX_DEPTH) return false;
  const specs = view.rules.get(chain);
  if (!view.chains.has(chain) || specs === undefined) return false;
  return specs.every((spec) => harmlessRule(view, spec, [...seen, chain], true));
}

/**
 * Whether a rule lets every packet go on to the next rule of the chain it is in. `inUserChain`:
 * the rule is in a chain reached by a jump, where RETURN goes back to the rule after the jump.
 */
export function harmlessRule(
  view: NatTableView,
  spec: string,
  seen: readonly string[] = [],
  inUserChain = false,
): boolean {
  const target = targetOf(spec);
  if (target === undefined) return true;
  if (target.kind === 'goto') return false;
  if (PASSING_TARGETS.has(target.name)) return true;
  if (target.name === 'RETURN') return inUserChain;
  return harmlessChain(view, target.name, seen);
}

/**
 * Whether `view`'s `from` chain holds exactly one jump to `to` (`-j to`, nothing else in the
 * rule), and every rule above it is harmless: no repair is needed.
 */
export function ourJumpFirstInEffect(view: NatTableView, from: string, to: string): boolean {
  const specs = view.rules.get(from) ?? [];
  const ours = specs.indexOf(`-j ${to}`);
  if (ours < 0) return false;
  const others = specs.filter((s, i) => i !== ours && targetOf(s)?.name === to);
  if (others.length > 0) return false;
  return specs.slice(0, ours).every((spec) => harmlessRule(view, spec));
}

/**
 * Lines that make rule 1 of PREROUTING / OUTPUT the only jump to our entry chain: nothing when it
 * is already so, or when only rules that cannot take a packet away from it are above it;
 * otherwise every jump to it is deleted (by its exact spec) and one is inserted at 1. A whole
 * write, a verification's repair and the jump guard all write these.
 */
export function renderJumpRepairs(current: NatTableView): string[] {
  const lines: string[] = [];
  for (const { from, to } of JUMPS) {
    if (ourJumpFirstInEffect(current, from, to)) continue;
    const specs = current.rules.get(from) ?? [];
    const pattern = TARGET_IS.get(to)!;
    for (const spec of specs.filter((s) => pattern.test(s))) lines.push(`-D ${from} ${spec}`);
    lines.push(`-I ${from} 1 -j ${to}`);
  }
  return lines;
}
