// What our iptables writes read of the nat table, and the removal of our objects: shared by the
// driver and the jump guard.

import { FAMILIES, type Family } from '../../model/types.js';
import {
  IptablesCommands,
  IptablesToolMissing,
  systemIptablesRunner,
  type IptablesRunner,
  type IptablesVariant,
} from './executor.js';
import { ENTRY_CHAINS, JUMPS, isOurChain, parseBucketChain } from './layout.js';
import {
  KUBE_MARK_MASQ,
  emptyNatTable,
  hasOurObjects,
  jumpsToOurChain,
  parseNatSave,
  savedSpec,
  type NatTableView,
} from './parse.js';
import { chainsJumpedTo, targetOf } from './precedence.js';

/** A restore can lose a race with another writer between our read and our write: read again. */
const ATTEMPTS = 3;

export async function withRetries<T>(work: () => Promise<T>): Promise<T> {
  let lastError: unknown;
  for (let attempt = 0; attempt < ATTEMPTS; attempt++) {
    try {
      return await work();
    } catch (err) {
      if (err instanceof IptablesToolMissing) throw err;
      lastError = err;
    }
  }
  throw lastError;
}

/**
 * The nat table of a variant and family, or undefined when it cannot hold anything of ours:
 * the tools are missing, or (legacy) the table was never created — looking would create it.
 */
export async function readNatTable(commands: IptablesCommands): Promise<NatTableView | undefined> {
  if (commands.variant === 'legacy') {
    const tables = await commands.runner.legacyTables(commands.family);
    if (!tables?.has('nat')) return undefined;
  }
  try {
    return parseNatSave(await commands.save('nat'));
  } catch (err) {
    if (err instanceof IptablesToolMissing) return undefined;
    throw err;
  }
}

/**
 * What a sync needs to know of the nat table: the rules of PREROUTING and OUTPUT and whether
 * KUBE-MARK-MASQ exists. iptables-nft lists single chains cheaply (a whole -save of a large
 * table takes about as long as writing it); iptables-legacy reads the whole table blob for any
 * listing, so one -save is cheapest there.
 */
export async function readJumpView(commands: IptablesCommands): Promise<NatTableView> {
  if (commands.variant === 'legacy') return parseNatSave(await commands.save('nat'));
  const view = await readChains(commands, [...JUMPS.map((j) => j.from), KUBE_MARK_MASQ], emptyNatTable());
  // The chains that rules above our jumps lead to, to any depth: whether they can take a packet
  // away from our jump (precedence.ts) depends on their rules.
  let wanted = JUMPS.flatMap(({ from, to }) => {
    const specs = view.rules.get(from) ?? [];
    const ours = specs.indexOf(`-j ${to}`);
    return chainsJumpedTo(ours < 0 ? [] : specs.slice(0, ours));
  });
  for (let depth = 0; depth < MAX_FOLLOWED_DEPTH && wanted.length > 0; depth++) {
    const next = [...new Set(wanted)].filter((c) => !view.rules.has(c)).slice(0, MAX_FOLLOWED_CHAINS);
    await readChains(commands, next, view);
    wanted = next.flatMap((c) => chainsJumpedTo(view.rules.get(c) ?? []));
  }
  return view;
}

/**
 * What a whole write needs to know of the nat table: the jump view, and the bucket chains of ours
 * that exist, which it removes when the state no longer needs them. iptables-legacy has read the
 * whole table; iptables-nft lists our entry chains (at most 256 gotos each; the whole flat chain of
 * an earlier version once) and takes the bucket chains they go to (a bucket chain no goto reaches
 * is walked by no packet: it stays until --cleanup, which lists the whole table).
 */
export async function readWriteView(commands: IptablesCommands): Promise<NatTableView> {
  const view = await readJumpView(commands);
  if (commands.variant === 'legacy') return view;
  await readChains(commands, ENTRY_CHAINS, view);
  for (const entry of ENTRY_CHAINS) {
    for (const spec of view.rules.get(entry) ?? []) {
      const target = targetOf(spec)?.name;
      if (target !== undefined && parseBucketChain(target)) view.chains.add(target);
    }
  }
  return view;
}

/** How far readJumpView follows jumps above ours, and how many chains it lists per step (more are judged harmful). */
const MAX_FOLLOWED_DEPTH = 8;
const MAX_FOLLOWED_CHAINS = 16;

/** Adds the rules of `chains` (those that exist) to `view`, one listing each (iptables-nft). */
export async function readChains(
  commands: IptablesCommands,
  chains: readonly string[],
  view: NatTableView,
): Promise<NatTableView> {
  for (const chain of chains) {
    const lines = await commands.listRules('nat', chain);
    if (lines === undefined) continue;
    view.chains.add(chain);
    view.rules.set(
      chain,
      lines.map((l) => savedSpec(chain, l.slice(`-A ${chain} `.length))),
    );
  }
  return view;
}

/**
 * Removes every object of ours from the nat table: jumps to our chains from other chains
 * (wherever they are), then our chains, emptied first so that none is still jumped to.
 * Undefined when there is nothing of ours.
 */
export function renderCleanupRestore(current: NatTableView): string | undefined {
  if (!hasOurObjects(current)) return undefined;
  const lines = ['*nat'];
  for (const [chain, specs] of current.rules) {
    if (isOurChain(chain)) continue;
    for (const spec of specs) if (jumpsToOurChain(spec)) lines.push(`-D ${chain} ${spec}`);
  }
  const ours = [...current.chains].filter(isOurChain);
  for (const chain of ours) lines.push(`:${chain} - [0:0]`);
  for (const chain of ours) lines.push(`-X ${chain}`);
  lines.push('COMMIT', '');
  return lines.join('\n');
}

/** Removes our chains and jumps from one variant and family. Idempotent; nothing to do without the tools. */
export async function removeIptablesObjects(
  variant: IptablesVariant,
  family: Family,
  runner: IptablesRunner = systemIptablesRunner,
): Promise<void> {
  const commands = new IptablesCommands(variant, family, runner);
  await withRetries(async () => {
    const current = await readNatTable(commands);
    const input = current && renderCleanupRestore(current);
    if (input) await commands.restore(input);
  });
}

/** Whether a variant holds any chain or jump of ours, in either family. */
export async function hasIptablesObjects(
  variant: IptablesVariant,
  commands: (family: Family) => IptablesCommands = (family) => new IptablesCommands(variant, family),
): Promise<boolean> {
  for (const family of FAMILIES) {
    const current = await readNatTable(commands(family));
    if (current && hasOurObjects(current)) return true;
  }
  return false;
}
