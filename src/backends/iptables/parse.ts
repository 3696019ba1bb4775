// Reading the nat table: `-save` output parsed into a view of chains and rule specs, and which
// of those chains and rules are ours (our entry and bucket chains, layout.ts, and the jumps to
// them). Pure.

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
      view.rules.get(chain)!.push(spec);
    }
  }
  return view;
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
