// /healthz (liveness) and /readyz (readiness) over HTTP: 200 or 503, with a JSON body that says
// why, for people reading `kubectl describe pod` and for scripts; /status, what `check` reads.

import { HttpEndpoint, type BindAddress, type EndpointResponse } from '../http/endpoint.js';
import { knownIssues } from '../kubeproxy/known-issues.js';
import { judgeLiveness, judgeReadiness, type HealthInputs, type Judgement } from './health.js';

function respond(judgement: Judgement, inputs: HealthInputs): EndpointResponse {
  const last = inputs.status.lastSuccessfulSyncAt;
  const body = {
    status: judgement.ok ? 'ok' : 'fail',
    detail: judgement.detail,
    warnings: judgement.warnings,
    lastSuccessfulSync: last === undefined ? null : new Date(last).toISOString(),
    kubeProxy: kubeProxyBody(inputs),
    now: new Date(inputs.now).toISOString(),
  };
  return { status: judgement.ok ? 200 : 503, contentType: 'application/json', body: JSON.stringify(body) + '\n' };
}

/**
 * kube-proxy's mode and version as seen, its known bugs at them, whether we stepped aside and why,
 * and the effective settings with their sources.
 */
function kubeProxyBody(inputs: HealthInputs) {
  const k = inputs.status.kubeProxy;
  if (!k) return undefined;
  return {
    mode: k.mode.mode,
    modeSource: k.mode.source,
    modeDetail: k.mode.detail,
    version: k.mode.version ?? null,
    ...(k.mode.versionProblem ? { versionProblem: k.mode.versionProblem } : {}),
    knownIssues: knownIssues(k.mode.mode, k.mode.version).map((i) => i.id),
    steppedAside: k.steppedAside,
    ...(k.reason ? { reason: k.reason } : {}),
    settings: k.settings,
  };
}

/**
 * What `ipvs-node-controller check` asks a running controller: its backend and the settings it
 * derives with (so that the check derives the very same state), its readiness and last sync, and
 * what its last derivation skipped. Counts and settings only: no Service's name.
 */
function statusBody(inputs: HealthInputs, about: StatusAbout): EndpointResponse {
  const { status } = inputs;
  const readiness = judgeReadiness(inputs);
  const at = (ms: number | undefined) => (ms === undefined ? null : new Date(ms).toISOString());
  const body = {
    ...about(),
    readiness: { ok: readiness.ok, detail: readiness.detail, warnings: readiness.warnings },
    cachesSynced: status.cachesSynced,
    lastSuccessfulSync: at(status.lastSuccessfulSyncAt),
    lastSyncEnded: at(status.lastSyncEndedAt),
    lastError: status.lastError ?? null,
    model: status.model ?? null,
    limits: status.limits ?? null,
    derived: status.derived ?? null,
    localPodMatchProblems: status.localPodMatchProblems,
    kubeProxy: kubeProxyBody(inputs),
    now: new Date(inputs.now).toISOString(),
  };
  return { status: 200, contentType: 'application/json', body: JSON.stringify(body) + '\n' };
}

/** The parts of /status the health service does not judge: the backend, the build, the node. */
export type StatusAbout = () => Record<string, unknown>;

/** Serves /healthz, /readyz and /status on `bind`; `inputs` is read anew for every request. */
export function startHealthEndpoint(
  bind: BindAddress,
  inputs: () => HealthInputs,
  about: StatusAbout = () => ({}),
): Promise<HttpEndpoint> {
  return HttpEndpoint.start(bind, '--healthz-bind-address', {
    '/healthz': () => {
      const i = inputs();
      return respond(judgeLiveness(i), i);
    },
    '/readyz': () => {
      const i = inputs();
      return respond(judgeReadiness(i), i);
    },
    '/status': () => statusBody(inputs(), about),
  });
}
