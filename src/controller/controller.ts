// Wires caches -> model -> reconciler through the sync runner. Every sync derives the desired
// state from the caches (the model keeps only what lets a change cost what it touches) and has
// the reconciler program it, unless the controller steps aside because kube-proxy is not in IPVS
// mode (controller/step-aside.ts). What the kernel holds of ours is the reconciler's to know, and
// its subscribers' to hear of (the composition root, src/cli/, gives it both). Beside the syncs:
// what the model says logged once per change (controller/model-report.ts), and the removal of
// other backends' leftovers (controller/leftover-removal.ts).

import type { Logger } from '../log.js';
import type { ConntrackCleanupReport } from '../conntrack/conntrack-cleaner.js';
import { entryLimit } from '../driver/driver.js';
import type { ClusterCaches } from '../kube/cluster.js';
import type { ModeVerdict } from '../kubeproxy/mode.js';
import { DesiredStateModel } from '../model/desired-state.js';
import { DEFAULT_MAX_ENTRIES_PER_SERVICE, type DesiredState, type ModelConfig } from '../model/types.js';
import type { Reconciler } from '../reconciler/reconciler.js';
import type { SyncResult } from '../reconciler/sync-result.js';
import { SyncRunner, type SyncRequestInfo } from '../sync/runner.js';
import { LeftoverRemoval, type LeftoverStatus } from './leftover-removal.js';
import { ModelReport, type DerivedCounts, type ModelReportObserver, type ServicesOverLimits } from './model-report.js';
import { StepAside, type KubeProxyStatus } from './step-aside.js';

/** No interface addresses, one array: the model follows the node by identity. */
const NO_ADDRESSES: readonly string[] = [];

export type { KubeProxyStatus } from './step-aside.js';

export interface SyncReport {
  backend: string;
  requested: 'full' | 'partial';
  result?: SyncResult;
  durationMs: number;
  /** Of durationMs, deriving the desired state from the caches (the rest is the kernel's part). */
  modelMs?: number;
  /** Time from the oldest change this sync served to its end, when it served one. */
  changeLatencyMs?: number;
  error?: Error;
}

/** Hooks for metrics and events; every method is optional. */
export interface ControllerObserver extends ModelReportObserver {
  onDesiredState?(desired: DesiredState): void;
  onSync?(report: SyncReport): void;
  /** kube-proxy's mode changed, or the controller stepped aside or back. */
  onKubeProxy?(status: KubeProxyStatus): void;
  /** A conntrack clean-up: told by the reconciler's conntrack subscriber (src/cli/compose.ts). */
  onConntrackCleanup?(report: ConntrackCleanupReport): void;
  /** Leftovers of another backend remain after a failed removal (true), or are gone (false). */
  onLeftovers?(pending: boolean): void;
}

export interface ControllerStatus {
  cachesSynced: boolean;
  /** Date.now() of the last successful sync. */
  lastSuccessfulSyncAt?: number;
  /** Date.now() when the last sync ended, successful or not: the loop is alive. */
  lastSyncEndedAt?: number;
  /** Date.now() when the oldest sync under way started, if one is. */
  syncStartedAt?: number;
  /** Services not translated because of a limit, per reason (tooManyEntries, overCapacity). */
  servicesOverLimits?: ServicesOverLimits;
  /** The limits in force: entries per Service, and per family in all. */
  limits?: { maxEntriesPerService: number; maxEntries: number };
  /** The model's settings in force (flags and kube-proxy's configuration merged): what `check` derives with. */
  model?: ModelConfig;
  /** Of the last derivation: Services' addresses skipped per reason, and the entries per family. */
  derived?: DerivedCounts;
  lastError?: string;
  /** Why prerouting rules are missing for a family, when they are. */
  localPodMatchProblems: string[];
  kubeProxy?: KubeProxyStatus;
  /** While leftovers of another backend could not be removed: since when, why, the next attempt. */
  leftovers?: LeftoverStatus;
}

export interface ControllerOptions {
  caches: ClusterCaches;
  /** Programs the kernel; its driver and subscribers are the composition root's choice. */
  reconciler: Reconciler;
  model: ModelConfig;
  nodeName: string;
  minSyncPeriodMs: number;
  syncPeriodMs: number;
  logger: Logger;
  observer?: ControllerObserver;
  /**
   * Removes what other backends left (their tables or chains would translate what this one no
   * longer does): run after the first successful sync, and retried with back-off until it
   * succeeds; meanwhile status.leftovers says why, and the observer's onLeftovers is told.
   */
  removeLeftovers?: () => Promise<void>;
  /** Step aside while kube-proxy is positively in iptables or nftables mode (default true). */
  kubeProxyStepAside?: boolean;
  /** kube-proxy's mode at start; unknown when not given. */
  kubeProxyMode?: ModeVerdict;
  /** Effective kube-proxy-related settings at start, for status. */
  kubeProxySettings?: string[];
  /** --max-entries: entries per family programmed at most; default and ceiling: the backend's capacity. */
  maxEntries?: number;
  /**
   * The addresses of the node's interfaces, asked at every sync (src/node/interface-addresses.ts:
   * the CLI reads them once a second and calls nodeAddressesChanged); none by default.
   */
  interfaceAddresses?: () => readonly string[];
  /**
   * After the first sync: one collection of the whole heap that also shrinks it
   * (cli/v8-settings.ts), and the file pages of the start handed back (cli/file-pages.ts);
   * without it (tests), memory is left to V8 and the kernel.
   */
  compactMemory?: () => Promise<void>;
  /**
   * Between retries of removeLeftovers: the first wait, doubled after each failure up to the
   * second. Default LEFTOVER_RETRY_MS (controller/leftover-removal.ts).
   */
  leftoverRetryMs?: { initial: number; max: number };
}

export class Controller {
  private readonly runner: SyncRunner;
  /** Derives the desired state from the caches at every sync, redoing only what changed. */
  private model: DesiredStateModel;
  private readonly stepAside: StepAside;
  private readonly modelReport: ModelReport;
  private readonly leftovers: LeftoverRemoval;
  private started = false;
  /**
   * Set by stop(), at once: from then on no write begins. A sync that has not written yet ends
   * without writing (its state is dropped), and a start whose caches sync afterwards programs
   * nothing; a write already under way is finished (each commit is atomic).
   */
  private stopping = false;
  /**
   * What /readyz, the logs and the tests see of the controller, read live: the controller's own
   * fields, and those of its parts (the model report, stepping aside, the leftovers' removal).
   */
  readonly status: ControllerStatus;
  /** The syncs under way: a partial sync may run beside a full one. */
  private readonly syncsUnderWay = new Set<{ startedAt: number }>();

  constructor(private readonly options: ControllerOptions) {
    const { reconciler, logger, observer } = options;
    const syncsUnderWay = this.syncsUnderWay;
    const modelReport = (this.modelReport = new ModelReport(logger, observer));
    const leftovers = (this.leftovers = new LeftoverRemoval({
      remove: options.removeLeftovers,
      logger,
      retryMs: options.leftoverRetryMs,
      onPending: (pending) => observer?.onLeftovers?.(pending),
    }));
    const stepAside = (this.stepAside = new StepAside({
      reconciler,
      logger,
      enabled: options.kubeProxyStepAside,
      mode: options.kubeProxyMode,
      settings: options.kubeProxySettings,
      onChange: (status) => observer?.onKubeProxy?.(status),
    }));
    this.status = {
      cachesSynced: false,
      get syncStartedAt() {
        return oldestStart(syncsUnderWay);
      },
      get servicesOverLimits() {
        return modelReport.servicesOverLimits;
      },
      get localPodMatchProblems() {
        return modelReport.localPodMatchProblems;
      },
      get derived() {
        return modelReport.derived;
      },
      get kubeProxy() {
        return stepAside.status;
      },
      get leftovers() {
        return leftovers.status;
      },
    };
    this.model = this.newModel(options.model, 0);
    this.runner = new SyncRunner({
      minIntervalMs: options.minSyncPeriodMs,
      fullIntervalMs: options.syncPeriodMs,
      sync: (info) => this.sync(info),
      partialDuringFull: reconciler.capabilities.translates === 'packets',
      onError: (err, retryInMs) => {
        this.status.lastError = err.message;
        logger.error({ retryInMs, err }, 'Sync failed, keeping the rules in place');
      },
    });
    options.caches.onChange(() => this.onCacheChange());
  }

  /** A cache changed. Before the caches synced, nothing is programmed (previous rules stay). */
  private onCacheChange(): void {
    if (this.started) this.runner.request();
  }

  /** The node's interface addresses changed: a sync asks the model again. */
  nodeAddressesChanged(): void {
    this.onCacheChange();
  }

  /**
   * Starts the caches and, once both hold a whole state (a list or WatchList stream read to its
   * end), the syncs: the first is a full sync of that state, written whole. Nothing is written
   * before it, and nothing at all when stop() is called first.
   */
  async start(): Promise<void> {
    const { caches, logger } = this.options;
    this.stopping = false;
    caches.services.start();
    caches.node.start();
    logger.info('Waiting for the Service and Node caches to sync, the kernel is not touched until then');
    await Promise.all([caches.services.waitForSync(), caches.node.waitForSync()]);
    // Asked to stop meanwhile: the caches are stopped, and nothing is programmed.
    if (this.stopping) return;
    this.status.cachesSynced = true;
    logger.info({ services: caches.services.list().length }, 'Caches synced');
    this.started = true;
    this.options.observer?.onKubeProxy?.(this.stepAside.status);
    this.runner.start();
  }

  /**
   * After the first sync, the garbage of the initial list (pages of full objects, tens of MiB at
   * 10,000 Services) would stay resident until V8 next needs the space: one collection now (the
   * CLI's compactMemory, which also hands back the file pages of the start), then the backend
   * hands back what glibc kept. The collection is V8's
   * last-resort one, which also shrinks the heap V8 grew for the start and returns its free
   * pages: about 18 MiB less resident memory at 10,000 Services and 65 MiB at 50,000 than a plain
   * full collection, with Node.js 24 (docs/operations.md, Resources). Rules are in the kernel
   * already, so nothing waits for it.
   */
  private async compactMemory(): Promise<void> {
    await this.options.compactMemory?.().catch(() => undefined);
    await this.options.reconciler.releaseMemory().catch(() => undefined);
  }

  /** Stops watching and syncing. The programmed rules stay in place. */
  async stop(): Promise<void> {
    this.stopping = true;
    this.started = false;
    this.leftovers.stop();
    await Promise.all([this.options.caches.services.stop(), this.options.caches.node.stop()]);
    await this.runner.stop();
  }

  /**
   * A model with the limits in force: the backend's capacity, lowered by --max-entries. Its
   * generations come after `after`, the last of the model it replaces.
   */
  private newModel(model: ModelConfig, after: number): DesiredStateModel {
    const { capacity, capabilities } = this.options.reconciler;
    const maxEntries = entryLimit(capacity, this.options.maxEntries);
    const config = { ...model, maxEntries, sourceRangesSupported: capabilities.filtersSources };
    this.status.limits = {
      maxEntriesPerService: config.maxEntriesPerService ?? DEFAULT_MAX_ENTRIES_PER_SERVICE,
      maxEntries,
    };
    this.status.model = model;
    return new DesiredStateModel(config, after);
  }

  /** kube-proxy's configuration changed the model settings: everything is derived and programmed anew. */
  setModelConfig(model: ModelConfig, settings: string[]): void {
    this.model = this.newModel(model, this.model.lastGeneration);
    this.stepAside.setSettings(settings);
    if (this.started) this.runner.requestFull();
  }

  /** kube-proxy's mode changed (after the monitor's confirmation): the next sync steps aside or back. */
  onKubeProxyMode(verdict: ModeVerdict): void {
    this.stepAside.setMode(verdict);
    if (this.started) this.runner.requestFull();
  }

  /** What the caches ask for now; a large change is derived in slices, the event loop served between them. */
  desiredState(): Promise<DesiredState> {
    const { caches, nodeName } = this.options;
    const node = caches.node.list().find((n) => n.name === nodeName);
    return this.model.updateCooperatively(
      caches.services.changes,
      node,
      this.options.interfaceAddresses?.() ?? NO_ADDRESSES,
    );
  }

  private async sync(info: SyncRequestInfo): Promise<void> {
    const { reconciler, logger, observer } = this.options;
    const underWay = { startedAt: Date.now() };
    this.syncsUnderWay.add(underWay);
    const started = performance.now();
    let written: number | undefined;
    const onWritten = () => (written = performance.now());
    const report: SyncReport = { backend: reconciler.name, requested: info.full ? 'full' : 'partial', durationMs: 0 };
    /** A stop came while the state was derived: nothing was written, nothing is reported. */
    let dropped = false;
    try {
      const desired = await this.desiredState();
      // A stop asked for while the state was derived: no write begins after it. (Else a
      // controller told to stop during its first sync, or one whose launcher was killed, would
      // write its state after the stop, perhaps after its successor's first write.)
      if (this.stopping) {
        dropped = true;
        return;
      }
      report.modelMs = performance.now() - started;
      this.modelReport.report(desired);
      observer?.onDesiredState?.(desired);
      const plan = this.stepAside.plan();
      if (plan.aside !== undefined) {
        report.result = await this.stepAside.stepAside(plan.aside, desired);
        onWritten();
      } else {
        report.result = await reconciler.sync(desired, { full: info.full || plan.full, onWritten });
        this.stepAside.translated(report.result);
      }
      const ended = written ?? performance.now();
      report.durationMs = ended - started;
      if (info.changedAt !== undefined) report.changeLatencyMs = ended - info.changedAt;
      const first = this.status.lastSuccessfulSyncAt === undefined;
      this.status.lastSuccessfulSyncAt = Date.now();
      this.status.lastError = undefined;
      if (first && !this.stopping) {
        await this.leftovers.attempt();
        await this.compactMemory();
      }
      if (report.result.unverified) {
        logger.warn(
          { families: report.result.unverified },
          'Could not read our rules back to verify them: another process committed to the ruleset throughout the read; nothing was repaired, the next full sync verifies again',
        );
      }
      if (report.result.mode !== 'noop') {
        logger.debug(
          {
            mode: report.result.mode,
            entries: report.result.entries,
            ms: Math.round(report.durationMs),
            modelMs: Math.round(report.modelMs ?? 0),
            fallbackReason: report.result.fallbackReason,
            repairedElements: report.result.repairedElements,
            rejected: report.result.rejected?.length,
          },
          'Synced',
        );
      }
    } catch (err) {
      report.durationMs = performance.now() - started;
      report.error = err instanceof Error ? err : new Error(String(err));
      throw report.error;
    } finally {
      this.syncsUnderWay.delete(underWay);
      this.status.lastSyncEndedAt = Date.now();
      if (!dropped) observer?.onSync?.(report);
    }
  }
}

/** When the oldest of the syncs under way started, if one is. */
function oldestStart(syncs: ReadonlySet<{ startedAt: number }>): number | undefined {
  let oldest: number | undefined;
  for (const s of syncs) oldest = Math.min(oldest ?? s.startedAt, s.startedAt);
  return oldest;
}
