// Wires caches -> model -> reconciler through the sync runner. Every sync derives the desired
// state from the caches (the model keeps only what lets a change cost what it touches). What the
// kernel holds of ours is the reconciler's to know: the translation, or nothing while the
// controller steps aside because kube-proxy is not in IPVS mode (design/semantics.md,
// "kube-proxy's mode"); it tells conntrack clean-up what changed.

import { kobj, type Logger } from './log.js';
import { entryLimit, type KernelChange, type SyncResult } from './reconciler/driver.js';
import type { Reconciler } from './reconciler/reconciler.js';
import type { ClusterCaches } from './kube/cluster.js';
import { ConntrackCleaner, type ConntrackCleanupReport } from './conntrack/conntrack-cleaner.js';
import { staleTuples } from './conntrack/stale-tuples.js';
import { DesiredStateModel } from './model/desired-state.js';
import {
  DEFAULT_MAX_ENTRIES_PER_SERVICE,
  type Conflict,
  type DesiredState,
  type ModelConfig,
  type Skip,
} from './model/types.js';
import { isNonIpvsMode, type ModeVerdict } from './kubeproxy/mode.js';
import { SyncRunner, type SyncRequestInfo } from './sync/runner.js';

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
export interface ControllerObserver {
  onDesiredState?(desired: DesiredState): void;
  onSync?(report: SyncReport): void;
  /** Skips whose reason is new or changed since the previous sync. */
  onNewSkips?(skips: Skip[]): void;
  onNewConflicts?(conflicts: Conflict[]): void;
  /** kube-proxy's mode changed, or the controller stepped aside or back. */
  onKubeProxy?(status: KubeProxyStatus): void;
  onConntrackCleanup?(report: ConntrackCleanupReport): void;
  /** Leftovers of another backend remain after a failed removal (true), or are gone (false). */
  onLeftovers?(pending: boolean): void;
}

/** What the controller knows of kube-proxy, for /readyz, metrics and Events. */
export interface KubeProxyStatus {
  mode: ModeVerdict;
  /** True while our rules are removed because kube-proxy is not in IPVS mode. */
  steppedAside: boolean;
  /** Why the controller stepped aside (or, with stepping aside off, why it should have). */
  reason?: string;
  /** Effective kube-proxy-related settings, `name=value (source)`. */
  settings: string[];
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
  servicesOverLimits?: Partial<Record<'tooManyEntries' | 'overCapacity', number>>;
  /** The limits in force: entries per Service, and per family in all. */
  limits?: { maxEntriesPerService: number; maxEntries: number };
  lastError?: string;
  /** Why prerouting rules are missing for a family, when they are. */
  localPodMatchProblems: string[];
  kubeProxy?: KubeProxyStatus;
  /** While leftovers of another backend could not be removed: since when, why, the next attempt. */
  leftovers?: LeftoverStatus;
}

export interface LeftoverStatus {
  /** Date.now() of the first failed attempt. */
  failingSince: number;
  attempts: number;
  error: string;
  /** Date.now() of the next attempt. */
  retryAt: number;
}

export interface ControllerOptions {
  caches: ClusterCaches;
  backend: Reconciler;
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
   * The addresses of the node's interfaces, read at every sync (src/node/interface-addresses.ts);
   * none by default.
   */
  interfaceAddresses?: () => readonly string[];
  /**
   * Deletes conntrack entries made stale by a change of the programmed translations. Default: the
   * conntrack command where the backend's translations are conntrack's (not eBPF's: it translates
   * sockets); null: never.
   */
  conntrack?: ConntrackClient | null;
  /**
   * Between retries of removeLeftovers: the first wait, doubled after each failure up to the
   * second. Default LEFTOVER_RETRY_MS.
   */
  leftoverRetryMs?: { initial: number; max: number };
}

/** What the controller asks of the conntrack client: stale tuples, and (optionally) the flows a bypass pinned. */
type ConntrackClient = Pick<ConntrackCleaner, 'clean'> & Partial<Pick<ConntrackCleaner, 'forgetUntranslated'>>;

/** Retries of removeLeftovers: 5 s, then doubled up to 5 minutes. */
export const LEFTOVER_RETRY_MS = { initial: 5_000, max: 300_000 };

export class Controller {
  private readonly runner: SyncRunner;
  /** Derives the desired state from the caches at every sync, redoing only what changed. */
  private model: DesiredStateModel;
  private kubeProxyMode: ModeVerdict;
  /** True once backend.cleanup() removed our objects for kube-proxy's sake, until a sync programs again. */
  private steppedAside = false;
  private previousSkips = new Set<string>();
  private previousConflicts = new Set<string>();
  private previousLocalProblems = '';
  private started = false;
  private stopped = false;
  private leftoverTimer: NodeJS.Timeout | undefined;
  readonly status: ControllerStatus = { cachesSynced: false, localPodMatchProblems: [] };
  /** The syncs under way: a partial sync may run beside a full one. */
  private readonly syncsUnderWay = new Set<{ startedAt: number }>();

  constructor(private readonly options: ControllerOptions) {
    this.model = this.newModel(options.model, 0);
    this.kubeProxyMode = options.kubeProxyMode ?? { mode: 'unknown', source: 'none', detail: 'not looked at' };
    this.status.kubeProxy = {
      mode: this.kubeProxyMode,
      steppedAside: false,
      settings: options.kubeProxySettings ?? [],
    };
    const conntrack =
      options.conntrack === undefined
        ? options.backend.capabilities.conntrackMatters
          ? new ConntrackCleaner({ logger: options.logger })
          : undefined
        : (options.conntrack ?? undefined);
    if (conntrack) {
      const forget = conntrack.forgetUntranslated?.bind(conntrack);
      options.backend.subscribe({
        kernelChanged: (change) => this.cleanConntrack(conntrack, change),
        // Outside every write and sync: a change never waits for this clean-up.
        ...(forget && {
          translationsBypassed: ({ family, entries }) =>
            void forget(family, entries, (report) => this.options.observer?.onConntrackCleanup?.(report)),
        }),
      });
    }
    this.runner = new SyncRunner({
      minIntervalMs: options.minSyncPeriodMs,
      fullIntervalMs: options.syncPeriodMs,
      sync: (info) => this.sync(info),
      partialDuringFull: options.backend.capabilities.ordersOwnWrites,
      onError: (err, retryInMs) => {
        this.status.lastError = err.message;
        options.logger.error({ retryInMs, err }, 'Sync failed, keeping the rules in place');
      },
    });
    options.caches.onChange(() => this.onCacheChange());
  }

  /** A cache changed. Before the caches synced, nothing is programmed (previous rules stay). */
  private onCacheChange(): void {
    if (this.started) this.runner.request();
  }

  async start(): Promise<void> {
    const { caches, logger } = this.options;
    caches.services.start();
    caches.node.start();
    logger.info('Waiting for the Service and Node caches to sync, the kernel is not touched until then');
    await Promise.all([caches.services.waitForSync(), caches.node.waitForSync()]);
    this.status.cachesSynced = true;
    logger.info({ services: caches.services.list().length }, 'Caches synced');
    this.started = true;
    this.options.observer?.onKubeProxy?.(this.status.kubeProxy!);
    this.runner.start();
  }

  /**
   * After the first sync, the garbage of the initial list (pages of full objects, tens of MiB at
   * 10,000 Services) would stay resident until V8 next needs the space: one collection now (the
   * image runs Node with --expose-gc), then the backend hands back what glibc kept. The collection
   * is V8's last-resort one, which also shrinks the heap V8 grew for the start and returns its
   * free pages: about 18 MiB less resident memory at 10,000 Services and 65 MiB at 50,000 than a
   * plain full collection, with Node.js 24 (docs/operations.md, Resources). Rules are in the
   * kernel already, so nothing waits for it.
   */
  private async compactMemory(): Promise<void> {
    const gc = (globalThis as { gc?: (options?: { type: string; execution: string; flavor: string }) => void }).gc;
    gc?.({ type: 'major', execution: 'sync', flavor: 'last-resort' });
    await this.options.backend.releaseMemory?.().catch(() => undefined);
  }

  /**
   * One attempt at removing other backends' leftovers; after a failure the next is scheduled
   * with back-off, and status.leftovers says so until one succeeds. Never throws.
   */
  private async removeLeftovers(): Promise<void> {
    const remove = this.options.removeLeftovers;
    if (!remove || this.stopped) return;
    this.leftoverTimer = undefined;
    try {
      await remove();
      if (this.status.leftovers) {
        this.options.logger.info(
          { attempts: this.status.leftovers.attempts + 1 },
          'Removed leftovers of other backends',
        );
        this.status.leftovers = undefined;
        this.options.observer?.onLeftovers?.(false);
      }
    } catch (err) {
      const retry = this.options.leftoverRetryMs ?? LEFTOVER_RETRY_MS;
      const attempts = (this.status.leftovers?.attempts ?? 0) + 1;
      const retryInMs = Math.min(retry.max, retry.initial * 2 ** (attempts - 1));
      const now = Date.now();
      this.status.leftovers = {
        failingSince: this.status.leftovers?.failingSince ?? now,
        attempts,
        error: (err as Error).message,
        retryAt: now + retryInMs,
      };
      this.options.logger.warn({ attempts, retryInMs, err }, 'Failed to remove leftovers of other backends');
      this.options.observer?.onLeftovers?.(true);
      if (this.stopped) return;
      this.leftoverTimer = setTimeout(() => void this.removeLeftovers(), retryInMs);
      // The controller's own work keeps the process alive, not this.
      this.leftoverTimer.unref();
    }
  }

  /** Stops watching and syncing. The programmed rules stay in place. */
  async stop(): Promise<void> {
    this.started = false;
    this.stopped = true;
    if (this.leftoverTimer) clearTimeout(this.leftoverTimer);
    this.leftoverTimer = undefined;
    await Promise.all([this.options.caches.services.stop(), this.options.caches.node.stop()]);
    await this.runner.stop();
  }

  /**
   * A model with the limits in force: the backend's capacity, lowered by --max-entries. Its
   * generations come after `after`, the last of the model it replaces.
   */
  private newModel(model: ModelConfig, after: number): DesiredStateModel {
    const maxEntries = entryLimit(this.options.backend.capacity, this.options.maxEntries);
    const config = { ...model, maxEntries, sourceRangesSupported: this.options.backend.filtersSources };
    this.status.limits = {
      maxEntriesPerService: config.maxEntriesPerService ?? DEFAULT_MAX_ENTRIES_PER_SERVICE,
      maxEntries,
    };
    return new DesiredStateModel(config, after);
  }

  /** kube-proxy's configuration changed the model settings: everything is derived and programmed anew. */
  setModelConfig(model: ModelConfig, settings: string[]): void {
    this.model = this.newModel(model, this.model.lastGeneration);
    this.status.kubeProxy = { ...this.status.kubeProxy!, settings };
    if (this.started) this.runner.requestFull();
  }

  /** kube-proxy's mode changed (after the monitor's confirmation): the next sync steps aside or back. */
  onKubeProxyMode(verdict: ModeVerdict): void {
    this.kubeProxyMode = verdict;
    this.status.kubeProxy = { ...this.status.kubeProxy!, mode: verdict };
    this.options.observer?.onKubeProxy?.(this.status.kubeProxy);
    if (this.started) this.runner.requestFull();
  }

  /**
   * Why our translation must not be in the kernel now, if it must not. kube-proxy positively in
   * iptables or nftables mode: our DNAT would preempt its own. Once stepped aside, only a positive
   * IPVS brings the translation back: kube-proxy restarting (unknown) leaves its rules in place.
   */
  private stepAsideReason(): string | undefined {
    const { mode } = this.kubeProxyMode;
    if (isNonIpvsMode(mode) || (this.steppedAside && mode === 'unknown')) {
      return `kube-proxy is in ${mode === 'unknown' ? 'no known' : mode} mode (${this.kubeProxyMode.detail}): our DNAT would preempt kube-proxy's own`;
    }
    return undefined;
  }

  /** What the caches ask for now; a large change is derived in slices, the event loop served between them. */
  desiredState(): Promise<DesiredState> {
    const { caches, nodeName } = this.options;
    const node = caches.node.list().find((n) => n.name === nodeName);
    return this.model.updateCooperatively(caches.services, node, this.options.interfaceAddresses?.() ?? []);
  }

  private async sync(info: SyncRequestInfo): Promise<void> {
    const { backend, logger, observer } = this.options;
    const underWay = { startedAt: Date.now() };
    this.syncsUnderWay.add(underWay);
    this.status.syncStartedAt = this.oldestSyncStart();
    const started = performance.now();
    let written: number | undefined;
    const onWritten = () => (written = performance.now());
    const report: SyncReport = { backend: backend.name, requested: info.full ? 'full' : 'partial', durationMs: 0 };
    try {
      const desired = await this.desiredState();
      report.modelMs = performance.now() - started;
      this.reportModelChanges(desired);
      observer?.onDesiredState?.(desired);
      const reason = this.stepAsideReason();
      if (reason && this.options.kubeProxyStepAside !== false) {
        report.result = await this.stepAside(reason, desired);
        onWritten();
      } else {
        if (reason && !this.status.kubeProxy!.reason) {
          logger.warn(
            { kubeProxyMode: this.kubeProxyMode.mode, reason, kubeProxyStepAside: false },
            'Translating although kube-proxy is not in IPVS mode',
          );
        }
        this.status.kubeProxy!.reason = reason;
        // Back from stepping aside: the kernel holds nothing of ours, program everything.
        const full = info.full || this.steppedAside;
        report.result = await backend.sync(desired, { full, onWritten });
        // Stepped aside since this sync began: its writes were void, the controller stays aside.
        if (this.steppedAside && !report.result.superseded) {
          this.steppedAside = false;
          this.status.kubeProxy = { ...this.status.kubeProxy!, steppedAside: false, reason: undefined };
          logger.info({ kubeProxyMode: this.kubeProxyMode.mode }, 'Translating again, kube-proxy is in IPVS mode');
          observer?.onKubeProxy?.(this.status.kubeProxy);
        }
      }
      const ended = written ?? performance.now();
      report.durationMs = ended - started;
      if (info.changedAt !== undefined) report.changeLatencyMs = ended - info.changedAt;
      const first = this.status.lastSuccessfulSyncAt === undefined;
      this.status.lastSuccessfulSyncAt = Date.now();
      this.status.lastError = undefined;
      if (first) {
        await this.removeLeftovers();
        await this.compactMemory();
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
      this.status.syncStartedAt = this.oldestSyncStart();
      this.status.lastSyncEndedAt = Date.now();
      observer?.onSync?.(report);
    }
  }

  private oldestSyncStart(): number | undefined {
    let oldest: number | undefined;
    for (const s of this.syncsUnderWay) oldest = Math.min(oldest ?? s.startedAt, s.startedAt);
    return oldest;
  }

  /**
   * Stepping aside: removes every object of ours (once, when kube-proxy turns non-IPVS), then
   * programs nothing until kube-proxy is in IPVS mode again. The controller stays ready and says why.
   */
  private async stepAside(reason: string, desired: DesiredState): Promise<SyncResult> {
    if (!this.steppedAside) {
      // The kernel then holds none of our translations: flows they made go too (conntrack).
      await this.options.backend.cleanup(desired);
      this.steppedAside = true;
      this.status.kubeProxy = { ...this.status.kubeProxy!, steppedAside: true, reason };
      this.options.logger.warn(
        { kubeProxyMode: this.kubeProxyMode.mode, reason },
        'Stepped aside, our rules are removed and nothing is programmed',
      );
      this.options.observer?.onKubeProxy?.(this.status.kubeProxy);
    }
    return { mode: 'noop', entries: { ipv4: 0, ipv6: 0 }, rejected: [] };
  }

  /** Deletes the conntrack entries that would keep translations the kernel no longer has. Never throws. */
  private async cleanConntrack(conntrack: ConntrackClient, change: KernelChange): Promise<void> {
    const tuples = staleTuples(change.previous, change.next);
    if (tuples.length === 0) return;
    const report = await conntrack.clean(tuples);
    this.options.observer?.onConntrackCleanup?.(report);
  }

  /** Logs skips, conflicts and missing local-pod detection once per change, not on every sync. */
  private reportModelChanges(desired: DesiredState): void {
    const { logger, observer } = this.options;
    const skipKey = (s: Skip) => `${s.service}|${s.reason}|${s.detail}`;
    const newSkips = desired.skips.filter((s) => !this.previousSkips.has(skipKey(s)));
    for (const s of newSkips) {
      const fields = { service: kobj(s.service), reason: s.reason, detail: s.detail, count: s.count };
      logger.info(fields, 'Service address skipped');
    }
    this.previousSkips = new Set(desired.skips.map(skipKey));
    if (newSkips.length > 0) observer?.onNewSkips?.(newSkips);

    const conflictKey = (c: Conflict) => `${c.family}|${c.externalIp}|${c.protocol}|${c.port}|${c.winner}|${c.loser}`;
    const newConflicts = desired.conflicts.filter((c) => !this.previousConflicts.has(conflictKey(c)));
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
      logger.warn(
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
    this.previousConflicts = new Set(desired.conflicts.map(conflictKey));
    if (newConflicts.length > 0) observer?.onNewConflicts?.(newConflicts);

    const overLimits: NonNullable<ControllerStatus['servicesOverLimits']> = {};
    for (const s of desired.skips) {
      if (s.reason === 'tooManyEntries' || s.reason === 'overCapacity')
        overLimits[s.reason] = (overLimits[s.reason] ?? 0) + 1;
    }
    this.status.servicesOverLimits = overLimits;

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
          'Traffic from pods not translated for some families, traffic from host-network processes still is',
        );
      } else if (this.previousLocalProblems) logger.info('Local pod detection complete again');
      this.previousLocalProblems = joined;
    }
  }
}
