// /metrics over HTTP in the Prometheus text format.

import { HttpEndpoint, type BindAddress } from '../http/endpoint.js';
import type { ControllerMetrics } from './controller-metrics.js';

export function startMetricsEndpoint(bind: BindAddress, metrics: ControllerMetrics): Promise<HttpEndpoint> {
  return HttpEndpoint.start(bind, '--metrics-bind-address', {
    '/metrics': async () => {
      const { contentType, text } = await metrics.exposition();
      return { status: 200, contentType, body: text };
    },
  });
}
