// A change between two desired states as the reconciler tells it (its publication, when the
// family was written whole): for tests of what subscribers make of a change.

import type { KernelChange } from '../../src/driver/kernel-change.js';
import { FAMILIES, type DesiredState } from '../../src/model/types.js';
import { familyChange } from '../../src/reconciler/publication.js';

export function changeBetween(previous: DesiredState | undefined, next: DesiredState): KernelChange {
  const families = FAMILIES.map((family) => familyChange(family, previous?.[family], next[family], 'whole'));
  return { previous, next, families };
}
