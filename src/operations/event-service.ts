// Events (--emit-events): skips and conflicts on the Services they concern, and on this node's
// Node the controller stepping aside for kube-proxy and back, and kube-proxy's known bugs.

import type { KubeConfig } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import type { Config } from '../config/options.js';
import type { ControllerObserver } from '../controller/controller.js';
import { NodeKubeProxyEvents } from '../events/node-events.js';
import { ServiceEventRecorder } from '../events/service-events.js';
import type { ServiceInfo } from '../model/types.js';

/** A recorder of Events: it observes the controller, and flush() waits for what it is sending. */
export type EventRecorder = ControllerObserver & { flush(): Promise<void> };

/** The recorders when --emit-events is set, else none. */
export function eventRecorders(
  config: Pick<Config, 'emitEvents' | 'nodeName'>,
  kubeConfig: KubeConfig,
  services: { list(): ServiceInfo[] },
  logger: Logger,
): EventRecorder[] {
  if (!config.emitEvents) return [];
  return [
    new ServiceEventRecorder({ kubeConfig, nodeName: config.nodeName, services, logger }),
    new NodeKubeProxyEvents(kubeConfig, config.nodeName, logger),
  ];
}
