// /healthz and /readyz: judged from the controller's status and whether the API server answers
// the informers (--healthz-bind-address).

import type { Logger } from 'pino';
import type { Controller, ControllerStatus } from '../controller/controller.js';
import { ApiReachability, type HealthInputs } from '../health/health.js';
import { startHealthEndpoint } from '../health/health-server.js';
import type { BindAddress, HttpEndpoint } from '../http/endpoint.js';
import type { ContinuousProber } from '../probe/prober.js';

const NOT_STARTED: ControllerStatus = { cachesSynced: false, localPodMatchProblems: [] };

export class HealthService {
  /** An informer observer: how long the API server has failed each resource. */
  readonly api: ApiReachability;
  private readonly startedAt = Date.now();
  private controller: Controller | undefined;
  private prober: ContinuousProber | undefined;
  /** The backend in use and the settings its driver was made with, once chosen. */
  private backend: Record<string, unknown> | undefined;

  constructor(
    private readonly syncPeriodMs: number,
    logger: Logger,
    /** What /status says of the build and the node. */
    private readonly about: Record<string, unknown> = {},
  ) {
    this.api = new ApiReachability(Date.now, (resource, ms) =>
      logger.info({ resource, failedForMs: ms }, 'Listing and watching again'),
    );
  }

  /** Serves /healthz, /readyz and /status; rejects with one line when the address cannot be bound. */
  serve(bind: BindAddress): Promise<HttpEndpoint> {
    return startHealthEndpoint(
      bind,
      () => this.inputs(),
      () => ({ ...this.about, backend: this.backend ?? null }),
    );
  }

  /** /status names this backend (and the settings its driver was made with) from now on. */
  describeBackend(backend: Record<string, unknown>): void {
    this.backend = backend;
  }

  /** Health is judged from this controller's status from now on. */
  attach(controller: Controller): void {
    this.controller = controller;
  }

  /** /readyz takes this probe's failing --probe-service Services into account from now on (--probe-readiness). */
  probe(prober: ContinuousProber): void {
    this.prober = prober;
  }

  inputs(): HealthInputs {
    return {
      probesFailing: this.prober?.failingForReadiness() ?? [],
      status: this.controller?.status ?? NOT_STARTED,
      api: this.api,
      syncPeriodMs: this.syncPeriodMs,
      startedAt: this.startedAt,
      now: Date.now(),
    };
  }
}
