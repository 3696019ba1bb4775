// Deletes stale conntrack entries after the kernel holds the new rules: a flow's next packet then
// starts a new entry and meets the new translation (or none). Through ctnetlink in the process
// where the conntrack addon is built (conntrack-netlink.ts: a deletion by filter per tuple on
// Linux 6.12 and later for a few IPv4 tuples, else filtered dumps, no process), else with the `conntrack` command (conntrack-tools), which is also what a failed
// netlink call falls back to. Failures are reported, never thrown: a stale UDP flow is a smaller
// harm than a sync that does not finish.
//
// A netlink call is bounded, and each tuple has its own share of it (conntrack-netlink.ts): the
// flows of one tuple (a tenant's 64k flows to its own address) never keep another tuple's
// entries. A tuple with more entries than its share is truncated: counted, logged (once per
// clean-up, naming the tuples), and completed by further calls with only the truncated tuples
// (conntrack-netlink.ts, deleteInRounds), then by the command for what is still left.
//
// Memory does not grow with the conntrack table: a listing (millions of entries on a busy node
// print hundreds of megabytes) is read line by line and only the tuples asked for are kept, and
// it is stopped as soon as each of them is found; what a deletion prints of the entries it deleted
// is not read. Time is bounded by the timeout of each command.

import { execa } from 'execa';
import type { Logger } from 'pino';
import type { Entry, Family } from '../model/types.js';
import type { ConntrackNetlink, TruncatedTuple } from './conntrack-netlink.js';
import { NETLINK_ROUNDS, deleteFamilies, logTruncated } from './conntrack-netlink.js';
import type { ConntrackProtocol, StaleTuple } from './stale-tuples.js';

export interface ConntrackCleanupReport {
  /** Tuples asked for. */
  tuples: number;
  /** Conntrack entries deleted one by one (a deletion by filter does not say how many it took). */
  deleted: number;
  /** Tuples whose entries the kernel deleted by a filter (Linux 6.12 and later, IPv4). Absent: none. */
  flushed?: number;
  /** Deletions (or listings) that failed; their entries may still be there. */
  failures: number;
  durationMs: number;
  /**
   * Per family, tuples with more entries than their share of one in-process deletion (the rest
   * were deleted by further calls, then the command). Absent: none.
   */
  truncated?: Partial<Record<Family, number>>;
}

export interface ConntrackCleanerOptions {
  logger: Logger;
  /** The conntrack command; a test can point it elsewhere. */
  command?: string;
  /** Per command; a hung conntrack must not hold the sync loop for long. */
  timeoutMs?: number;
  /**
   * Above this many tuples of one family and protocol, the table is listed once and only the
   * tuples that have entries are deleted (a process per tuple costs milliseconds each).
   */
  listAbove?: number;
  /** Deletes through ctnetlink in the process (conntrack-netlink.ts); without it, the command. */
  netlink?: ConntrackNetlink;
  /** Netlink calls per family and clean-up, at most (default NETLINK_ROUNDS); then the command. */
  netlinkRounds?: number;
}

/** Flows of a bypass window deleted at most: the window is short, a flood is not ours to clear. */
export const MAX_FORGOTTEN_FLOWS = 512;

/** An unanswered flow: protocol, original source, destination and ports, then the reply's source. */
const UNREPLIED_FLOW =
  /^(tcp|udp|sctp)\s+\d+\s+\d+\s+(?:[A-Z_]+\s+)?src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+) \[UNREPLIED\] src=(\S+) /;

/** `conntrack -D` prints "N flow entries have been deleted." on stderr, and exits 1 for N = 0. */
const DELETED = /(\d+) flow entries have been deleted/;

/** In `conntrack -L` lines: the original direction's dst and dport, then the reply direction's src. */
const LISTED = /\bdst=(\S+) .*?\bdport=(\d+)\b.*?\bsrc=(\S+) /;

/**
 * Longest `conntrack -L` line read. A line is a few hundred bytes (two IPv6 tuples, mark, zone,
 * labels); a longer one is not a listing, and the listing fails.
 */
export const MAX_LISTED_LINE_BYTES = 64 << 10;
/** What is read of a command's stderr: its message is one line. */
const MAX_STDERR_BYTES = 64 << 10;

/** What a bypass clean-up needs of an entry. */
type ForgetKey = Pick<Entry, 'externalIp' | 'protocol' | 'port'>;

/** conntrack prints IPv6 addresses in the canonical text form the model uses. */
function key(ip: string, port: number): string {
  return `${ip}|${port}`;
}

export class ConntrackCleaner {
  private readonly command: string;
  private readonly timeoutMs: number;
  private readonly listAbove: number;
  private readonly netlinkRounds: number;
  private missingReported = false;
  /** What the in-process deletion said once per run (conntrack-netlink.ts, deleteFamilies). */
  private readonly said = { netlinkFailure: false, flushRefusal: false };
  /** Per family, the bypass clean-up under way, and the entries of one asked for meanwhile. */
  private readonly forgetting = new Map<Family, { run: Promise<void>; next?: readonly ForgetKey[] }>();

  constructor(private readonly options: ConntrackCleanerOptions) {
    this.command = options.command ?? 'conntrack';
    this.timeoutMs = options.timeoutMs ?? 5000;
    this.listAbove = options.listAbove ?? 16;
    this.netlinkRounds = Math.max(1, options.netlinkRounds ?? NETLINK_ROUNDS);
  }

  /** Deletes the entries of every tuple. Never throws; failures are logged and counted. */
  async clean(tuples: readonly StaleTuple[]): Promise<ConntrackCleanupReport> {
    const started = performance.now();
    const report: ConntrackCleanupReport = { tuples: tuples.length, deleted: 0, failures: 0, durationMs: 0 };
    const errors: string[] = [];
    let firstError: unknown;
    let viaCommand: readonly StaleTuple[] = tuples;
    /** Tuples truncated by a first call, and those of them the command completes. */
    const truncated: TruncatedTuple[] = [];
    let completedByCommand = 0;
    if (this.options.netlink) {
      const done = await deleteFamilies(this.options.netlink, tuples, {
        timeoutMs: this.timeoutMs,
        rounds: this.netlinkRounds,
        logger: this.options.logger,
        said: this.said,
      });
      report.deleted += done.deleted;
      if (done.flushed > 0) report.flushed = done.flushed;
      if (done.truncated.length > 0) report.truncated = done.truncatedByFamily;
      truncated.push(...done.truncated);
      completedByCommand = done.completing;
      viaCommand = done.left;
    }
    const groups = new Map<string, StaleTuple[]>();
    for (const t of viaCommand) {
      const g = `${t.family}|${t.protocol}`;
      if (!groups.has(g)) groups.set(g, []);
      groups.get(g)!.push(t);
    }
    for (const group of groups.values()) {
      let todo = group;
      if (group.length > this.listAbove) {
        try {
          todo = await this.withEntries(group);
        } catch (err) {
          report.failures++;
          errors.push((err as Error).message);
          firstError ??= err;
          // Deleting blindly is still right, only slower.
        }
      }
      for (const t of todo) {
        try {
          report.deleted += await this.delete(t);
        } catch (err) {
          report.failures++;
          errors.push((err as Error).message);
          firstError ??= err;
          if (this.missing(err)) break;
        }
      }
    }
    report.durationMs = performance.now() - started;
    logTruncated(this.options.logger, truncated, completedByCommand, report.failures);
    if (errors.length > 0 && !(this.missingReported && errors.every((e) => e.includes('was not found')))) {
      if (errors.some((e) => e.includes('was not found'))) this.missingReported = true;
      this.options.logger.warn(
        { failures: report.failures, tuples: report.tuples, err: firstError },
        'Failed to delete stale conntrack entries, UDP/SCTP flows may keep their old translation until idle',
      );
    }
    if (report.deleted > 0 || report.flushed !== undefined) {
      this.options.logger.debug(
        { deleted: report.deleted, flushed: report.flushed, tuples: report.tuples, ms: Math.round(report.durationMs) },
        'Deleted stale conntrack entries',
      );
    }
    return report;
  }

  /**
   * Deletes the conntrack entries that a bypass window pinned (TranslationsBypassed): flows to one
   * of `entries`' (external IP, protocol, port) whose first packet was not translated (the reply
   * would come from the external IP itself) and that no reply has reached. NAT is decided on a
   * flow's first packet: left alone, every retransmitted SYN of such a connection follows the
   * untranslated entry until it times out; deleted, the next one meets our DNAT. Flows that were
   * answered are left alone (they work, through whatever answered them). At most
   * MAX_FORGOTTEN_FLOWS per call. One clean-up per family at a time: a call while one runs is
   * done once after it (the latest entries), and `onReport` is given each report. Never throws.
   */
  forgetUntranslated(
    family: Family,
    entries: readonly ForgetKey[],
    onReport?: (report: ConntrackCleanupReport) => void,
  ): Promise<void> {
    const under = this.forgetting.get(family);
    if (under) {
      under.next = entries;
      return under.run;
    }
    const state: { run: Promise<void>; next?: readonly ForgetKey[] } = { run: Promise.resolve() };
    state.run = (async () => {
      let todo: readonly ForgetKey[] | undefined = entries;
      while (todo) {
        state.next = undefined;
        const report = await this.forgetOnce(family, todo);
        onReport?.(report);
        todo = state.next;
      }
      this.forgetting.delete(family);
    })();
    this.forgetting.set(family, state);
    return state.run;
  }

  private async forgetOnce(family: Family, entries: readonly ForgetKey[]): Promise<ConntrackCleanupReport> {
    const started = performance.now();
    const report: ConntrackCleanupReport = { tuples: entries.length, deleted: 0, failures: 0, durationMs: 0 };
    const keys = new Set(entries.map((e) => `${e.externalIp} ${e.protocol.toLowerCase()} ${e.port}`));
    const protocols = (['tcp', 'udp', 'sctp'] as const).filter((p) =>
      entries.some((e) => e.protocol.toLowerCase() === p),
    );
    let firstError: unknown;
    const flows: string[][] = [];
    for (const protocol of protocols) {
      if (flows.length >= MAX_FORGOTTEN_FLOWS) break;
      try {
        await this.list(['-L', '-f', family, '-p', protocol], (line) => {
          const m = UNREPLIED_FLOW.exec(line);
          if (!m) return true;
          const [, proto, src, dst, sport, dport, replySrc] = m as unknown as string[];
          if (replySrc !== dst || !keys.has(`${dst!} ${proto!} ${dport!}`)) return true;
          flows.push(['-D', '-f', family, '-p', proto!, '-s', src!, '-d', dst!, '--sport', sport!, '--dport', dport!]);
          return flows.length < MAX_FORGOTTEN_FLOWS;
        });
      } catch (err) {
        report.failures++;
        firstError ??= err;
        if (this.missing(err)) break;
      }
    }
    for (const args of flows) {
      try {
        report.deleted += Number(DELETED.exec(await this.run(args))?.[1] ?? 0);
      } catch (err) {
        report.failures++;
        firstError ??= err;
        if (this.missing(err)) break;
      }
    }
    report.durationMs = performance.now() - started;
    if (firstError !== undefined && !(this.missingReported && this.missing(firstError))) {
      if (this.missing(firstError)) this.missingReported = true;
      this.options.logger.warn(
        { family, failures: report.failures, err: firstError },
        'Failed to delete conntrack entries of connections that started untranslated while our jump was displaced',
      );
    }
    if (report.deleted > 0) {
      this.options.logger.info(
        { family, deleted: report.deleted, ms: Math.round(report.durationMs) },
        'Deleted conntrack entries of connections that started untranslated while our jump was displaced',
      );
    }
    return report;
  }

  private missing(err: unknown): boolean {
    return err instanceof Error && err.message.includes('was not found');
  }

  /** The tuples of one family and protocol that have at least one matching entry now. */
  private async withEntries(group: StaleTuple[]): Promise<StaleTuple[]> {
    const first = group[0]!;
    // The keys asked for, with any entry or with an untranslated one; what was found of each.
    const anyWanted = new Set(group.filter((t) => !t.untranslatedOnly).map((t) => key(t.externalIp, t.port)));
    const untranslatedWanted = new Set(group.filter((t) => t.untranslatedOnly).map((t) => key(t.externalIp, t.port)));
    const present = new Set<string>();
    const untranslated = new Set<string>();
    let missing = anyWanted.size + untranslatedWanted.size;
    await this.list(['-L', '-f', first.family, '-p', first.protocol.toLowerCase()], (line) => {
      const m = LISTED.exec(line);
      if (!m) return true;
      const k = key(m[1]!, Number(m[2]));
      if (anyWanted.has(k) && !present.has(k)) missing--;
      if (m[3] === m[1] && untranslatedWanted.has(k) && !untranslated.has(k)) {
        missing--;
        untranslated.add(k);
      }
      if (anyWanted.has(k) || untranslatedWanted.has(k)) present.add(k);
      // Every tuple found: the rest of the table cannot change the answer.
      return missing > 0;
    });
    return group.filter((t) => (t.untranslatedOnly ? untranslated : present).has(key(t.externalIp, t.port)));
  }

  /** Deletes the entries of one tuple; the number deleted. */
  private async delete(t: StaleTuple): Promise<number> {
    const args = [
      '-D',
      '-f',
      t.family,
      '-p',
      (t.protocol satisfies ConntrackProtocol).toLowerCase(),
      '--orig-dst',
      t.externalIp,
      '--dport',
      String(t.port),
      ...(t.untranslatedOnly ? ['--reply-src', t.externalIp] : []),
    ];
    const stderr = await this.run(args);
    return Number(DELETED.exec(stderr)?.[1] ?? 0);
  }

  /** stderr of a deletion (its count); what it prints of the deleted entries is not read. */
  private async run(args: string[]): Promise<string> {
    const result = await execa(this.command, args, {
      reject: false,
      timeout: this.timeoutMs,
      stdin: 'ignore',
      stdout: 'ignore',
      maxBuffer: MAX_STDERR_BYTES,
    });
    this.throwIfMissing(result);
    // Exit 1 with "0 flow entries" is an empty match, not an error.
    if (result.exitCode === 1 && /\b0 flow entries have been deleted/.test(result.stderr)) return result.stderr;
    if (result.failed) throw this.failure(args, result);
    return result.stderr;
  }

  /**
   * Runs a listing and hands each line of its stdout to `onLine` as it comes, one line in memory
   * at a time; `onLine` returns false when it has read enough, and the command is stopped.
   */
  private async list(args: string[], onLine: (line: string) => boolean): Promise<void> {
    const subprocess = execa(this.command, args, {
      reject: false,
      timeout: this.timeoutMs,
      stdin: 'ignore',
      buffer: { stdout: false },
      maxBuffer: { stderr: MAX_STDERR_BYTES },
    });
    let partial: Buffer[] = [];
    let partialBytes = 0;
    let enough = false;
    let tooLong = false;
    const stop = () => {
      enough = true;
      partial = [];
      subprocess.kill();
    };
    subprocess.stdout.on('data', (chunk: Buffer) => {
      if (enough) return;
      let start = 0;
      for (let nl = chunk.indexOf(10); nl !== -1; nl = chunk.indexOf(10, start)) {
        const tail = chunk.subarray(start, nl);
        const line = partialBytes > 0 ? Buffer.concat([...partial, tail]) : tail;
        partial = [];
        partialBytes = 0;
        start = nl + 1;
        if (line.length > MAX_LISTED_LINE_BYTES) {
          tooLong = true;
          return stop();
        }
        if (!onLine(line.toString('latin1'))) return stop();
      }
      partialBytes += chunk.length - start;
      if (partialBytes > MAX_LISTED_LINE_BYTES) {
        tooLong = true;
        return stop();
      }
      if (start < chunk.length) partial.push(chunk.subarray(start));
    });
    const result = await subprocess;
    this.throwIfMissing(result);
    if (tooLong) {
      throw new Error(
        `${this.command} ${args.join(' ')}: printed a line longer than ${MAX_LISTED_LINE_BYTES >> 10} KiB, not a conntrack listing`,
      );
    }
    if (enough) return;
    if (result.failed) throw this.failure(args, result);
    if (partialBytes > 0) onLine(Buffer.concat(partial).toString('latin1'));
  }

  private throwIfMissing(result: object): void {
    if ((result as { code?: string }).code === 'ENOENT') {
      throw new Error(`the '${this.command}' command was not found: install the conntrack package`);
    }
  }

  private failure(args: string[], result: { timedOut: boolean; stderr: string; exitCode?: number }): Error {
    const why = result.timedOut
      ? `timed out after ${this.timeoutMs} ms`
      : result.stderr.trim().split('\n')[0] || `exit ${result.exitCode}`;
    return new Error(`${this.command} ${args.join(' ')}: ${why}`);
  }
}
