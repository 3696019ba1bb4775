// /healthz (liveness) and /readyz (readiness) over HTTP: 200 or 503, with a JSON body that says
// why, for people reading `kubectl describe pod` and for scripts.

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

/** Serves /healthz and /readyz on `bind`; `inputs` is read anew for every request. */
export function startHealthEndpoint(bind: BindAddress, inputs: () => HealthInputs): Promise<HttpEndpoint> {
  return HttpEndpoint.start(bind, '--healthz-bind-address', {
    '/healthz': () => {
      const i = inputs();
      return respond(judgeLiveness(i), i);
    },
    '/readyz': () => {
      const i = inputs();
      return respond(judgeReadiness(i), i);
    },
  });
}
