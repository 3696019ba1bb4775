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

import type { Logger } from 'pino';
import type { Family } from '../model/types.js';
import type { ConntrackNetlink, TruncatedTuple } from './conntrack-netlink.js';
import type { StaleTuple } from './stale-tuples.js';

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
  const out: InProcessDeletion = { deleted: 0, truncated: [], left: [], completing: 0 };
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
    if (round === 0) out.truncated = result.truncated;
    todo = result.truncated.map((t) => t.tuple);
    // Nothing deleted (every entry went meanwhile): another call would not do better.
    if (result.deleted === 0) break;
  }
  out.left = [...todo];
  out.completing = todo === tuples ? 0 : todo.length;
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
