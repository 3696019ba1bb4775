// The two iptables variants a node can use (legacy xtables and iptables-nft), their commands,
// and which one the node already uses. Detection follows kube-proxy's iptables-wrapper: the
// kubelet's hint chains first, then whichever variant holds more rules, ties going to nft.

import { isOurRule } from './parse.js';
import { IptablesCommands, IptablesToolMissing, type IptablesVariant } from './executor.js';

export { IPTABLES_VARIANTS, type IptablesVariant } from './executor.js';

/** Chains the kubelet creates in the mangle table of the variant it uses (KEP-3178). */
const KUBELET_HINT_CHAINS = ['KUBE-IPTABLES-HINT', 'KUBE-KUBELET-CANARY'];

export interface VariantChoice {
  variant: IptablesVariant;
  /** One line saying why, to log once. */
  reason: string;
}

interface VariantEvidence {
  installed: boolean;
  hintChains: number;
  rules: number;
}

/** Rules (`-A` lines) in a `-save` listing, leaving ours out so that our own leftovers do not decide. */
export function countForeignRules(saveOutput: string): number {
  let n = 0;
  for (const line of saveOutput.split('\n')) if (line.startsWith('-') && !isOurRule(line)) n++;
  return n;
}

export function countHintChains(saveOutput: string): number {
  let n = 0;
  for (const line of saveOutput.split('\n')) {
    if (KUBELET_HINT_CHAINS.some((c) => line.startsWith(`:${c} `))) n++;
  }
  return n;
}

async function gatherEvidence(variant: IptablesVariant): Promise<VariantEvidence> {
  const evidence: VariantEvidence = { installed: false, hintChains: 0, rules: 0 };
  for (const family of ['ipv4', 'ipv6'] as const) {
    const commands = new IptablesCommands(variant, family);
    let all: string;
    try {
      // Without -t, -save dumps only the tables that exist: nothing is created by looking.
      all = await commands.save();
    } catch {
      // Not installed, or a family this kernel lacks (no IPv6): no evidence either way.
      continue;
    }
    evidence.installed = true;
    evidence.rules += countForeignRules(all);
    evidence.hintChains += countHintChains(all);
  }
  return evidence;
}

/** Chooses the variant kube-proxy and the kubelet use on this node. Never changes anything. */
export async function detectIptablesVariant(): Promise<VariantChoice> {
  const nft = await gatherEvidence('nft');
  const legacy = await gatherEvidence('legacy');
  if (!nft.installed && !legacy.installed) {
    throw new IptablesToolMissing(
      'neither iptables-nft nor iptables-legacy is installed: install the iptables package',
    );
  }
  if (!legacy.installed) return { variant: 'nft', reason: 'iptables-nft: iptables-legacy is not installed' };
  if (!nft.installed) return { variant: 'legacy', reason: 'iptables-legacy: iptables-nft is not installed' };
  if (nft.hintChains > 0) {
    return { variant: 'nft', reason: "iptables-nft: the kubelet's hint chain is in the nft variant's mangle table" };
  }
  if (legacy.hintChains > 0) {
    return { variant: 'legacy', reason: "iptables-legacy: the kubelet's hint chain is in the legacy mangle table" };
  }
  if (legacy.rules > nft.rules) {
    return { variant: 'legacy', reason: `iptables-legacy: it holds ${legacy.rules} rules, iptables-nft ${nft.rules}` };
  }
  return {
    variant: 'nft',
    reason: `iptables-nft: it holds ${nft.rules} rules, iptables-legacy ${legacy.rules} (ties go to nft)`,
  };
}
