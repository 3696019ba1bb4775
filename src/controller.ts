// Wires caches -> model -> backend through the sync runner. Holds no state of its own that
// could disagree with the caches: every sync derives the desired state from them anew.

import type { Logger } from 'pino';
import type { Backend, SyncResult } from './backends/backend.js';
import type { ClusterCaches } from './kube/cluster.js';
import { DesiredStateModel } from './model/desired-state.js';
import type { Conflict, DesiredState, ModelConfig, Skip } from './model/types.js';
import { SyncRunner, type SyncRequestInfo } from './sync/runner.js';

export interface SyncReport {
  backend: string;
  requested: 'full' | 'partial';
  result?: SyncResult;
  durationMs: number;
  /** Time from the oldest change this sync served to its end, when it served one. */
  changeLatencyMs?: number;
  error?: Error;
}

/** Hooks for metrics and events; every method is optional. */
export interface ControllerObserver {
  onDesiredState?(desired: DesiredState): void;
  onSync?(report: SyncReport): void;
  /** Skips whose reason is new or changed since the previous sync. */
  onNewSkips?(skips: Skip[]): void;
  onNewConflicts?(conflicts: Conflict[]): void;
}

export interface ControllerStatus {
  cachesSynced: boolean;
  /** Date.now() of the last successful sync. */
  lastSuccessfulSyncAt?: number;
  lastError?: string;
  /** Why prerouting rules are missing for a family, when they are. */
  localPodMatchProblems: string[];
}

export interface ControllerOptions {
  caches: ClusterCaches;
  backend: Backend;
  model: ModelConfig;
  nodeName: string;
  minSyncPeriodMs: number;
  syncPeriodMs: number;
  logger: Logger;
  observer?: ControllerObserver;
  /** Runs once, after the first successful sync (removing other backends' leftovers, say). */
  afterFirstSync?: () => Promise<void>;
}

export class Controller {
  private readonly runner: SyncRunner;
  /** Derives the desired state from the caches at every sync, redoing only what changed. */
  private readonly model: DesiredStateModel;
  private previousSkips = new Set<string>();
  private previousConflicts = new Set<string>();
  private previousLocalProblems = '';
  private started = false;
  readonly status: ControllerStatus = { cachesSynced: false, localPodMatchProblems: [] };

  constructor(private readonly options: ControllerOptions) {
    this.model = new DesiredStateModel(options.model);
    this.runner = new SyncRunner({
      minIntervalMs: options.minSyncPeriodMs,
      fullIntervalMs: options.syncPeriodMs,
      sync: (info) => this.sync(info),
      partialDuringFull: options.backend.partialSyncsDuringFull === true,
      onError: (err, retryInMs) => {
        this.status.lastError = err.message;
        options.logger.error({ retryInMs }, `sync failed, keeping the rules in place: ${err.message}`);
      },
    });
  }

  /** A cache changed. Before the caches synced, nothing is programmed (previous rules stay). */
  onCacheChange(): void {
    if (this.started) this.runner.request();
  }

  async start(): Promise<void> {
    const { caches, logger } = this.options;
    caches.services.start();
    caches.node.start();
    logger.info('waiting for the Service and Node caches to sync; the kernel is not touched until then');
    await Promise.all([caches.services.waitForSync(), caches.node.waitForSync()]);
    this.status.cachesSynced = true;
    logger.info({ services: caches.services.list().length }, 'caches synced');
    this.started = true;
    this.runner.start();
  }

  /** Stops watching and syncing. The programmed rules stay in place. */
  async stop(): Promise<void> {
    this.started = false;
    await Promise.all([this.options.caches.services.stop(), this.options.caches.node.stop()]);
    await this.runner.stop();
  }

  desiredState(): DesiredState {
    const { caches, nodeName } = this.options;
    const node = caches.node.list().find((n) => n.name === nodeName);
    return this.model.update(caches.services, node);
  }

  private async sync(info: SyncRequestInfo): Promise<void> {
    const { backend, logger, observer } = this.options;
    const desired = this.desiredState();
    this.reportModelChanges(desired);
    observer?.onDesiredState?.(desired);
    const started = performance.now();
    const report: SyncReport = { backend: backend.name, requested: info.full ? 'full' : 'partial', durationMs: 0 };
    try {
      report.result = await backend.sync(desired, { full: info.full });
      const ended = performance.now();
      report.durationMs = ended - started;
      if (info.changedAt !== undefined) report.changeLatencyMs = ended - info.changedAt;
      const first = this.status.lastSuccessfulSyncAt === undefined;
      this.status.lastSuccessfulSyncAt = Date.now();
      this.status.lastError = undefined;
      if (first) await this.options.afterFirstSync?.();
      if (report.result.mode !== 'noop') {
        logger.debug(
          {
            mode: report.result.mode,
            entries: report.result.entries,
            ms: Math.round(report.durationMs),
            fallbackReason: report.result.fallbackReason,
            repairedElements: report.result.repairedElements,
          },
          'synced',
        );
      }
    } catch (err) {
      report.durationMs = performance.now() - started;
      report.error = err instanceof Error ? err : new Error(String(err));
      throw report.error;
    } finally {
      observer?.onSync?.(report);
    }
  }

  /** Logs skips, conflicts and missing local-pod detection once per change, not on every sync. */
  private reportModelChanges(desired: DesiredState): void {
    const { logger, observer } = this.options;
    const skipKey = (s: Skip) => `${s.service}|${s.reason}|${s.detail}`;
    const newSkips = desired.skips.filter((s) => !this.previousSkips.has(skipKey(s)));
    for (const s of newSkips) logger.info({ service: s.service, reason: s.reason }, `skipped: ${s.detail}`);
    this.previousSkips = new Set(desired.skips.map(skipKey));
    if (newSkips.length > 0) observer?.onNewSkips?.(newSkips);

    const conflictKey = (c: Conflict) => `${c.family}|${c.externalIp}|${c.protocol}|${c.port}|${c.winner}|${c.loser}`;
    const newConflicts = desired.conflicts.filter((c) => !this.previousConflicts.has(conflictKey(c)));
    for (const c of newConflicts) {
      logger.warn(
        { service: c.loser, winner: c.winner },
        `conflict: ${c.externalIp} ${c.protocol}/${c.port} is claimed by the older Service ${c.winner}; ${c.loser} is not translated there`,
      );
    }
    this.previousConflicts = new Set(desired.conflicts.map(conflictKey));
    if (newConflicts.length > 0) observer?.onNewConflicts?.(newConflicts);

    const problems = (['ipv4', 'ipv6'] as const).flatMap((f) => {
      // A family without entries needs no pod detection (an IPv4-only cluster has no IPv6 podCIDR).
      const m = desired[f].localPodMatch;
      return m.kind === 'none' && desired[f].entries.length > 0 ? [`${f}: ${m.reason}`] : [];
    });
    this.status.localPodMatchProblems = problems;
    const joined = problems.join('; ');
    if (joined !== this.previousLocalProblems) {
      if (problems.length > 0) {
        logger.warn(
          { problems },
          'traffic from pods is not translated for some families (output rules for host-network traffic still are)',
        );
      } else if (this.previousLocalProblems) logger.info('local pod detection is complete again');
      this.previousLocalProblems = joined;
    }
  }
}
