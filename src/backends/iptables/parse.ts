// Reading the nat table: `-save` output parsed into a view of chains and rule specs, and which
// of those chains and rules are ours (our entry and bucket chains, layout.ts, and the jumps to
// them). Pure.

import { listedAddress } from '../../model/ip.js';
import { ENTRY_CHAINS, isOurChain } from './layout.js';

export const KUBE_MARK_MASQ = 'KUBE-MARK-MASQ';

/** The nat table as `-save -t nat` shows it: chain names and each chain's rule specs in order. */
export interface NatTableView {
  chains: Set<string>;
  /** chain -> rule specs, each the text after `-A CHAIN `. */
  rules: Map<string, string[]>;
}

export function emptyNatTable(): NatTableView {
  return { chains: new Set(), rules: new Map() };
}

/** Reads the `*nat` section of `-save` output; other tables are ignored. */
export function parseNatSave(saveOutput: string): NatTableView {
  const view = emptyNatTable();
  let inNat = false;
  for (const line of saveOutput.split('\n')) {
    if (line.startsWith('*')) {
      inNat = line === '*nat';
      continue;
    }
    if (!inNat) continue;
    if (line.startsWith(':')) {
      const name = line.slice(1).split(' ')[0]!;
      view.chains.add(name);
      if (!view.rules.has(name)) view.rules.set(name, []);
    } else if (line.startsWith('-A ')) {
      const space = line.indexOf(' ', 3);
      const chain = space < 0 ? line.slice(3) : line.slice(3, space);
      const spec = space < 0 ? '' : line.slice(space + 1);
      if (!view.rules.has(chain)) view.rules.set(chain, []);
      view.rules.get(chain)!.push(savedSpec(chain, spec));
    }
  }
  return view;
}

/** An IPv6 address in mixed notation (`::1.2.3.4`, as -save prints it), or a quoted string. */
const MIXED_OR_QUOTED = /"(?:[^"\\]|\\.)*"|[0-9A-Fa-f:]*:\d{1,3}(?:\.\d{1,3}){3}/g;

/**
 * A rule spec of `chain` as -save printed it, with the addresses of our chains' rules as the
 * model writes them (listedAddress: ip6tables-save prints `-d ::1.2.3.4/128` where the model
 * writes `::102:304`), so that a rule we wrote reads back as the very spec we render. Quoted
 * text (comments) and other chains' rules are left as they are.
 */
export function savedSpec(chain: string, spec: string): string {
  if (!isOurChain(chain) || !spec.includes(':') || !spec.includes('.')) return spec;
  return spec.replace(MIXED_OR_QUOTED, (text) => (text.startsWith('"') ? text : listedAddress(text)));
}

function targetPattern(chains: readonly string[]): RegExp {
  return new RegExp(`(^|\\s)-[jg] (${chains.join('|')})(\\s|$)`);
}
/** A rule whose target is exactly one of our entry chains, by chain. */
export const TARGET_IS = new Map(ENTRY_CHAINS.map((c) => [c, targetPattern([c])]));

/** A rule spec that jumps (or goes) to one of our chains. Quoted text (comments) is skipped. */
export function jumpsToOurChain(spec: string): boolean {
  const target = /(?:^|\s)-[jg] (\S+)/.exec(spec.replace(/"(?:[^"\\]|\\.)*"/g, '""'))?.[1];
  return target !== undefined && isOurChain(target);
}

/** A `-save` line that belongs to us: a rule in one of our chains, or a jump to one. */
export function isOurRule(saveLine: string): boolean {
  if (!saveLine.startsWith('-A ')) return false;
  const chain = saveLine.slice(3).split(' ', 1)[0]!;
  return isOurChain(chain) || jumpsToOurChain(saveLine);
}

/** Whether the nat table holds anything of ours (chains or jumps to them). */
export function hasOurObjects(view: NatTableView): boolean {
  for (const chain of view.chains) if (isOurChain(chain)) return true;
  for (const specs of view.rules.values()) if (specs.some(jumpsToOurChain)) return true;
  return false;
}
