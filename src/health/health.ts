// Liveness and readiness of the controller, as pure judgements over what it reports.
//
// /healthz (liveness) asks: is the sync loop alive? Once the caches have synced, a sync is always
// due (a full resync runs every --sync-period, a failed one is retried within it), so no sync
// that ended, successfully or not, for 2 x --sync-period means the loop is stuck, and a restart
// may help. What Services ask for never makes it fail: a Service over a limit is skipped, and a
// sync that the kernel refuses is the loop working (readiness says so). Before the caches have
// synced nothing may be programmed yet (previous rules stay), and a restart cannot make the API
// server reachable, so the controller counts as alive; this is kube-proxy's rule too: unhealthy
// only when work it has queued is not done in time.
//
// /readyz asks: is this node's translation current? Not before the caches have synced and the
// first sync has succeeded, not while liveness fails, not when no sync has succeeded for
// 2 x --sync-period, and not while the API server has been unreachable for longer than that (the
// rules are kept, but may be stale). Services left out by a limit are warnings: the others are
// translated, and one tenant's Service must not take every node out of service. So are known bugs
// of kube-proxy's own (they break traffic whatever the controller does), and leftovers
// of another backend that could not be removed yet (retried with back-off): what is ours is
// current, and a node whose old objects resist removal is not made unready by it on every node at once.

import type { ControllerStatus } from '../controller/controller.js';
import type { InformerObserver } from '../kube/informer.js';
import type { ProbeResult } from '../probe/prober.js';
import { describeKnownIssue, knownIssues } from '../kubeproxy/known-issues.js';

export interface Judgement {
  ok: boolean;
  /** One line: why not, or what was checked. */
  detail: string;
  /** Things an operator should know that do not make the check fail. */
  warnings: string[];
}

/**
 * What the informers tell about the API server: when each resource was first listed, and since
 * when its list or watch has been failing (cleared by the next successful list or watch).
 */
export class ApiReachability implements InformerObserver {
  private readonly firstListedAt = new Map<string, number>();
  private readonly failing = new Map<string, { since: number; message: string }>();

  constructor(
    private readonly now: () => number = Date.now,
    /** Called when a resource that was failing is listed or watched again. */
    private readonly onRecovered?: (resource: string, failedForMs: number) => void,
  ) {}

  onList(resource: string): void {
    if (!this.firstListedAt.has(resource)) this.firstListedAt.set(resource, this.now());
    this.recovered(resource);
  }

  onWatch(resource: string): void {
    this.recovered(resource);
  }

  private recovered(resource: string): void {
    const f = this.failing.get(resource);
    if (!f) return;
    this.failing.delete(resource);
    this.onRecovered?.(resource, this.now() - f.since);
  }

  onError(resource: string, err: Error): void {
    const known = this.failing.get(resource);
    this.failing.set(resource, { since: known?.since ?? this.now(), message: err.message });
  }

  /** The latest first list among the resources: when the last cache became complete. */
  lastFirstListAt(): number | undefined {
    return this.firstListedAt.size > 0 ? Math.max(...this.firstListedAt.values()) : undefined;
  }

  /** The longest-failing resource, if any is failing now. */
  unreachable(): { resource: string; since: number; message: string } | undefined {
    let oldest: { resource: string; since: number; message: string } | undefined;
    for (const [resource, f] of this.failing) {
      if (!oldest || f.since < oldest.since) oldest = { resource, ...f };
    }
    return oldest;
  }
}

export interface HealthInputs {
  status: ControllerStatus;
  /** --probe-readiness: the --probe-service Services whose last probe round failed. */
  probesFailing?: readonly ProbeResult[];
  api: ApiReachability;
  syncPeriodMs: number;
  /** Process start, the fallback when the moment the caches synced is not known. */
  startedAt: number;
  now: number;
}

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(ms < 10_000 ? 1 : 0)}s`;
}

export function judgeLiveness(inputs: HealthInputs): Judgement {
  const { status, api, syncPeriodMs, startedAt, now } = inputs;
  const warnings = status.lastError ? [`last sync failed: ${status.lastError}`] : [];
  if (!status.cachesSynced) {
    return {
      ok: true,
      detail: 'waiting for the Service and Node caches to sync; the kernel is not touched until then',
      warnings,
    };
  }
  const limit = 2 * syncPeriodMs;
  if (status.syncStartedAt !== undefined && now - status.syncStartedAt > limit) {
    return {
      ok: false,
      detail: `a sync has been running for ${seconds(now - status.syncStartedAt)} (limit: 2 x --sync-period = ${seconds(limit)})`,
      warnings: [],
    };
  }
  const reference = status.lastSyncEndedAt ?? api.lastFirstListAt() ?? startedAt;
  const age = Math.max(0, now - reference);
  if (age <= limit || status.syncStartedAt !== undefined) {
    const detail =
      status.lastSyncEndedAt === undefined
        ? `caches synced ${seconds(age)} ago; first sync pending`
        : status.lastSuccessfulSyncAt === status.lastSyncEndedAt
          ? `last successful sync ${seconds(age)} ago`
          : `last sync ended ${seconds(age)} ago`;
    return { ok: true, detail, warnings };
  }
  const why = status.lastError ? `: ${status.lastError}` : '';
  return {
    ok: false,
    detail: `no sync has ended for ${seconds(age)} (limit: 2 x --sync-period = ${seconds(limit)}): the sync loop is stuck${why}`,
    warnings: [],
  };
}

/** Warnings for Services that a limit leaves untranslated. */
function limitWarnings(status: ControllerStatus): string[] {
  const over = status.servicesOverLimits ?? {};
  const out: string[] = [];
  if (over.tooManyEntries) {
    out.push(
      `${over.tooManyEntries} Services are not translated: each asks for more than ${status.limits?.maxEntriesPerService ?? 'the limit of'} entries (tooManyEntries, --max-entries-per-service)`,
    );
  }
  if (over.overCapacity) {
    out.push(
      `${over.overCapacity} Services are not translated: they do not fit in the ${status.limits?.maxEntries ?? 'limit of'} entries per family this node programs (overCapacity, --max-entries)`,
    );
  }
  return out;
}

/** Objects another backend left that could not be removed yet: they may translate what ours no longer does. */
function leftoverWarnings(status: ControllerStatus, now: number): string[] {
  const l = status.leftovers;
  if (!l) return [];
  return [
    `leftovers of another backend could not be removed for ${seconds(now - l.failingSince)} (${l.attempts} attempts, ` +
      `next in ${seconds(Math.max(0, l.retryAt - now))}); they may translate addresses this backend no longer does: ${l.error}`,
  ];
}

/**
 * Known bugs of kube-proxy at the mode and version it runs (kubeproxy/known-issues.ts): kube-proxy
 * breaks that traffic itself, so the controller stepping aside stays right, and it stays ready.
 */
function kubeProxyIssueWarnings(status: ControllerStatus): string[] {
  const mode = status.kubeProxy?.mode;
  if (!mode?.version) return [];
  return knownIssues(mode.mode, mode.version).map((issue) => describeKnownIssue(issue, mode.version!));
}

function probeFailure(r: ProbeResult): string {
  if (r.notProbed !== undefined) return r.notProbed;
  return r.paths
    .filter((p) => p.outcome !== 'answered')
    .map((p) => `${p.address}:${p.port}/${p.protocol} ${p.outcome}`)
    .join(', ');
}

export function judgeReadiness(inputs: HealthInputs): Judgement {
  const { status, api, syncPeriodMs, now } = inputs;
  const outage = api.unreachable();
  const outageLine = outage
    ? `the API server has been unreachable for ${seconds(now - outage.since)} (${outage.resource}: ${outage.message})`
    : undefined;
  if (!status.cachesSynced) {
    const detail = 'waiting for the Service and Node caches to sync' + (outageLine ? `: ${outageLine}` : '');
    return { ok: false, detail, warnings: [] };
  }
  const liveness = judgeLiveness(inputs);
  if (!liveness.ok) return { ok: false, detail: liveness.detail, warnings: [] };
  if (status.lastSuccessfulSyncAt === undefined) {
    const detail = 'waiting for the first sync' + (status.lastError ? `: ${status.lastError}` : '');
    return { ok: false, detail, warnings: [] };
  }
  const sinceSuccess = now - status.lastSuccessfulSyncAt;
  if (sinceSuccess > 2 * syncPeriodMs) {
    const why = status.lastError ? `: ${status.lastError}` : '';
    return {
      ok: false,
      detail: `no successful sync for ${seconds(sinceSuccess)} (limit: 2 x --sync-period = ${seconds(2 * syncPeriodMs)})${why}`,
      warnings: [],
    };
  }
  const warnings = [
    ...status.localPodMatchProblems.map((p) => `traffic from pods is not translated: ${p}`),
    ...limitWarnings(status),
    ...leftoverWarnings(status, now),
    ...kubeProxyIssueWarnings(status),
  ];
  if (outage && now - outage.since > 2 * syncPeriodMs) {
    return { ok: false, detail: `${outageLine}; the last programmed rules are kept`, warnings };
  }
  if (outageLine) warnings.push(outageLine);
  const failing = inputs.probesFailing ?? [];
  if (failing.length > 0) {
    const which = failing.map((r) => `${r.service} (${probeFailure(r)})`).join(', ');
    return { ok: false, detail: `the probe of --probe-service ${which} failed (--probe-readiness)`, warnings };
  }
  const kubeProxy = status.kubeProxy;
  // Stepping aside is the intended behaviour outside IPVS mode: ready, and the detail says why.
  const detail = kubeProxy?.steppedAside
    ? `stepped aside, nothing is programmed: ${kubeProxy.reason}; ${liveness.detail}`
    : liveness.detail;
  if (kubeProxy && !kubeProxy.steppedAside && kubeProxy.reason) {
    warnings.push(`translating although ${kubeProxy.reason} (--kube-proxy-step-aside=false)`);
  }
  return { ok: true, detail, warnings: [...warnings, ...liveness.warnings] };
}
