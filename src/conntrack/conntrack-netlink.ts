// The conntrack addon (native/conntrack_addon.cc, build/Release/conntrack_addon.node): deletes the
// entries of many tuples through ctnetlink in the process, on a libuv worker thread, where the
// `conntrack` command took a process (a fork and exec on the controller's main thread) per tuple.
// Not built (no libmnl-dev) or not loaded: the cleaner runs the command, as before.

import { addonPath, hasFunctions, loadNativeAddon } from '../native-addon.js';
import type { Family } from '../model/types.js';
import type { StaleTuple } from './stale-tuples.js';

/** What native/conntrack_addon.cc exports. */
interface ConntrackAddon {
  /**
   * Deletes the entries whose original destination is one of `targets` (one a line:
   * `protocol-number address port untranslated-only(0|1)`), after one dump of the family's table.
   * Rejects with the kernel's reason.
   */
  deleteMatching(
    family: Family,
    targets: string,
    timeoutMs?: number,
  ): Promise<{ dumped: number; matched: number; deleted: number; ms: number }>;
}

const PROTOCOL_NUMBERS: Record<StaleTuple['protocol'], number> = { UDP: 17, SCTP: 132 };

/** What the cleaner asks of the addon. */
export interface ConntrackNetlink {
  /** Deletes the entries of `tuples` (all of `family`); resolves how many were deleted. */
  deleteMatching(family: Family, tuples: readonly StaleTuple[], timeoutMs: number): Promise<number>;
}

class AddonConntrackNetlink implements ConntrackNetlink {
  constructor(private readonly addon: ConntrackAddon) {}

  async deleteMatching(family: Family, tuples: readonly StaleTuple[], timeoutMs: number): Promise<number> {
    const targets = tuples
      .map((t) => `${PROTOCOL_NUMBERS[t.protocol]} ${t.externalIp} ${t.port} ${t.untranslatedOnly ? 1 : 0}`)
      .join('\n');
    const result = await this.addon.deleteMatching(family, targets, timeoutMs);
    return result.deleted;
  }
}

/** The addon's client, or why there is none (one line). Never throws. */
export function loadConntrackNetlink(
  path = addonPath('conntrack_addon.node'),
): { netlink: ConntrackNetlink; reason?: undefined } | { netlink?: undefined; reason: string } {
  const load = loadNativeAddon(path, (v): v is ConntrackAddon => hasFunctions(v, ['deleteMatching']), {
    missing: (p) => `the conntrack addon is not built (${p} is missing; it needs libmnl-dev)`,
    broken: (_, error) => `the conntrack addon did not load (${error})`,
    notTheAddon: (p) => `${p} is not the conntrack addon`,
  });
  return load.ok ? { netlink: new AddonConntrackNetlink(load.addon) } : { reason: load.reason };
}
