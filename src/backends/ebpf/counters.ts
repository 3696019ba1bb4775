// The BPF program's translation counters (map `translated`, bpf/ipvs_node_controller.bpf.c): a
// per-CPU array of one u64 per (family, source), which the addon sums over the CPUs. Pure.
//
// Slot = COUNTER_IPV4 (0) or COUNTER_IPV6 (2), plus COUNTER_NODE (1) for a socket in the node's
// network namespace; a connect() counts once, an unconnected sendmsg() once per datagram.

import type { TranslatedConnections, TranslatedSource } from '../../driver/driver.js';
import type { Family } from '../../model/types.js';

/** Pinned as <bpffs>/maps/translated. */
export const COUNTER_MAP_NAME = 'translated';

/** What slot i of the map counts, in the BPF source's order. */
export const COUNTER_SLOTS: ReadonlyArray<{ family: Family; source: TranslatedSource }> = [
  { family: 'ipv4', source: 'pods' },
  { family: 'ipv4', source: 'node' },
  { family: 'ipv6', source: 'pods' },
  { family: 'ipv6', source: 'node' },
];

/**
 * The rows of the summed slots. A count is exact up to 2^53 (Number.MAX_SAFE_INTEGER), some
 * thirty years of 10 million translations a second.
 */
export function translatedRows(sums: readonly bigint[]): TranslatedConnections[] {
  if (sums.length !== COUNTER_SLOTS.length) {
    throw new Error(
      `the counter map holds ${sums.length} slots, not ${COUNTER_SLOTS.length}: pins of another release (run --cleanup)`,
    );
  }
  return COUNTER_SLOTS.map((slot, i) => ({ ...slot, connections: Number(sums[i]) }));
}
