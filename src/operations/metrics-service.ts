// /metrics: the controller's metrics and the endpoint that serves them (--metrics-bind-address).

import type { BackendDescription } from '../driver/driver.js';
import type { TranslatedConnections } from '../driver/driver.js';
import type { BindAddress, HttpEndpoint } from '../http/endpoint.js';
import { ControllerMetrics } from '../metrics/controller-metrics.js';
import { startMetricsEndpoint } from '../metrics/metrics-server.js';

export class MetricsService {
  readonly metrics = new ControllerMetrics();

  /** Serves /metrics; rejects with one line when the address cannot be bound. */
  serve(bind: BindAddress): Promise<HttpEndpoint> {
    return startMetricsEndpoint(bind, this.metrics);
  }

  /** translated_connections_total, read from the kernel by `read` when scraped. */
  countTranslations(read: () => Promise<TranslatedConnections[]>): void {
    this.metrics.countTranslations(read);
  }

  /** backend_info: which backend, nft executor and iptables variant program the kernel. */
  describeBackend(backend: BackendDescription): void {
    this.metrics.describeBackend(backend);
  }
}
