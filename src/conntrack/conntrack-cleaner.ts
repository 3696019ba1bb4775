// Deletes stale conntrack entries with the `conntrack` command (conntrack-tools), after the
// kernel holds the new rules: a flow's next packet then starts a new entry and meets the new
// translation (or none). Failures are reported, never thrown: a stale UDP flow is a smaller harm
// than a sync that does not finish.

import { execa } from 'execa';
import type { Logger } from 'pino';
import type { ConntrackProtocol, StaleTuple } from './stale-tuples.js';

export interface ConntrackCleanupReport {
  /** Tuples asked for. */
  tuples: number;
  /** Conntrack entries deleted. */
  deleted: number;
  /** Deletions (or listings) that failed; their entries may still be there. */
  failures: number;
  durationMs: number;
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
}

/** `conntrack -D` prints "N flow entries have been deleted." on stderr, and exits 1 for N = 0. */
const DELETED = /(\d+) flow entries have been deleted/;

/** In `conntrack -L` lines: the original direction's dst and dport, then the reply direction's src. */
const LISTED = /\bdst=(\S+) .*?\bdport=(\d+)\b.*?\bsrc=(\S+) /;

/** conntrack prints IPv6 addresses in the canonical text form the model uses. */
function key(ip: string, port: number): string {
  return `${ip}|${port}`;
}

export class ConntrackCleaner {
  private readonly command: string;
  private readonly timeoutMs: number;
  private readonly listAbove: number;
  private missingReported = false;

  constructor(private readonly options: ConntrackCleanerOptions) {
    this.command = options.command ?? 'conntrack';
    this.timeoutMs = options.timeoutMs ?? 5000;
    this.listAbove = options.listAbove ?? 16;
  }

  /** Deletes the entries of every tuple. Never throws; failures are logged and counted. */
  async clean(tuples: readonly StaleTuple[]): Promise<ConntrackCleanupReport> {
    const started = performance.now();
    const report: ConntrackCleanupReport = { tuples: tuples.length, deleted: 0, failures: 0, durationMs: 0 };
    const errors: string[] = [];
    const groups = new Map<string, StaleTuple[]>();
    for (const t of tuples) {
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
          // Deleting blindly is still right, only slower.
        }
      }
      for (const t of todo) {
        try {
          report.deleted += await this.delete(t);
        } catch (err) {
          report.failures++;
          errors.push((err as Error).message);
          if (this.missing(err)) break;
        }
      }
    }
    report.durationMs = performance.now() - started;
    if (errors.length > 0 && !(this.missingReported && errors.every((e) => e.includes('was not found')))) {
      if (errors.some((e) => e.includes('was not found'))) this.missingReported = true;
      this.options.logger.warn(
        { failures: report.failures, tuples: report.tuples },
        `could not delete stale conntrack entries (UDP/SCTP flows may keep their old translation until idle): ${errors[0]}`,
      );
    }
    if (report.deleted > 0) {
      this.options.logger.debug(
        { deleted: report.deleted, tuples: report.tuples, ms: Math.round(report.durationMs) },
        'deleted stale conntrack entries',
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
    const output = await this.run(['-L', '-f', first.family, '-p', first.protocol.toLowerCase()], 'list');
    const present = new Set<string>();
    const untranslated = new Set<string>();
    for (const line of output.split('\n')) {
      const m = LISTED.exec(line);
      if (!m) continue;
      const k = key(m[1]!, Number(m[2]));
      present.add(k);
      if (m[3] === m[1]) untranslated.add(k);
    }
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
    const stderr = await this.run(args, 'delete');
    return Number(DELETED.exec(stderr)?.[1] ?? 0);
  }

  /** stdout of a listing, stderr of a deletion. */
  private async run(args: string[], what: 'list' | 'delete'): Promise<string> {
    const result = await execa(this.command, args, { reject: false, timeout: this.timeoutMs, stdin: 'ignore' });
    if ((result as { code?: string }).code === 'ENOENT') {
      throw new Error(`the '${this.command}' command was not found: install the conntrack package`);
    }
    // Exit 1 with "0 flow entries" is an empty match, not an error.
    if (what === 'delete' && result.exitCode === 1 && /\b0 flow entries have been deleted/.test(result.stderr)) {
      return result.stderr;
    }
    if (result.failed) {
      const why = result.timedOut
        ? `timed out after ${this.timeoutMs} ms`
        : result.stderr.trim().split('\n')[0] || `exit ${result.exitCode}`;
      throw new Error(`${this.command} ${args.join(' ')}: ${why}`);
    }
    return what === 'list' ? result.stdout : result.stderr;
  }
}
