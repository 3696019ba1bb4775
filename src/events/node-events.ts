// With --emit-events, Events on this node's Node object, so that `kubectl describe node` says what
// the controller knows of kube-proxy here: one when the controller steps aside for kube-proxy and
// when it programs again, and one when kube-proxy runs a mode and version with a known bug.

import type { KubeConfig } from '@kubernetes/client-node';
import type { Logger } from '../log.js';
import type { ControllerObserver, KubeProxyStatus } from '../controller/controller.js';
import { describeKnownIssue, knownIssues } from '../kubeproxy/known-issues.js';
import { EVENT_COMPONENT, postEvent } from './post-event.js';

export const STEPPED_ASIDE_REASON = 'SteppedAsideForKubeProxy';
export const RESUMED_REASON = 'TranslatingForKubeProxyIpvs';
export const KNOWN_ISSUE_REASON = 'KubeProxyKnownIssue';

/** Posts the Events of this node's Node one after the other; a failure is logged, never thrown. */
class NodeEventSender {
  private sending: Promise<void> = Promise.resolve();

  constructor(
    private readonly kubeConfig: KubeConfig,
    private readonly nodeName: string,
    private readonly logger: Logger,
  ) {}

  send(reason: string, type: 'Normal' | 'Warning', message: string): void {
    this.sending = this.sending.then(() => this.post(reason, type, message));
  }

  async flush(): Promise<void> {
    await this.sending;
  }

  private async post(reason: string, type: 'Normal' | 'Warning', message: string): Promise<void> {
    const failure = await postEvent(this.kubeConfig, {
      // Node Events live in `default`, with the node's name as uid, as the kubelet records them.
      namespace: 'default',
      name: { generateName: `${this.nodeName}.` },
      involvedObject: { apiVersion: 'v1', kind: 'Node', name: this.nodeName, uid: this.nodeName },
      reason,
      message,
      type,
      nodeName: this.nodeName,
    });
    if (!failure) return;
    const hint =
      failure.code === 403 ? 'grant the service account create on events (deploy/components/emit-events)' : undefined;
    this.logger.warn({ err: failure.err, hint }, 'Failed to record the Node Event');
  }
}

/** The Node Events about kube-proxy: the controller stepping aside for it and back, and its known bugs. */
export class NodeKubeProxyEvents implements ControllerObserver {
  private lastSteppedAside = false;
  /** The known bugs last recorded, with the version they were recorded at. */
  private lastIssues = '';
  private readonly sender: NodeEventSender;

  constructor(kubeConfig: KubeConfig, nodeName: string, logger: Logger) {
    this.sender = new NodeEventSender(kubeConfig, nodeName, logger);
  }

  onKubeProxy(status: KubeProxyStatus): void {
    this.recordKnownIssues(status);
    if (status.steppedAside === this.lastSteppedAside) return;
    this.lastSteppedAside = status.steppedAside;
    const message = status.steppedAside
      ? `${EVENT_COMPONENT} removed its rules and programs nothing: ${status.reason ?? 'kube-proxy is not in IPVS mode'}`
      : `${EVENT_COMPONENT} translates again: kube-proxy is in IPVS mode (${status.mode.detail})`;
    this.sender.send(status.steppedAside ? STEPPED_ASIDE_REASON : RESUMED_REASON, 'Normal', message);
  }

  /** A Warning per known bug of kube-proxy, once per change of the bugs or of kube-proxy's version. */
  private recordKnownIssues(status: KubeProxyStatus): void {
    const { mode, version } = status.mode;
    const issues = version ? knownIssues(mode, version) : [];
    const key = issues.length > 0 ? `${version} ${issues.map((i) => i.id).join(' ')}` : '';
    if (key === this.lastIssues) return;
    this.lastIssues = key;
    for (const issue of issues) this.sender.send(KNOWN_ISSUE_REASON, 'Warning', describeKnownIssue(issue, version!));
  }

  async flush(): Promise<void> {
    await this.sender.flush();
  }
}
