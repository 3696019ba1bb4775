// The Services the benchmark serves through the API stand-in: LoadBalancer Services shaped as a
// real API server returns them (labels, last-applied annotation, managedFields, allocated node
// ports), so that listing, watching and stripping do the work they do on a real cluster.
// Service i has one TCP port and one ingress IP: one map element per Service.

import { join } from 'node:path';
import type { ModelConfig } from '../src/model/types.js';
import { ApiStandIn } from '../testbed/api-server.js';

/** Progress, on stderr: stdout is the benchmark's figures. */
export const log = (message: string) => process.stderr.write(`[bench] ${message}\n`);

export const BENCH_PORT = 443;
export const NODE_NAME = 'bench-node';
/** The node's InternalIP (also the source address of the packet prober's connections). */
export const NODE_ADDRESS = '192.168.50.1';
const POD_CIDR = '10.244.1.0/24';
/** A pod of this node (the packet prober's --probe-from pod) and its gateway on the node side. */
export const POD_ADDRESS = '10.244.1.2/24';
export const POD_GATEWAY = '10.244.1.1/24';
const NAMESPACES = 50;
const CREATED_BASE_MS = Date.parse('2024-01-01T00:00:00Z');

type Json = Record<string, unknown>;

function ipv4(base: number, offset: number): string {
  const n = (base + offset) >>> 0;
  return `${n >>> 24}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`;
}

const INGRESS_BASE = (198 << 24) | (18 << 16); // 198.18.0.0/15, the benchmarking range
const CLUSTER_BASE = (10 << 24) | (96 << 16); // 10.96.0.0/12
const MOVED_BASE = (100 << 24) | (64 << 16); // 100.64.0.0/10: addresses a Service moves to

/** The ranges the addresses below come from (the packet prober routes them). */
export const INGRESS_RANGE = '198.18.0.0/15';
export const CLUSTER_RANGE = '10.96.0.0/12';
export const MOVED_RANGE = '100.64.0.0/10';

/** Ingress IP of Service i (i < 131,000); .0 and .255 of the first /24 are never used. */
export function ingressIp(i: number): string {
  return ipv4(INGRESS_BASE, i + 1);
}

export function clusterIp(i: number): string {
  return ipv4(CLUSTER_BASE, i + 1);
}

/** The k-th fresh address a Service's ingress is moved to by the change-latency measure. */
export function movedIp(k: number): string {
  return ipv4(MOVED_BASE, k + 1);
}

export function serviceName(i: number): { namespace: string; name: string } {
  return { namespace: `bench-${String(i % NAMESPACES).padStart(2, '0')}`, name: `service-${i}` };
}

function rfc3339(ms: number): string {
  return new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

export function benchService(i: number, ingress = ingressIp(i)): Json {
  const { namespace, name } = serviceName(i);
  const created = rfc3339(CREATED_BASE_MS + i * 1000);
  const labels = { 'app.kubernetes.io/name': name, 'app.kubernetes.io/part-of': 'bench' };
  const update = { operation: 'Update', apiVersion: 'v1', time: created, fieldsType: 'FieldsV1' };
  const appliedSpec = {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace, labels },
    spec: {
      type: 'LoadBalancer',
      externalTrafficPolicy: 'Local',
      selector: { 'app.kubernetes.io/name': name },
      ports: [{ name: 'https', port: BENCH_PORT, targetPort: 8443 }],
    },
  };
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {
      name,
      namespace,
      creationTimestamp: created,
      labels,
      annotations: {
        'kubectl.kubernetes.io/last-applied-configuration': JSON.stringify(appliedSpec) + '\n',
        'metallb.universe.tf/ip-allocated-from-pool': 'bench-pool',
      },
      managedFields: [
        {
          ...{ manager: 'kubectl-client-side-apply', ...update },
          fieldsV1: {
            'f:metadata': {
              'f:annotations': { '.': {}, 'f:kubectl.kubernetes.io/last-applied-configuration': {} },
              'f:labels': { '.': {}, 'f:app.kubernetes.io/name': {}, 'f:app.kubernetes.io/part-of': {} },
            },
            'f:spec': {
              'f:allocateLoadBalancerNodePorts': {},
              'f:externalTrafficPolicy': {},
              'f:internalTrafficPolicy': {},
              'f:ports': {
                '.': {},
                'k:{"port":443,"protocol":"TCP"}': {
                  '.': {},
                  'f:name': {},
                  'f:port': {},
                  'f:protocol': {},
                  'f:targetPort': {},
                },
              },
              'f:selector': {},
              'f:sessionAffinity': {},
              'f:type': {},
            },
          },
        },
        {
          ...{ manager: 'metallb-controller', ...update },
          fieldsV1: { 'f:status': { 'f:loadBalancer': { 'f:ingress': {} } } },
          subresource: 'status',
        },
      ],
    },
    spec: {
      type: 'LoadBalancer',
      clusterIP: clusterIp(i),
      clusterIPs: [clusterIp(i)],
      ipFamilies: ['IPv4'],
      ipFamilyPolicy: 'SingleStack',
      ports: [{ name: 'https', protocol: 'TCP', port: BENCH_PORT, targetPort: 8443, nodePort: 30000 + (i % 2768) }],
      selector: { 'app.kubernetes.io/name': name },
      sessionAffinity: 'None',
      externalTrafficPolicy: 'Local',
      healthCheckNodePort: 32767 - (i % 2768),
      allocateLoadBalancerNodePorts: true,
      internalTrafficPolicy: 'Cluster',
    },
    status: { loadBalancer: { ingress: [{ ip: ingress, ipMode: 'VIP' }] } },
  };
}

export function benchNode(): Json {
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: { name: NODE_NAME, labels: { 'kubernetes.io/hostname': NODE_NAME } },
    spec: { podCIDR: POD_CIDR, podCIDRs: [POD_CIDR] },
    status: { addresses: [{ type: 'InternalIP', address: NODE_ADDRESS }] },
  };
}

/** The model's configuration of the controller's defaults (the benchmark passes no model flags). */
export const BENCH_MODEL: Readonly<ModelConfig> = Object.freeze({
  detectLocalMode: 'NodeCIDR',
  clusterCidrs: [],
  masqueradeBit: 14,
  localTrafficPolicyOnly: false,
});

/** The API stand-in of this process (over TLS) serving the node and the benchmark's Services 0..n-1. */
export class ServedCluster {
  private served = 0;
  /** Fresh addresses handed out so far (movedIp). */
  private moved = 0;

  private constructor(
    readonly standIn: ApiStandIn,
    /** The controller's kubeconfig. */
    readonly kubeconfig: string,
  ) {}

  /** Starts the stand-in, serving the node; its kubeconfig goes into `dir`. */
  static async start(dir: string): Promise<ServedCluster> {
    const standIn = await ApiStandIn.start();
    const kubeconfig = join(dir, 'kubeconfig');
    await standIn.writeKubeconfig(kubeconfig);
    standIn.apply(benchNode());
    return new ServedCluster(standIn, kubeconfig);
  }

  /** Serves exactly Services 0..n-1: a measure at 10,000 after one at 50,000 lists 10,000. */
  serve(n: number): void {
    if (n !== this.served) log(`serving ${n.toLocaleString('en-US')} Services`);
    for (; this.served < n; this.served++) this.standIn.apply(benchService(this.served));
    for (; this.served > n; this.served--) {
      const { namespace, name } = serviceName(this.served - 1);
      this.standIn.remove('Service', namespace, name);
    }
  }

  /** A fresh address, never used before in this run. */
  freshAddress(): string {
    return movedIp(this.moved++);
  }

  stop(): Promise<void> {
    return this.standIn.stop();
  }
}
