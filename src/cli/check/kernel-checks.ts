// The kernel as it is, against what the controller wants: our objects read back and compared
// (the driver's own read-back, as every resync verifies them), where our translation sits against
// IPVS's hooks, and whether kube-proxy masquerades the node's marked traffic.

import { execa } from 'execa';
import type { Driver, ReadBack } from '../../driver/driver.js';
import { FAMILIES, type DesiredState, type Family } from '../../model/types.js';
import { shapeOf } from '../../reconciler/ledger.js';
import { CHAIN_PRIORITY, NFT_FAMILY, OUTPUT_CHAIN, PREROUTING_CHAIN, TABLE_NAME } from '../../backends/nft/render.js';
import { IptablesCommands, IPTABLES_VARIANTS, type IptablesVariant } from '../../backends/iptables/executor.js';
import { JUMPS } from '../../backends/iptables/layout.js';
import { jumpsToKubePostrouting, walkMarked } from './masquerade.js';

/** One thing checked: ok or broken, and one line that says what was found (and, when broken, why it matters). */
export interface Finding {
  check: 'backend' | 'objects' | 'hooks' | 'masquerade';
  family: Family;
  ok: boolean;
  detail: string;
}

/**
 * IPVS's hook on locally sent packets, NF_IP_PRI_NAT_DST + 2 (net/netfilter/ipvs/ip_vs_core.c,
 * ip_vs_local_request4/6, the same on every kernel nodes run): a node process's connection must be
 * translated at a lower priority. A pod's packets reach IPVS at local-in, after routing: any
 * prerouting hook comes first.
 */
export const IPVS_LOCAL_OUT_PRIORITY = -98;

/** The families the desired state translates anything in. */
export function familiesInUse(desired: DesiredState): Family[] {
  return FAMILIES.filter((f) => desired[f].entries.length > 0);
}

/** Our objects of a family read back and compared with what the desired state asks for. */
export async function checkObjects(driver: Driver, desired: DesiredState, family: Family): Promise<Finding> {
  const state = desired[family];
  const shape = shapeOf(state, desired.masqueradeMark);
  let read: ReadBack | 'unfinished' | 'not-alongside' = 'unfinished';
  // A write of the running controller may overlap a read: the read is tried again.
  const label = driver.familyLabel(family);
  try {
    for (let attempt = 0; attempt < 3 && typeof read === 'string'; attempt++) {
      read = await driver.readBack(family, state.entries, shape, 'between-writes');
    }
  } catch (err) {
    return { check: 'objects', family, ok: false, detail: `${label}: ${(err as Error).message}` };
  }
  if (typeof read === 'string') {
    return { check: 'objects', family, ok: false, detail: `${label}: could not be read back (writes went on)` };
  }
  const n = state.entries.length;
  if (read.missing.length === 0 && read.foreign.length === 0 && read.shapeDrift.length === 0) {
    return { check: 'objects', family, ok: true, detail: `${label}: ${n} entries, every object as wanted` };
  }
  const parts: string[] = [];
  if (read.missing.length > 0) {
    const some = read.missing
      .slice(0, 3)
      .map((e) => `${e.externalIp} ${e.protocol.toLowerCase()}/${e.port} (${e.service})`);
    parts.push(
      `${read.missing.length} of ${n} entries missing or different: ${some.join(', ')}${read.missing.length > 3 ? ', ...' : ''}`,
    );
  }
  if (read.foreign.length > 0) parts.push(`${read.foreign.length} entries nobody wants`);
  if (read.shapeDrift.length > 0) parts.push(`differs: ${read.shapeDrift.join(', ')}`);
  return { check: 'objects', family, ok: false, detail: `${label}: ${parts.join('; ')}` };
}

/** Where our translation sits against IPVS, for the backend in use. */
export async function checkHooks(driver: Driver, family: Family): Promise<Finding> {
  if (driver.name === 'nft') return nftHooks(family);
  if (driver.name === 'iptables') return iptablesJumps(variantOf(driver), family);
  // Socket hooks rewrite the destination at connect() and sendmsg(), before any packet exists.
  const present = await driver.hasState();
  return {
    check: 'hooks',
    family,
    ok: present,
    detail: present
      ? 'cgroup socket hooks pinned: the destination is rewritten before a packet exists, so before IPVS'
      : 'no pinned programs of ours: nothing translates',
  };
}

function variantOf(driver: Driver): IptablesVariant {
  return driver.label.endsWith('legacy') ? 'legacy' : 'nft';
}

interface NftChain {
  chain?: { family: string; table: string; name: string; hook?: string; prio?: number; type?: string };
}

async function nftHooks(family: Family): Promise<Finding> {
  const nftFamily = NFT_FAMILY[family];
  const run = await execa('nft', ['-j', 'list', 'table', nftFamily, TABLE_NAME], {
    reject: false,
    timeout: 10_000,
    stdin: 'ignore',
  });
  if (run.exitCode !== 0) {
    const why = String(run.stderr).trim().split('\n')[0] ?? '';
    return { check: 'hooks', family, ok: false, detail: `table ${nftFamily} ${TABLE_NAME} not listed: ${why}` };
  }
  const chains = new Map<string, NftChain['chain']>();
  for (const item of (JSON.parse(String(run.stdout)) as { nftables: NftChain[] }).nftables) {
    if (item.chain?.hook) chains.set(item.chain.name, item.chain);
  }
  const problems: string[] = [];
  const said: string[] = [];
  for (const [name, hook] of [
    [OUTPUT_CHAIN, 'output'],
    [PREROUTING_CHAIN, 'prerouting'],
  ] as const) {
    const chain = chains.get(name);
    if (!chain || chain.hook !== hook || chain.type !== 'nat') {
      problems.push(`no nat ${hook} base chain ${name}`);
      continue;
    }
    const prio = chain.prio ?? 0;
    if (hook === 'output' && prio >= IPVS_LOCAL_OUT_PRIORITY) {
      problems.push(
        `${name} hooks output at priority ${prio}, not before IPVS (${IPVS_LOCAL_OUT_PRIORITY}): IPVS forwards the node's connections untranslated`,
      );
    } else {
      said.push(`${hook} at ${prio}`);
    }
  }
  if (problems.length > 0) return { check: 'hooks', family, ok: false, detail: problems.join('; ') };
  const expected = said.every((s) => s.endsWith(` ${CHAIN_PRIORITY}`)) ? '' : ` (we write ${CHAIN_PRIORITY})`;
  return {
    check: 'hooks',
    family,
    ok: true,
    detail: `${said.join(', ')}${expected}: before IPVS (local-out ${IPVS_LOCAL_OUT_PRIORITY}; pods' packets reach it at local-in)`,
  };
}

async function iptablesJumps(variant: IptablesVariant, family: Family): Promise<Finding> {
  const commands = new IptablesCommands(variant, family);
  const problems: string[] = [];
  for (const { from, to } of JUMPS) {
    const first = await commands.firstRule('nat', from);
    if (first === undefined || !new RegExp(`(^|\\s)-j ${to}(\\s|$)`).test(first)) {
      problems.push(`rule 1 of nat ${from} is not our jump to ${to}${first ? ` (it is: ${first})` : ''}`);
    }
  }
  const tool = `${family === 'ipv6' ? 'ip6tables' : 'iptables'}-${variant}`;
  if (problems.length > 0) return { check: 'hooks', family, ok: false, detail: `${tool}: ${problems.join('; ')}` };
  return {
    check: 'hooks',
    family,
    ok: true,
    detail: `${tool}: our jumps are rule 1 of nat PREROUTING and OUTPUT (nat at -100, before IPVS's local-out ${IPVS_LOCAL_OUT_PRIORITY})`,
  };
}

/**
 * kube-proxy's masquerade of the mark, in whichever iptables variant holds kube-proxy's chains.
 * Only what the node's own connections need: a pod's translated traffic keeps its source.
 */
export async function checkMasquerade(family: Family, mark: number): Promise<Finding> {
  const hex = `0x${mark.toString(16)}`;
  const seen: string[] = [];
  for (const variant of IPTABLES_VARIANTS) {
    const commands = new IptablesCommands(variant, family);
    const tool = `${family === 'ipv6' ? 'ip6tables' : 'iptables'}-${variant}`;
    let kube: string[] | undefined;
    let post: string[] | undefined;
    try {
      kube = await commands.listRules('nat', 'KUBE-POSTROUTING');
      post = await commands.listRules('nat', 'POSTROUTING');
    } catch (err) {
      seen.push(`${tool}: ${(err as Error).message}`);
      continue;
    }
    if (kube === undefined) continue;
    const strip = (rules: string[], chain: string) => rules.map((r) => r.slice(`-A ${chain} `.length));
    const walked = walkMarked(strip(kube, 'KUBE-POSTROUTING'), mark);
    const jumped = jumpsToKubePostrouting(strip(post ?? [], 'POSTROUTING'));
    if (walked === 'masquerade' && jumped) {
      return { check: 'masquerade', family, ok: true, detail: `${tool}: KUBE-POSTROUTING masquerades the mark ${hex}` };
    }
    seen.push(
      jumped
        ? `${tool}: KUBE-POSTROUTING does not masquerade packets marked ${hex}`
        : `${tool}: POSTROUTING does not jump to KUBE-POSTROUTING`,
    );
  }
  if (seen.length === 0) seen.push('no KUBE-POSTROUTING chain in either iptables variant');
  return {
    check: 'masquerade',
    family,
    ok: false,
    detail: `${seen.join('; ')}: the node's translated connections keep the LoadBalancer IP as their source and their replies are lost`,
  };
}
