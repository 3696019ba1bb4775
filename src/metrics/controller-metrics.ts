// Prometheus metrics of the controller, fed through the controller's and the informers'
// observer hooks. One registry per instance (no global default registry), so that tests and
// several controllers in one process never share counters.

import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { ControllerObserver, KubeProxyStatus, SyncReport } from '../controller/controller.js';
import { KNOWN_ISSUE_IDS, knownIssues } from '../kubeproxy/known-issues.js';
import { PROXY_MODES } from '../kubeproxy/mode.js';
import type { ConntrackCleanupReport } from '../conntrack/conntrack-cleaner.js';
import type { TranslatedConnections } from '../driver/driver.js';
import { conntrackMetrics } from './conntrack-metrics.js';
import { registerTranslationCounter } from './translation-counter.js';
import type { InformerObserver } from '../kube/informer.js';
import { buildInfo } from '../build-info/version.js';
import { FAMILIES, SKIP_REASONS, entryCount, type Conflict, type DesiredState, type Skip } from '../model/types.js';

export const METRIC_PREFIX = 'ipvs_node_controller_';

/** What the info metric says about the kernel path in use. */
export interface BackendDescription {
  backend: string;
  /** nft backend only: `addon` (in-process libnftables) or `cli` (the nft command). */
  nftExecutor?: string;
  /** nft backend only: `map` or `set`, how its rules look keys up on this kernel. */
  nftKeyLookup?: string;
  /** iptables backend only: `legacy` or `nft`, the variant kube-proxy uses. */
  iptablesVariant?: string;
}

export class ControllerMetrics implements ControllerObserver, InformerObserver {
  readonly registry = new Registry();

  private lastDesired: unknown[] | undefined; // what onDesiredState set its gauges from, by identity
  private readonly syncDuration: Histogram<'backend' | 'mode'>;
  private readonly programmingLatency: Histogram<'backend'>;
  private readonly syncErrors: Counter<'backend'>;
  private readonly syncs: Counter<'backend' | 'mode' | 'fallback_reason'>;
  private readonly lastSuccessfulSync: Gauge;
  private readonly verificationsUnread: Counter<'family'>;
  private readonly programmedEntries: Gauge<'backend' | 'family'>;
  private readonly skippedAddresses: Gauge<'reason'>;
  private readonly skipEvents: Counter<'reason'>;
  private readonly conflicts: Gauge<'family'>;
  private readonly conflictEvents: Counter;
  private readonly localPodDetectionMissing: Gauge<'family'>;
  private readonly informerLists: Counter<'resource'>;
  private readonly informerWatches: Counter<'resource'>;
  private readonly informerErrors: Counter<'resource'>;
  private readonly watchDecodeErrors: Counter<'resource'>;
  private readonly backendInfo: Gauge<'backend' | 'nft_executor' | 'nft_key_lookup' | 'iptables_variant'>;
  private readonly kubeProxyMode: Gauge<'mode'>;
  private readonly kubeProxyInfo: Gauge<'mode' | 'version'>;
  private readonly kubeProxyKnownIssue: Gauge<'issue'>;
  private readonly steppedAside: Gauge;

  constructor(options: { defaultMetrics?: boolean } = {}) {
    const registers = [this.registry];
    const name = (n: string) => METRIC_PREFIX + n;
    if (options.defaultMetrics !== false) {
      collectDefaultMetrics({ register: this.registry });
      // Gauges named like counters (promtool rejects them); nodejs_active_{handles,requests,resources}
      // by type carry the same numbers.
      for (const kind of ['handles', 'requests', 'resources'])
        this.registry.removeSingleMetric(`nodejs_active_${kind}_total`);
    }

    this.syncDuration = new Histogram({
      name: name('sync_duration_seconds'),
      help:
        'Duration of syncs of the desired state to the kernel, by backend and by what the sync did ' +
        '(full: whole tables rebuilt; partial: changed entries only; noop: nothing to change).',
      labelNames: ['backend', 'mode'],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers,
    });
    this.programmingLatency = new Histogram({
      name: name('network_programming_duration_seconds'),
      help:
        'Time from a Service or Node change seen by the controller to the end of the sync that ' +
        'programmed it (coalescing delay of --min-sync-period included).',
      labelNames: ['backend'],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60],
      registers,
    });
    this.syncErrors = new Counter({
      name: name('sync_errors_total'),
      help: 'Syncs that failed; the rules programmed before stay in place and the sync is retried.',
      labelNames: ['backend'],
      registers,
    });
    this.syncs = new Counter({
      name: name('syncs_total'),
      help:
        'Successful syncs by backend and by what the sync did; fallback_reason says why a partial sync ' +
        'became a full one (none when it did not).',
      labelNames: ['backend', 'mode', 'fallback_reason'],
      registers,
    });
    this.verificationsUnread = new Counter({
      name: name('verifications_unread_total'),
      help:
        'Full syncs that could not verify a family: another process committed to the ruleset throughout ' +
        'the read back, even between our writes; the next full sync verifies again.',
      labelNames: ['family'],
      registers,
    });
    this.lastSuccessfulSync = new Gauge({
      name: name('last_successful_sync_timestamp_seconds'),
      help: 'Unix time of the end of the last successful sync.',
      registers,
    });
    this.programmedEntries = new Gauge({
      name: name('programmed_entries'),
      help: 'Translations (external IP, protocol, port -> ClusterIP) in the kernel after the last successful sync.',
      labelNames: ['backend', 'family'],
      registers,
    });
    this.skippedAddresses = new Gauge({
      name: name('skipped_addresses'),
      help:
        'External addresses (or their ports) of Services that are not translated, in the current desired state, by reason; ' +
        'for tooManyEntries and overCapacity, Services (each skipped whole).',
      labelNames: ['reason'],
      registers,
    });
    this.skipEvents = new Counter({
      name: name('skip_events_total'),
      help: 'Skips that appeared or changed since the previous sync (each one is logged once), by reason.',
      labelNames: ['reason'],
      registers,
    });
    this.conflicts = new Gauge({
      name: name('conflicts'),
      help:
        'Claims on an (external IP, protocol, port) lost to an older Service, in the current desired state. ' +
        'The loser is not translated there.',
      labelNames: ['family'],
      registers,
    });
    this.conflictEvents = new Counter({
      name: name('conflict_events_total'),
      help: 'Conflicts that appeared since the previous sync (each one is logged once).',
      registers,
    });
    this.localPodDetectionMissing = new Gauge({
      name: name('local_pod_detection_missing'),
      help:
        '1 when traffic from pods is not translated for this family because the --detect-local-mode has no value ' +
        '(e.g. the Node has no podCIDR of the family); host-network traffic still is.',
      labelNames: ['family'],
      registers,
    });
    this.informerLists = new Counter({
      name: name('informer_lists_total'),
      help: 'Full lists of a resource from the API server (the first one and every relist).',
      labelNames: ['resource'],
      registers,
    });
    this.informerWatches = new Counter({
      name: name('informer_watches_total'),
      help: 'Watches of a resource established with the API server (the first one and every restart).',
      labelNames: ['resource'],
      registers,
    });
    this.informerErrors = new Counter({
      name: name('informer_errors_total'),
      help: 'Failed lists or watches of a resource; the cache keeps its content and retries with backoff.',
      labelNames: ['resource'],
      registers,
    });
    this.watchDecodeErrors = new Counter({
      name: name('watch_decode_errors_total'),
      help: 'Watch stream lines that were not watch events and were skipped (the watch goes on, or is replaced).',
      labelNames: ['resource'],
      registers,
    });
    this.backendInfo = new Gauge({
      name: name('backend_info'),
      help:
        'Always 1: the kernel backend in use; for nft, whether in-process libnftables (addon) or the nft command (cli) ' +
        'programs it, and whether its rules look keys up in the map or in a set of its keys (as the kernel allows); ' +
        'for iptables, the variant (legacy or nft).',
      labelNames: ['backend', 'nft_executor', 'nft_key_lookup', 'iptables_variant'],
      registers,
    });

    this.kubeProxyMode = new Gauge({
      name: name('kube_proxy_mode'),
      help:
        "1 for kube-proxy's mode on this node as the controller sees it (/proxyMode, kube-ipvs0, kube-proxy's " +
        'configuration), 0 for the others; unknown when no signal answers.',
      labelNames: ['mode'],
      registers,
    });
    this.steppedAside = new Gauge({
      name: name('stepped_aside'),
      help: '1 while our rules are removed because kube-proxy is in iptables or nftables mode; nothing is programmed then.',
      registers,
    });
    this.kubeProxyInfo = new Gauge({
      name: name('kube_proxy_info'),
      help:
        "Always 1: kube-proxy's mode and version on this node as the controller sees them (the version is the " +
        "git_version of kubernetes_build_info on kube-proxy's metrics address; unknown when it was not read).",
      labelNames: ['mode', 'version'],
      registers,
    });
    this.kubeProxyKnownIssue = new Gauge({
      name: name('kube_proxy_known_issue'),
      help:
        "1 while kube-proxy on this node runs a mode and version with this known bug of kube-proxy's own, which " +
        'breaks traffic the controller cannot fix (kubernetes#131765: in nftables mode before v1.33.6 and v1.34.0, ' +
        "pods' traffic to externalTrafficPolicy: Local external and LoadBalancer IPs is dropped); 0 otherwise, and " +
        'while the version is unknown.',
      labelNames: ['issue'],
      registers,
    });
    for (const mode of PROXY_MODES) this.kubeProxyMode.set({ mode }, mode === 'unknown' ? 1 : 0);
    this.kubeProxyInfo.set({ mode: 'unknown', version: 'unknown' }, 1);
    for (const issue of KNOWN_ISSUE_IDS) this.kubeProxyKnownIssue.set({ issue }, 0);
    this.steppedAside.set(0);

    // Every reason is present from the start, so that "none" reads 0 rather than "no data".
    for (const reason of SKIP_REASONS) {
      this.skippedAddresses.set({ reason }, 0);
      this.skipEvents.inc({ reason }, 0);
    }
    for (const family of FAMILIES) {
      this.conflicts.set({ family }, 0);
      this.localPodDetectionMissing.set({ family }, 0);
      this.verificationsUnread.inc({ family }, 0);
    }
    this.conflictEvents.inc(0);

    // Which build runs on the node (always 1).
    const build = buildInfo();
    new Gauge({
      name: name('build_info'),
      help:
        'Always 1: the version and source revision of the controller, the Node.js version running it, and the ' +
        'kernel it runs on (uname -sr, uname -v).',
      labelNames: ['version', 'revision', 'node_version', 'kernel', 'kernel_version'],
      registers,
    }).set(
      {
        version: build.version,
        revision: build.revision,
        node_version: build.nodeVersion,
        kernel: build.kernel,
        kernel_version: build.kernelVersion,
      },
      1,
    );
  }

  describeBackend(description: BackendDescription): void {
    this.backendInfo.reset();
    this.backendInfo.set(
      {
        backend: description.backend,
        nft_executor: description.nftExecutor ?? 'none',
        nft_key_lookup: description.nftKeyLookup ?? 'none',
        iptables_variant: description.iptablesVariant ?? 'none',
      },
      1,
    );
    this.syncErrors.inc({ backend: description.backend }, 0);
  }

  onDesiredState(desired: DesiredState): void {
    // The model hands the same lists and matches while they do not change: nothing to set again.
    const seen = [
      desired.skips,
      desired.conflicts,
      ...FAMILIES.flatMap((f) => [desired[f].localPodMatch, entryCount(desired[f]) > 0]),
    ];
    if (this.lastDesired?.every((v, i) => v === seen[i])) return;
    this.lastDesired = seen;
    const perReason = new Map<string, number>(SKIP_REASONS.map((r) => [r, 0]));
    for (const s of desired.skips) perReason.set(s.reason, (perReason.get(s.reason) ?? 0) + (s.count ?? 1));
    for (const [reason, count] of perReason) this.skippedAddresses.set({ reason }, count);
    for (const family of FAMILIES) {
      this.conflicts.set({ family }, desired.conflicts.filter((c) => c.family === family).length);
      const missing = desired[family].localPodMatch.kind === 'none' && entryCount(desired[family]) > 0;
      this.localPodDetectionMissing.set({ family }, missing ? 1 : 0);
    }
  }

  onSync(report: SyncReport): void {
    const backend = report.backend;
    const mode = report.result?.mode ?? report.requested;
    this.syncDuration.observe({ backend, mode }, report.durationMs / 1000);
    if (report.error || !report.result) {
      this.syncErrors.inc({ backend });
      return;
    }
    this.syncs.inc({ backend, mode, fallback_reason: report.result.fallbackReason ?? 'none' });
    this.lastSuccessfulSync.set(Date.now() / 1000);
    this.observeRejections(report.result);
    for (const family of report.result.unverified ?? []) this.verificationsUnread.inc({ family });
    for (const family of FAMILIES) this.programmedEntries.set({ backend, family }, report.result.entries[family]);
    if (report.changeLatencyMs !== undefined) {
      this.programmingLatency.observe({ backend }, report.changeLatencyMs / 1000);
    }
  }

  onKubeProxy(status: KubeProxyStatus): void {
    for (const mode of PROXY_MODES) this.kubeProxyMode.set({ mode }, mode === status.mode.mode ? 1 : 0);
    this.kubeProxyInfo.reset();
    this.kubeProxyInfo.set({ mode: status.mode.mode, version: status.mode.version ?? 'unknown' }, 1);
    const issues = new Set(knownIssues(status.mode.mode, status.mode.version).map((i) => i.id));
    for (const issue of KNOWN_ISSUE_IDS) this.kubeProxyKnownIssue.set({ issue }, issues.has(issue) ? 1 : 0);
    this.steppedAside.set(status.steppedAside ? 1 : 0);
  }

  onNewSkips(skips: Skip[]): void {
    for (const s of skips) this.skipEvents.inc({ reason: s.reason });
  }

  onNewConflicts(conflicts: Conflict[]): void {
    this.conflictEvents.inc(conflicts.length);
  }

  onList(resource: string): void {
    this.informerLists.inc({ resource });
  }

  onWatch(resource: string): void {
    this.informerWatches.inc({ resource });
  }

  onError(resource: string): void {
    this.informerErrors.inc({ resource });
  }

  // Stale conntrack entries (src/conntrack/) and iptables rejections (src/backends/iptables/).
  private readonly conntrack = conntrackMetrics(this.registry);
  private readonly rejected = new Gauge({
    name: METRIC_PREFIX + 'rejected_entries',
    help: 'Entries and local-pod matches the backend left out after the last successful sync because it refuses a value (each is logged once).',
    registers: [this.registry],
  });

  private readonly leftoversPending = new Gauge({
    name: METRIC_PREFIX + 'leftovers_pending',
    help:
      '1 while objects another backend left (nft tables, iptables chains, eBPF pins) could not be removed; ' +
      'removal is retried with back-off. They may translate what the backend in use no longer does.',
    registers: [this.registry],
  });

  onLeftovers(pending: boolean): void {
    this.leftoversPending.set(pending ? 1 : 0);
  }

  onConntrackCleanup(report: ConntrackCleanupReport): void {
    this.conntrack.onCleanup(report);
  }

  /** Set from onSync's result: what the backend leaves out of the kernel now. */
  private observeRejections(result: NonNullable<SyncReport['result']>): void {
    if (result.rejected) this.rejected.set(result.rejected.length);
  }

  onDecodeError(resource: string): void {
    this.watchDecodeErrors.inc({ resource });
  }

  /** translated_connections_total, read from the kernel through `read` when scraped (translation-counter.ts). */
  countTranslations(read: () => Promise<TranslatedConnections[]>): void {
    registerTranslationCounter(this.registry, read);
  }

  /** The exposition text, as served on /metrics. */
  async exposition(): Promise<{ contentType: string; text: string }> {
    return { contentType: this.registry.contentType, text: await this.registry.metrics() };
  }
}
