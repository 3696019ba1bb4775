// What the desired state says that a person must hear of, said once per change rather than on
// every sync: Services skipped (and why), Services that lost an address to an older one, and
// families whose traffic from pods cannot be told apart; and the counts /readyz shows of them.

import { kobj, type Logger } from '../log.js';
import { entryCount, type Conflict, type DesiredState, type Skip } from '../model/types.js';

/** Services not translated because of a limit, per reason. */
export type ServicesOverLimits = Partial<Record<'tooManyEntries' | 'overCapacity', number>>;

/** Of one derivation: skips per reason (each counted with what it stands for), entries per family. */
export interface DerivedCounts {
  skips: Partial<Record<string, number>>;
  entries: { ipv4: number; ipv6: number };
}

/** Who hears of new skips and conflicts (metrics, Events). */
export interface ModelReportObserver {
  /** Skips whose reason is new or changed since the previous sync. */
  onNewSkips?(skips: Skip[]): void;
  onNewConflicts?(conflicts: Conflict[]): void;
}

const skipKey = (s: Skip) => `${s.service}|${s.reason}|${s.detail}`;
const conflictKey = (c: Conflict) => `${c.family}|${c.externalIp}|${c.protocol}|${c.port}|${c.winner}|${c.loser}`;

export class ModelReport {
  /** Services not translated because of a limit, per reason (tooManyEntries, overCapacity); undefined before the first report. */
  servicesOverLimits: ServicesOverLimits | undefined;
  /** Why prerouting rules are missing for a family, when they are. */
  localPodMatchProblems: string[] = [];
  /** The counts of the last report; undefined before the first. */
  derived: DerivedCounts | undefined;
  private previousSkips = new Set<string>();
  private previousConflicts = new Set<string>();
  private previousLocalProblems = '';
  /** The lists of the last report, by identity. */
  private lastSkips: readonly Skip[] | undefined;
  private lastConflicts: readonly Conflict[] | undefined;
  private skipCounts: DerivedCounts['skips'] = {};

  constructor(
    private readonly logger: Logger,
    private readonly observer: ModelReportObserver | undefined,
  ) {}

  /** Logs skips, conflicts and missing local-pod detection once per change, not on every sync. */
  report(desired: DesiredState): void {
    // The model hands the same lists while they do not change: a change of one Service's
    // translation costs no walk of every skip and conflict.
    if (desired.skips !== this.lastSkips) {
      this.lastSkips = desired.skips;
      this.reportSkips(desired.skips);
      const overLimits: ServicesOverLimits = {};
      const skips: DerivedCounts['skips'] = {};
      for (const s of desired.skips) {
        if (s.reason === 'tooManyEntries' || s.reason === 'overCapacity')
          overLimits[s.reason] = (overLimits[s.reason] ?? 0) + 1;
        skips[s.reason] = (skips[s.reason] ?? 0) + (s.count ?? 1);
      }
      this.servicesOverLimits = overLimits;
      this.skipCounts = skips;
    }
    if (desired.conflicts !== this.lastConflicts) {
      this.lastConflicts = desired.conflicts;
      this.reportConflicts(desired.conflicts);
    }
    this.derived = {
      skips: this.skipCounts,
      entries: { ipv4: entryCount(desired.ipv4), ipv6: entryCount(desired.ipv6) },
    };
    this.reportLocalPodMatch(desired);
  }

  private reportSkips(skips: readonly Skip[]): void {
    const newSkips = skips.filter((s) => !this.previousSkips.has(skipKey(s)));
    for (const s of newSkips) {
      const fields = { service: kobj(s.service), reason: s.reason, detail: s.detail, count: s.count };
      this.logger.info(fields, 'Service address skipped');
    }
    this.previousSkips = new Set(skips.map(skipKey));
    if (newSkips.length > 0) this.observer?.onNewSkips?.(newSkips);
  }

  private reportConflicts(conflicts: readonly Conflict[]): void {
    const newConflicts = conflicts.filter((c) => !this.previousConflicts.has(conflictKey(c)));
    // One line per losing Service and winner: two Services that collide on 10,000 keys are one story.
    const byPair = new Map<string, Conflict[]>();
    for (const c of newConflicts) {
      const pair = `${c.loser}|${c.winner}`;
      const list = byPair.get(pair);
      if (list) list.push(c);
      else byPair.set(pair, [c]);
    }
    for (const [, [c, ...more]] of byPair) {
      // The first entry of the pair stands for all of them; `entries` says how many.
      const { externalIp, protocol, port, family } = c!;
      this.logger.warn(
        {
          service: kobj(c!.loser),
          winner: kobj(c!.winner),
          externalIp,
          protocol,
          port,
          family,
          entries: more.length + 1,
        },
        'Service conflict, the older Service keeps the address',
      );
    }
    this.previousConflicts = new Set(conflicts.map(conflictKey));
    if (newConflicts.length > 0) this.observer?.onNewConflicts?.(newConflicts);
  }

  private reportLocalPodMatch(desired: DesiredState): void {
    const problems = (['ipv4', 'ipv6'] as const).flatMap((f) => {
      // A family without entries needs no pod detection (an IPv4-only cluster has no IPv6 podCIDR).
      const m = desired[f].localPodMatch;
      return m.kind === 'none' && entryCount(desired[f]) > 0 ? [`${f}: ${m.reason}`] : [];
    });
    this.localPodMatchProblems = problems;
    const joined = problems.join('; ');
    if (joined === this.previousLocalProblems) return;
    if (problems.length > 0) {
      this.logger.warn(
        { problems },
        'Traffic from pods not translated for some families, traffic from host-network processes still is',
      );
    } else if (this.previousLocalProblems) this.logger.info('Local pod detection complete again');
    this.previousLocalProblems = joined;
  }
}
