// The read back of a verification: the nat table as it is, compared with what our chains must hold
// for the programmed entries. Both variants read it whole with one `-save`: our rules are spread
// over up to 513 chains per family (layout.ts), and one listing of every chain costs less than a
// process per chain (iptables-legacy reads the whole table for any listing anyway).

import type { Entry, Family } from '../../model/types.js';
import type { FamilyShape, ReadBack } from '../../reconciler/driver.js';
import type { IptablesCommands } from './executor.js';
import { KUBE_MARK_MASQ, parseNatSave, type NatTableView } from './parse.js';
import { renderJumpRepairs } from './precedence.js';
import { chainsHold, renderChainRules } from './render.js';

/** The nat table as a verification compares it. */
export async function readVerificationView(commands: IptablesCommands): Promise<NatTableView> {
  return parseNatSave(await commands.save('nat'));
}

/**
 * What differs between `view` and the chains `expected` and `shape` make: 'chains' when our
 * chains differ (they are written whole again), else 'jumps' when a jump must be moved back to
 * rule 1, else nothing. KUBE-MARK-MASQ as it is in `view`: kube-proxy may have created it since
 * our chains were written.
 */
export function shapeDrift(
  family: Family,
  view: NatTableView,
  expected: readonly Entry[],
  shape: FamilyShape,
): string[] {
  const layout = renderChainRules(
    family,
    { entries: [...expected], localPodMatch: shape.state.localPodMatch },
    shape.masqueradeMark,
    view.chains.has(KUBE_MARK_MASQ),
  );
  if (!chainsHold(view, layout)) return ['chains'];
  return renderJumpRepairs(view).length > 0 ? ['jumps'] : [];
}

/** A read back of one family, with the ruleset generation it was read at when nobody committed meanwhile. */
export async function readBackFamily(
  commands: IptablesCommands,
  expected: readonly Entry[],
  shape: FamilyShape,
): Promise<ReadBack> {
  const basis = await commands.generation();
  const view = await readVerificationView(commands);
  const settled = basis !== undefined && (await commands.generation()) === basis;
  const read: ReadBack = { missing: [], foreign: [], shapeDrift: shapeDrift(commands.family, view, expected, shape) };
  if (settled) read.generation = basis;
  return read;
}
