// With --emit-events: one Event on this node's Node object when the controller steps aside for
// kube-proxy and when it programs again, so `kubectl describe node` says why nothing is translated.

import type { CoreV1Event, KubeConfig } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import type { ControllerObserver, KubeProxyStatus } from '../controller.js';
import { apiRequest, statusMessage } from '../kube/request.js';

export const STEPPED_ASIDE_REASON = 'SteppedAsideForKubeProxy';
export const RESUMED_REASON = 'TranslatingForKubeProxyIpvs';

export class NodeStepAsideEvents implements ControllerObserver {
  private lastSteppedAside = false;
  private sending: Promise<void> = Promise.resolve();

  constructor(
    private readonly kubeConfig: KubeConfig,
    private readonly nodeName: string,
    private readonly logger: Logger,
  ) {}

  onKubeProxy(status: KubeProxyStatus): void {
    if (status.steppedAside === this.lastSteppedAside) return;
    this.lastSteppedAside = status.steppedAside;
    const message = status.steppedAside
      ? `ipvs-node-controller removed its rules and programs nothing: ${status.reason ?? 'kube-proxy is not in IPVS mode'}`
      : `ipvs-node-controller translates again: kube-proxy is in IPVS mode (${status.mode.detail})`;
    this.sending = this.sending.then(() =>
      this.send(status.steppedAside ? STEPPED_ASIDE_REASON : RESUMED_REASON, message),
    );
  }

  async flush(): Promise<void> {
    await this.sending;
  }

  private async send(reason: string, message: string): Promise<void> {
    const now = new Date();
    const body: CoreV1Event = {
      // Node Events live in `default`, with the node's name as uid, as the kubelet records them.
      metadata: { generateName: `${this.nodeName}.`, namespace: 'default' },
      involvedObject: { apiVersion: 'v1', kind: 'Node', name: this.nodeName, uid: this.nodeName },
      reason,
      message,
      type: 'Normal',
      count: 1,
      firstTimestamp: now,
      lastTimestamp: now,
      source: { component: 'ipvs-node-controller', host: this.nodeName },
      reportingComponent: 'ipvs-node-controller',
      reportingInstance: this.nodeName,
    };
    // One narrow request, as for Service Events: the generated API client is not loaded.
    let code: number | undefined;
    let failure: unknown;
    try {
      const response = await apiRequest(this.kubeConfig, '/api/v1/namespaces/default/events', {
        method: 'POST',
        body,
        timeoutMs: 30_000,
      });
      code = response.status;
      if (code >= 200 && code < 300) return;
      failure = new Error(statusMessage(response));
    } catch (err) {
      failure = err;
    }
    const hint =
      code === 403 ? 'grant the service account create on events (deploy/components/emit-events)' : undefined;
    this.logger.warn({ err: failure, hint }, 'Failed to record the Node Event');
  }
}
