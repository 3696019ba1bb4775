// The conntrack addon (native/conntrack_addon.cc, build/Release/conntrack_addon.node): deletes the
// entries of many tuples through ctnetlink in the process, on a libuv worker thread, where the
// `conntrack` command took a process (a fork and exec on the controller's main thread) per tuple.
// Not built (no libmnl-dev) or not loaded: the cleaner runs the command, as before.
//
// A call is bounded: it deletes at most `total` entries, and each tuple has a share of its own
// (at most min(perTarget, total / tuples) of its entries), so that one tuple's flows never take
// another's. A tuple with more entries than its share is returned as truncated: the rest of its
// entries are still there, for the cleaner to delete. A kernel that deletes by a filter (Linux
// 6.12 and later) is asked that for a few IPv4 tuples instead (flushed): no dump, no share, every
// entry of the tuple gone, their number not known.

import { addonPath, hasFunctions, loadNativeAddon } from '../native-addon.js';
import type { Family } from '../model/types.js';
import type { StaleTuple } from './stale-tuples.js';
import type { Logger } from 'pino';

/**
 * Entries one call keeps to delete: in all, and of one tuple. The addon's defaults: 65,536 each.
 * `flush: false`: never ask the kernel to delete by a filter (the dumps do it).
 */
export interface ConntrackLimits {
  total?: number;
  perTarget?: number;
  flush?: boolean;
}

/** What native/conntrack_addon.cc exports. */
interface ConntrackAddon {
  /**
   * Deletes the entries whose original destination is one of `targets` (one a line:
   * `protocol-number address port untranslated-only(0|1)`), after one dump of the family's table
   * (or one filtered dump per protocol and port of the targets, up to a few), or, for a few IPv4
   * targets on a kernel that does it, one deletion by filter each. `dumps`: walks of the table
   * (dumps asked for); `flushes`: targets deleted by filter; `flushRefused`: why the kernel
   * refused that the first time (the dumps did it); `refusesFlush`: whether the kernel is known
   * to refuse it, by this call or an earlier one. `truncated`: the targets (index of their
   * line) that matched more entries than their share. Rejects with the kernel's reason.
   */
  deleteMatching(
    family: Family,
    targets: string,
    timeoutMs?: number,
    limits?: ConntrackLimits,
  ): Promise<{
    dumped: number;
    dumps: number;
    flushes: number;
    flushRefused?: string;
    refusesFlush: boolean;
    matched: number;
    deleted: number;
    ms: number;
    share: number;
    truncated: Array<{ target: number; matched: number; kept: number }>;
  }>;
}

const PROTOCOL_NUMBERS: Record<StaleTuple['protocol'], number> = { UDP: 17, SCTP: 132 };

/** A tuple whose entries were more than its share of one call: `matched - deleted` or so are left. */
export interface TruncatedTuple {
  tuple: StaleTuple;
  /** Its entries that the call saw. */
  matched: number;
  /** Of which the call deleted (or found gone): its share. */
  deleted: number;
}

/** What one call did. */
export interface NetlinkDeletion {
  deleted: number;
  /** Walks of the conntrack table the call made (each costs the table's size, entries or not). */
  dumps: number;
  /** Tuples whose entries the kernel deleted by a filter (how many entries: not known). */
  flushed: number;
  /** Why the kernel refused to delete by a filter, when this call learned it did. */
  flushRefused?: string;
  /** Whether the kernel is known to refuse deletions by a filter (by this call or an earlier one). */
  refusesFlush?: boolean;
  truncated: TruncatedTuple[];
}

/** What the cleaner asks of the addon. */
export interface ConntrackNetlink {
  /** Deletes the entries of `tuples` (all of `family`), each up to its share of the call. */
  deleteMatching(family: Family, tuples: readonly StaleTuple[], timeoutMs: number): Promise<NetlinkDeletion>;
}

/** The tuples with one (protocol, address, port) each: all entries go if any of them asks so. */
function distinct(tuples: readonly StaleTuple[]): StaleTuple[] {
  const byKey = new Map<string, StaleTuple>();
  for (const t of tuples) {
    const k = `${t.protocol} ${t.externalIp} ${t.port}`;
    const seen = byKey.get(k);
    if (seen === undefined) byKey.set(k, t);
    else if (seen.untranslatedOnly && !t.untranslatedOnly) byKey.set(k, { ...seen, untranslatedOnly: false });
  }
  return [...byKey.values()];
}

class AddonConntrackNetlink implements ConntrackNetlink {
  constructor(
    private readonly addon: ConntrackAddon,
    private readonly limits: ConntrackLimits,
  ) {}

  async deleteMatching(family: Family, tuples: readonly StaleTuple[], timeoutMs: number): Promise<NetlinkDeletion> {
    const asked = distinct(tuples);
    const targets = asked
      .map((t) => `${PROTOCOL_NUMBERS[t.protocol]} ${t.externalIp} ${t.port} ${t.untranslatedOnly ? 1 : 0}`)
      .join('\n');
    const result = await this.addon.deleteMatching(family, targets, timeoutMs, this.limits);
    return {
      deleted: result.deleted,
      dumps: result.dumps,
      flushed: result.flushes,
      ...(result.flushRefused === undefined ? {} : { flushRefused: result.flushRefused }),
      refusesFlush: result.refusesFlush,
      truncated: result.truncated.map((t) => ({ tuple: asked[t.target]!, matched: t.matched, deleted: t.kept })),
    };
  }
}

/**
 * The addon's client, or why there is none (one line). Never throws. `limits`: the bounds of one
 * call (tests make them small).
 */
export function loadConntrackNetlink(
  path = addonPath('conntrack_addon.node'),
  limits: ConntrackLimits = {},
): { netlink: ConntrackNetlink; reason?: undefined } | { netlink?: undefined; reason: string } {
  const load = loadNativeAddon(path, (v): v is ConntrackAddon => hasFunctions(v, ['deleteMatching']), {
    missing: (p) => `the conntrack addon is not built (${p} is missing; it needs libmnl-dev)`,
    broken: (_, error) => `the conntrack addon did not load (${error})`,
    notTheAddon: (p) => `${p} is not the conntrack addon`,
  });
  return load.ok ? { netlink: new AddonConntrackNetlink(load.addon, limits) } : { reason: load.reason };
}

// Deleting one family's stale tuples in process (conntrack-netlink.ts), within the bounds of a
// call: each call deletes at most its total, and each tuple at most its own share, so a tuple
// with more entries than its share is truncated and its other entries stay. Those are completed
// by further calls with the truncated tuples alone (a larger share each, as there are fewer),
// while each call deletes something, NETLINK_ROUNDS calls in all: each bounded in memory and
// time, the rounds bounded in number. What is still left then goes to the conntrack command
// (conntrack-cleaner.ts), one process per tuple, each within its timeout.
//
// Why further calls before the command: one round reads the table once for every truncated
// tuple, where the command reads it once per tuple (1.2 s per process beside 100,000 entries,
// measured); for the entries of one tuple both delete at the same rate (about 30,000 a second).

/**
 * Netlink calls per family and clean-up: the first with every tuple, the others with the tuples
 * still truncated. Each deletes at most its bound (65,536 entries: about 2 s on a loaded 2-core
 * machine), so a clean-up spends at most about 8 s per family in process.
 */
export const NETLINK_ROUNDS = 4;

/** Truncated tuples a log line names, at most (the count says how many there were). */
const NAMED_TRUNCATED = 8;

export interface InProcessDeletion {
  deleted: number;
  /** Tuples whose entries the kernel deleted by a filter. */
  flushed: number;
  /** Why the kernel refused to delete by a filter, when a call learned it did. */
  flushRefused?: string;
  /** The tuples the first call truncated. */
  truncated: TruncatedTuple[];
  /**
   * The tuples for the command: still truncated after the rounds, or not done when a call
   * failed (all of them when the first did).
   */
  left: StaleTuple[];
  /** Of `left`, the truncated tuples the command completes. */
  completing: number;
  /** A call's failure. */
  error?: unknown;
}

/** Deletes the entries of `tuples` (all of `family`) in rounds. Never throws. */
export async function deleteInRounds(
  netlink: ConntrackNetlink,
  family: Family,
  tuples: readonly StaleTuple[],
  timeoutMs: number,
  rounds: number,
): Promise<InProcessDeletion> {
  const out: InProcessDeletion = { deleted: 0, flushed: 0, truncated: [], left: [], completing: 0 };
  let todo: readonly StaleTuple[] = tuples;
  for (let round = 0; todo.length > 0 && round < rounds; round++) {
    let result;
    try {
      result = await netlink.deleteMatching(family, todo, timeoutMs);
    } catch (err) {
      out.error = err;
      break;
    }
    out.deleted += result.deleted;
    out.flushed += result.flushed;
    if (result.flushRefused !== undefined) out.flushRefused ??= result.flushRefused;
    if (round === 0) out.truncated = result.truncated;
    todo = result.truncated.map((t) => t.tuple);
    // Nothing deleted (every entry went meanwhile): another call would not do better.
    if (result.deleted === 0) break;
  }
  out.left = [...todo];
  out.completing = todo === tuples ? 0 : todo.length;
  return out;
}

/** What deleteFamilies did, both families together. */
export interface FamiliesDeletion {
  deleted: number;
  flushed: number;
  /** The tuples the first call of each family truncated, and how many per family. */
  truncated: TruncatedTuple[];
  truncatedByFamily: Partial<Record<Family, number>>;
  /** Of `left`, the truncated tuples the command completes. */
  completing: number;
  /** The tuples for the command. */
  left: StaleTuple[];
}

/**
 * Deletes the entries of `tuples` in process, each family in rounds (deleteInRounds). Said once
 * per run (`said` keeps track): a call's failure (the command then does that family), and a
 * kernel's refusal to delete by a filter (the dumps then do it). Never throws.
 */
export async function deleteFamilies(
  netlink: ConntrackNetlink,
  tuples: readonly StaleTuple[],
  options: {
    timeoutMs: number;
    rounds: number;
    logger: Logger;
    said: { netlinkFailure: boolean; flushRefusal: boolean };
  },
): Promise<FamiliesDeletion> {
  const out: FamiliesDeletion = {
    deleted: 0,
    flushed: 0,
    truncated: [],
    truncatedByFamily: {},
    completing: 0,
    left: [],
  };
  const { logger, said } = options;
  for (const family of ['ipv4', 'ipv6'] as const) {
    const ofFamily = tuples.filter((t) => t.family === family);
    if (ofFamily.length === 0) continue;
    const done = await deleteInRounds(netlink, family, ofFamily, options.timeoutMs, options.rounds);
    out.deleted += done.deleted;
    out.flushed += done.flushed;
    if (done.truncated.length > 0) out.truncatedByFamily[family] = done.truncated.length;
    out.truncated.push(...done.truncated);
    out.completing += done.completing;
    out.left.push(...done.left);
    if (done.flushRefused !== undefined && !said.flushRefusal) {
      said.flushRefusal = true;
      logger.info(
        { reason: done.flushRefused },
        'This kernel does not delete conntrack entries by a filter (Linux 6.12 and later do): each clean-up reads the conntrack table instead, a walk of its whole hash table with softirqs off',
      );
    }
    // The command may still manage; it reports its own failures.
    if (done.error !== undefined && !said.netlinkFailure) {
      said.netlinkFailure = true;
      logger.warn(
        { family, err: done.error },
        'Deleting conntrack entries in process failed, the conntrack command does it instead',
      );
    }
  }
  return out;
}

/**
 * One log line for a clean-up's truncated tuples (none: no line), naming the first few:
 * `udp 192.0.2.1:53 (70000 entries)`. `byCommand`: how many the command completed; `failures`:
 * the clean-up's.
 */
export function logTruncated(
  logger: Logger,
  truncated: readonly TruncatedTuple[],
  byCommand: number,
  failures: number,
): void {
  if (truncated.length === 0) return;
  const tuples = truncated.slice(0, NAMED_TRUNCATED).map(({ tuple: t, matched }) => {
    const address = t.family === 'ipv6' ? `[${t.externalIp}]` : t.externalIp;
    return `${t.protocol.toLowerCase()} ${address}:${t.port} (${matched} entries)`;
  });
  logger.info(
    { truncated: truncated.length, tuples, byCommand, failures },
    'Stale conntrack entries of some tuples were more than their share of one in-process deletion: further calls deleted the rest, and the conntrack command what they left (byCommand tuples)',
  );
}
