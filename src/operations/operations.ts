// Everything an operator watches the controller through, started by the CLI's run command in
// one piece: /metrics (metrics-service.ts), /healthz and /readyz (health-service.ts), and the
// optional Events on Services and on the Node (event-service.ts), and the continuous probe
// (src/probe/prober.ts, --probe-*), whose results /metrics and /readyz show.

import type { KubeConfig } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import type { BackendDescription } from '../driver/driver.js';
import type { Config } from '../config/options.js';
import type { Controller, ControllerObserver } from '../controller/controller.js';
import type { TranslatedConnections } from '../driver/driver.js';
import { buildInfo } from '../build-info/version.js';
import { formatBindAddress, type HttpEndpoint } from '../http/endpoint.js';
import type { InformerObserver } from '../kube/informer.js';
import type { ServiceInfo } from '../model/types.js';
import { registerProbeMetrics } from '../metrics/probe-metrics.js';
import { ContinuousProber } from '../probe/prober.js';
import { allControllerObservers, allInformerObservers } from './observer-fan-out.js';
import { eventRecorders, type EventRecorder } from './event-service.js';
import { HealthService } from './health-service.js';
import { MetricsService } from './metrics-service.js';

export class Operations {
  private readonly metricsService = new MetricsService();
  readonly metrics = this.metricsService.metrics;
  readonly health: HealthService;
  private readonly endpoints: HttpEndpoint[] = [];
  private events: EventRecorder[] = [];
  private prober: ContinuousProber | undefined;

  private constructor(
    private readonly config: Config,
    private readonly logger: Logger,
  ) {
    const { version, kernel } = buildInfo();
    this.health = new HealthService(config.syncPeriodMs, logger, { version, kernel, node: config.nodeName });
  }

  /** Starts the HTTP endpoints; rejects with one line when an address cannot be bound. */
  static async start(config: Config, logger: Logger): Promise<Operations> {
    const ops = new Operations(config, logger);
    try {
      if (config.metricsBindAddress) ops.endpoints.push(await ops.metricsService.serve(config.metricsBindAddress));
      if (config.healthzBindAddress) ops.endpoints.push(await ops.health.serve(config.healthzBindAddress));
    } catch (err) {
      await ops.close();
      throw err;
    }
    const addresses = ops.endpoints.map((e) => formatBindAddress(e.address));
    if (addresses.length > 0) logger.info({ addresses }, 'Serving /metrics, /healthz and /readyz');
    return ops;
  }

  /** backend_info, and the backend's counts of translated connections where it reads them. */
  describeBackend(backend: BackendDescription, translated?: () => Promise<TranslatedConnections[]>): void {
    this.metricsService.describeBackend(backend);
    const { cgroupPath, bpffsPath, maxEntries, kubeProxyStepAside } = this.config;
    this.health.describeBackend({ ...backend, cgroupPath, bpffsPath, maxEntries, kubeProxyStepAside });
    if (translated) this.metricsService.countTranslations(translated);
  }

  /** The informers' observer: metrics and API reachability, plus the CLI's own (logging). */
  informerObserver(own?: InformerObserver): InformerObserver {
    return allInformerObservers(own, this.metrics, this.health.api);
  }

  /** The controller's observer: metrics, Events when --emit-events is set, and the probe unless --probe-max-services=0. */
  controllerObserver(kubeConfig: KubeConfig, services: { list(): ServiceInfo[] }): ControllerObserver {
    this.events = eventRecorders(this.config, kubeConfig, services, this.logger);
    if (this.config.probe.maxServices > 0 && !this.prober) {
      const observer = registerProbeMetrics(this.metrics.registry);
      this.prober = new ContinuousProber(this.config.probe, services, observer, this.logger);
      this.health.probe(this.prober);
    }
    return allControllerObservers(this.metrics, ...this.events, this.prober);
  }

  /** Health is judged from this controller's status from now on. */
  attach(controller: Controller): void {
    this.health.attach(controller);
  }

  async close(): Promise<void> {
    await this.prober?.stop();
    await Promise.all(this.events.map((e) => e.flush()));
    await Promise.all(this.endpoints.splice(0).map((e) => e.close()));
  }
}
