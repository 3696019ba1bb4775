// Service Events (--emit-events): skips and conflicts reported on the Services they concern.

import type { KubeConfig } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import type { Config } from '../config/options.js';
import { ServiceEventRecorder } from '../events/service-events.js';
import type { ServiceInfo } from '../model/types.js';

/** The recorder when --emit-events is set, else undefined. */
export function serviceEvents(
  config: Pick<Config, 'emitEvents' | 'nodeName'>,
  kubeConfig: KubeConfig,
  services: { list(): ServiceInfo[] },
  logger: Logger,
): ServiceEventRecorder | undefined {
  if (!config.emitEvents) return undefined;
  return new ServiceEventRecorder({ kubeConfig, nodeName: config.nodeName, services, logger });
}
