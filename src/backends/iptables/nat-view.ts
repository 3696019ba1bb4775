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
import { JUMPS, KUBE_MARK_MASQ, emptyNatTable, hasOurObjects, parseNatSave, type NatTableView } from './parse.js';
import { renderCleanupRestore } from './render.js';
import { chainsJumpedTo } from './precedence.js';

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
      lines.map((l) => l.slice(`-A ${chain} `.length)),
    );
  }
  return view;
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
export async function hasIptablesObjects(variant: IptablesVariant): Promise<boolean> {
  for (const family of FAMILIES) {
    const current = await readNatTable(new IptablesCommands(variant, family));
    if (current && hasOurObjects(current)) return true;
  }
  return false;
}
