// The read back of a verification: the nat table as it is, compared with what our chains must hold
// for the programmed entries. Both variants read it whole with one `-save`: our rules are spread
// over up to 513 chains per family and two per Service with source ranges (layout.ts), and one
// listing of every chain costs less than a process per chain (iptables-legacy reads the whole
// table for any listing anyway).

import type { Entry, Family } from '../../model/types.js';
import type { FamilyShape } from '../../driver/driver.js';
import type { IptablesCommands } from './executor.js';
import { parseNatSave, type NatTableView } from './parse.js';
import { renderJumpRepairs } from './precedence.js';
import { compareState } from './render.js';

/**
 * The nat table as a verification compares it, with the ruleset generation it was read at when
 * nobody committed meanwhile (iptables-nft).
 */
export async function readVerificationView(
  commands: IptablesCommands,
): Promise<{ view: NatTableView; generation?: number }> {
  const basis = await commands.generation();
  const view = parseNatSave(await commands.save('nat'));
  const settled = basis !== undefined && (await commands.generation()) === basis;
  return settled ? { view, generation: basis } : { view };
}

/**
 * What differs between `view` and the chains `expected` and `shape` make (with or without
 * comments): 'chains' when our
 * chains differ, or when chains of ours that nothing wants are left in the table (`strays`: a
 * Service's source-range chain or a bucket chain from before a restart, say), and they are written
 * whole again; else 'jumps' when a jump must be moved back to rule 1, else nothing. KUBE-MARK-MASQ
 * as it is in `view`: kube-proxy may have created it since our chains were written. The
 * comparison gives the event loop back every few chains.
 */
export async function shapeDrift(
  family: Family,
  view: NatTableView,
  expected: readonly Entry[],
  shape: FamilyShape,
  comments = true,
): Promise<{ drift: string[]; strays: string[] }> {
  const state = { entries: [...expected], localPodMatch: shape.state.localPodMatch };
  const pause = () => new Promise<void>((r) => setImmediate(r));
  const { held, strays } = await compareState(view, family, state, shape.masqueradeMark, pause, comments);
  if (!held || strays.length > 0) return { drift: ['chains'], strays };
  return { drift: renderJumpRepairs(view).length > 0 ? ['jumps'] : [], strays };
}
