// Kubernetes Events on Services whose external addresses are not translated (--emit-events).
//
// The controller reports a skip or a conflict once per change; this turns each into one core/v1
// Event on the Service, so that `kubectl describe service` says why in-cluster traffic to its
// address is not translated. Every node sees the same Services and would report the same thing:
// the Event name is derived from what is reported (not from the node), so the first node creates
// it and the others get AlreadyExists, which counts as done. Sending is sequential and the queue
// is bounded, so a cluster full of skipped Services cannot flood the API server.

import { createHash } from 'node:crypto';
import type { KubeConfig } from '@kubernetes/client-node';
import { kobj, type Logger } from '../log.js';
import type { ControllerObserver } from '../controller/controller.js';
import type { Conflict, ServiceInfo, Skip, SkipReason } from '../model/types.js';
import { postEvent } from './post-event.js';

/** What each skip means for traffic, in one clause; also the troubleshooting text of the docs. */
export const SKIP_EXPLANATIONS: Record<SkipReason, string> = {
  ipModeProxy: 'the load balancer asks to see this traffic (ipMode: Proxy), so it is left to the load balancer',
  unknownIpMode: 'the ingress ipMode is neither VIP nor Proxy',
  hostnameOnly: 'the ingress has a hostname and no IP, and kube-proxy binds no address for it',
  headless: 'the Service is headless (clusterIP: None): there is no ClusterIP to translate to',
  noClusterIP: 'the Service has no ClusterIP yet',
  externalName: 'the Service is of type ExternalName: there is no ClusterIP to translate to',
  familyWithoutClusterIP: 'the Service has no ClusterIP of this address family',
  invalidAddress: 'the address does not parse as an IP address',
  invalidName: 'the namespace or name is not a DNS label',
  invalidPort: 'the port is not a number from 1 to 65535',
  unsupportedProtocol: 'the protocol is not TCP, UDP or SCTP',
  notLocalTrafficPolicy:
    'the Service does not have externalTrafficPolicy: Local and --local-traffic-policy-only is set',
  optedOut: 'the Service is annotated ipvs-node-controller/skip: "true"',
  pointsAtNode:
    'the address points at the node itself (loopback, unspecified, link-local, multicast, broadcast or one of its own addresses), which a Service may never claim',
  clusterAddress:
    "the address belongs to the cluster itself (a Service's ClusterIP, the Service CIDR or a Node's address range), which a Service may never claim: translating it would take the cluster's own traffic (DNS, the API server) on every node",
  externalIpNotAllowed: 'the external IP is outside the ranges the operator allows (--service-external-ip-range)',
  externalIpsDisabled:
    "kube-proxy's AllowServiceExternalIPs feature gate is off, so spec.externalIPs are not served on this cluster",
  tooManyEntries:
    'the Service asks for more entries (addresses x ports) than one Service may (--max-entries-per-service): none of them is translated',
  overCapacity:
    'the entries of all Services exceed what this node programs (--max-entries): older Services keep theirs, and this one is not translated until it fits',
  tooManySourceRanges:
    'the Service has more loadBalancerSourceRanges than one Service may (64): its LoadBalancer addresses are left to kube-proxy, which filters them',
  sourceRangesUnsupported:
    "the Service has loadBalancerSourceRanges, which this backend cannot filter (eBPF: a connect hook does not know an unbound socket's source; nft: a kernel that refuses the objects that filter sources): its LoadBalancer address is left to kube-proxy, which filters it",
};

/** Skips that are the intended behaviour rather than a problem: reported as Normal, not Warning. */
const BY_DESIGN: ReadonlySet<SkipReason> = new Set<SkipReason>([
  'ipModeProxy',
  'hostnameOnly',
  'notLocalTrafficPolicy',
  'optedOut',
]);

export interface ServiceEventRecorderOptions {
  kubeConfig: KubeConfig;
  nodeName: string;
  /** The Service cache: Events need the Service's uid for `kubectl describe` to find them. */
  services: { list(): ServiceInfo[] };
  logger: Logger;
  /** Events waiting to be sent; more are dropped (and counted in one log line). Default 200. */
  maxQueued?: number;
}

interface PendingEvent {
  service: string;
  reason: string;
  type: 'Normal' | 'Warning';
  message: string;
}

export class ServiceEventRecorder implements ControllerObserver {
  private readonly queue: PendingEvent[] = [];
  private sending: Promise<void> | undefined;
  private dropped = 0;
  private failing = false;
  private forbidden = false;

  constructor(private readonly options: ServiceEventRecorderOptions) {}

  onNewSkips(skips: Skip[]): void {
    for (const s of skips) {
      this.enqueue({
        service: s.service,
        reason: 'ExternalAddressSkipped',
        type: BY_DESIGN.has(s.reason) ? 'Normal' : 'Warning',
        message: `${s.detail}: not translated for traffic from inside the cluster (${s.reason}): ${SKIP_EXPLANATIONS[s.reason]}`,
      });
    }
  }

  onNewConflicts(conflicts: Conflict[]): void {
    for (const c of conflicts) {
      this.enqueue({
        service: c.loser,
        reason: 'ExternalAddressConflict',
        type: 'Warning',
        message:
          `${c.externalIp} ${c.protocol}/${c.port} is also claimed by the older Service ${c.winner}, ` +
          'which gets the traffic from inside the cluster; this Service is not translated there',
      });
    }
  }

  /** Resolves when every queued Event has been sent (or failed). */
  async flush(): Promise<void> {
    while (this.sending) await this.sending;
  }

  private enqueue(event: PendingEvent): void {
    if (this.forbidden) return;
    if (this.queue.length >= (this.options.maxQueued ?? 200)) {
      if (this.dropped++ === 0) {
        this.options.logger.warn(
          { maxQueued: this.options.maxQueued ?? 200 },
          'Too many Events at once, further ones are not recorded',
        );
      }
      return;
    }
    this.queue.push(event);
    this.sending ??= this.drain().finally(() => {
      this.sending = undefined;
    });
  }

  private async drain(): Promise<void> {
    for (let event = this.queue.shift(); event; event = this.queue.shift()) await this.send(event);
    this.dropped = 0;
  }

  private async send(event: PendingEvent): Promise<void> {
    const [namespace, name] = event.service.split('/') as [string, string];
    const svc = this.options.services.list().find((s) => s.namespace === namespace && s.name === name);
    if (!svc?.uid) return; // deleted meanwhile: nothing to describe
    const digest = createHash('sha256')
      .update(`${svc.uid}\n${event.reason}\n${event.message}`)
      .digest('hex')
      .slice(0, 16);
    const failure = await postEvent(this.options.kubeConfig, {
      namespace,
      name: { name: `${name}.${digest}` },
      involvedObject: { apiVersion: 'v1', kind: 'Service', namespace, name, uid: svc.uid },
      reason: event.reason,
      message: event.message,
      type: event.type,
      nodeName: this.options.nodeName,
    });
    if (!failure) {
      this.failing = false;
      return;
    }
    const { code, err } = failure;
    if (code === 409) return; // another node (or an earlier run) recorded the same Event
    if (code === 403) {
      this.forbidden = true;
      this.queue.length = 0;
      this.options.logger.warn(
        {
          err,
          hint: 'grant the service account create on events (deploy/components/emit-events) or drop --emit-events',
        },
        'Failed to record Events, the service account may not create events',
      );
      return;
    }
    if (!this.failing) {
      this.failing = true;
      this.options.logger.warn({ service: kobj(event.service), err }, 'Failed to record an Event');
    }
  }
}
