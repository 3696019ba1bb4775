// Everything an operator watches the controller through, started by the CLI's run command in
// one piece: /metrics, /healthz and /readyz, and the optional Service Events.

import type { KubeConfig } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import type { Backend } from '../backends/backend.js';
import type { Config } from '../config/options.js';
import type { Controller, ControllerObserver, ControllerStatus } from '../controller.js';
import { ServiceEventRecorder } from '../events/service-events.js';
import { ApiReachability, type HealthInputs } from '../health/health.js';
import { startHealthEndpoint } from '../health/health-server.js';
import { formatBindAddress, type HttpEndpoint } from '../health/http-endpoint.js';
import type { InformerObserver } from '../kube/informer.js';
import type { ServiceInfo } from '../model/types.js';
import { ControllerMetrics } from './controller-metrics.js';
import { startMetricsEndpoint } from './metrics-server.js';
import { allControllerObservers, allInformerObservers } from './observers.js';

const NOT_STARTED: ControllerStatus = { cachesSynced: false, localPodMatchProblems: [] };

export class Operations {
  readonly metrics = new ControllerMetrics();
  readonly api = new ApiReachability(Date.now, (resource, ms) =>
    this.logger.info({ resource, failedForMs: ms }, `${resource} are listed and watched again`),
  );
  private readonly startedAt = Date.now();
  private readonly endpoints: HttpEndpoint[] = [];
  private controller: Controller | undefined;
  private events: ServiceEventRecorder | undefined;

  private constructor(
    private readonly config: Config,
    private readonly logger: Logger,
  ) {}

  /** Starts the HTTP endpoints; rejects with one line when an address cannot be bound. */
  static async start(config: Config, logger: Logger): Promise<Operations> {
    const ops = new Operations(config, logger);
    try {
      if (config.metricsBindAddress) {
        ops.endpoints.push(await startMetricsEndpoint(config.metricsBindAddress, ops.metrics));
      }
      if (config.healthzBindAddress) {
        ops.endpoints.push(await startHealthEndpoint(config.healthzBindAddress, () => ops.healthInputs()));
      }
    } catch (err) {
      await ops.close();
      throw err;
    }
    const addresses = ops.endpoints.map((e) => formatBindAddress(e.address));
    if (addresses.length > 0) logger.info({ addresses }, 'serving /metrics, /healthz and /readyz');
    return ops;
  }

  describeBackend(backend: Backend): void {
    // The nft backend exposes which executor programs the kernel, the iptables backend its variant.
    const { executor, variant } = backend as { executor?: { kind?: unknown }; variant?: unknown };
    this.metrics.describeBackend({
      backend: backend.name,
      nftExecutor: typeof executor?.kind === 'string' ? executor.kind : undefined,
      iptablesVariant: typeof variant === 'string' ? variant : undefined,
    });
  }

  /** The informers' observer: metrics and API reachability, plus the CLI's own (logging). */
  informerObserver(own?: InformerObserver): InformerObserver {
    return allInformerObservers(own, this.metrics, this.api);
  }

  /** The controller's observer: metrics, and Events when --emit-events is set. */
  controllerObserver(kubeConfig: KubeConfig, services: { list(): ServiceInfo[] }): ControllerObserver {
    if (this.config.emitEvents) {
      this.events = new ServiceEventRecorder({
        kubeConfig,
        nodeName: this.config.nodeName,
        services,
        logger: this.logger,
      });
    }
    return allControllerObservers(this.metrics, this.events);
  }

  /** Health is judged from this controller's status from now on. */
  attach(controller: Controller): void {
    this.controller = controller;
  }

  healthInputs(): HealthInputs {
    return {
      status: this.controller?.status ?? NOT_STARTED,
      api: this.api,
      syncPeriodMs: this.config.syncPeriodMs,
      startedAt: this.startedAt,
      now: Date.now(),
    };
  }

  async close(): Promise<void> {
    await this.events?.flush();
    await Promise.all(this.endpoints.splice(0).map((e) => e.close()));
  }
}
