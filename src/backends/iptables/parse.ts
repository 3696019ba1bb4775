// Reading the nat table: `-save` output parsed into a view of chains and rule specs, and which
// of those chains and rules are ours (our two chains and the jumps to them). Pure.

export const PREROUTING_CHAIN = 'IPVS_PREROUTING';
export const OUTPUT_CHAIN = 'IPVS_OUTPUT';
export const OUR_CHAINS: readonly string[] = [PREROUTING_CHAIN, OUTPUT_CHAIN];
export const KUBE_MARK_MASQ = 'KUBE-MARK-MASQ';

/** Built-in nat chain -> our chain, jumped to from rule 1. */
export const JUMPS: ReadonlyArray<{ from: string; to: string }> = [
  { from: 'PREROUTING', to: PREROUTING_CHAIN },
  { from: 'OUTPUT', to: OUTPUT_CHAIN },
];

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
const TARGET_OF_OURS = targetPattern(OUR_CHAINS);
export const TARGET_IS = new Map(OUR_CHAINS.map((c) => [c, targetPattern([c])]));

/** A rule spec that jumps (or goes) to one of our chains. */
export function jumpsToOurChain(spec: string): boolean {
  return TARGET_OF_OURS.test(spec);
}

/** A `-save` line that belongs to us: a rule in our chains, or a jump to them. */
export function isOurRule(saveLine: string): boolean {
  if (OUR_CHAINS.some((c) => saveLine.startsWith(`-A ${c} `) || saveLine === `-A ${c}`)) return true;
  return saveLine.startsWith('-A ') && jumpsToOurChain(saveLine);
}

/** Whether the nat table holds anything of ours (chains or jumps to them). */
export function hasOurObjects(view: NatTableView): boolean {
  if (OUR_CHAINS.some((c) => view.chains.has(c))) return true;
  for (const specs of view.rules.values()) if (specs.some(jumpsToOurChain)) return true;
  return false;
}
