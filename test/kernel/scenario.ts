// The Services, addresses and servers shared by the packet tests of every backend.

import type { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { rm } from 'node:fs/promises';
import type { NodeInfo, ServiceInfo } from '../../src/model/types.js';
import { NamedServer, NodeNetwork, NODE, sh } from '../../testbed/node-network.js';
import { shippedArgs } from '../../testbed/shipped-controller.js';

export const LB_V4 = '192.0.2.10';
export const LB_V6 = '2001:db8::10';
export const LB_PROXY = '192.0.2.20';
export const EXTERNAL_IP = '198.51.100.7';

/** What answers when a connection is NOT translated: the load balancer path. */
export const LB_PATH = 'lb-path';

export const SERVICES: ServiceInfo[] = [
  {
    namespace: 'default',
    name: 'svc-a',
    type: 'LoadBalancer',
    creationTimestamp: '2024-01-01T00:00:00Z',
    clusterIP: '10.96.0.10',
    clusterIPs: ['10.96.0.10', 'fd00::10'],
    externalTrafficPolicy: 'Local',
    ports: [
      { port: 80, protocol: 'TCP' },
      { port: 80, protocol: 'UDP' },
    ],
    ingress: [{ ip: LB_V4 }, { ip: LB_V6, ipMode: 'VIP' }],
  },
  {
    // Shares svc-a's LoadBalancer IP on another port, as MetalLB allows.
    namespace: 'default',
    name: 'svc-b',
    type: 'LoadBalancer',
    creationTimestamp: '2024-01-02T00:00:00Z',
    clusterIP: '10.96.0.11',
    ports: [{ port: 8080, protocol: 'TCP' }],
    ingress: [{ ip: LB_V4 }],
  },
  {
    namespace: 'default',
    name: 'svc-proxy',
    type: 'LoadBalancer',
    creationTimestamp: '2024-01-03T00:00:00Z',
    clusterIP: '10.96.0.12',
    ports: [{ port: 80, protocol: 'TCP' }],
    ingress: [{ ip: LB_PROXY, ipMode: 'Proxy' }, { hostname: 'lb.example.com' }],
  },
  {
    namespace: 'shop',
    name: 'svc-ext',
    type: 'ClusterIP',
    creationTimestamp: '2024-01-04T00:00:00Z',
    clusterIP: '10.96.0.13',
    ports: [{ port: 443, protocol: 'TCP' }],
    externalIPs: [EXTERNAL_IP],
  },
];

export const NODE_INFO: NodeInfo = { name: 'node-1', podCIDRs: [NODE.podCidr4, NODE.podCidr6] };

export { CONFIG } from '../support/fixtures.js';

/** Servers: each ClusterIP answers with its Service name; each external address with LB_PATH. */
const SERVERS: Array<[string, number, string]> = [
  ['10.96.0.10', 80, 'svc-a'],
  ['fd00::10', 80, 'svc-a6'],
  ['10.96.0.11', 8080, 'svc-b'],
  ['10.96.0.12', 80, 'svc-proxy'],
  ['10.96.0.13', 443, 'svc-ext'],
  [LB_V4, 80, LB_PATH],
  [LB_V4, 8080, LB_PATH],
  [LB_V6, 80, LB_PATH],
  [LB_PROXY, 80, LB_PATH],
  [EXTERNAL_IP, 443, LB_PATH],
];

export class Scenario {
  readonly network = new NodeNetwork();
  private servers: Array<{ address: string; port: number; server: NamedServer }> = [];

  async setUp(): Promise<void> {
    this.network.setUp();
    for (const [address] of SERVERS) this.network.bindAddress(address);
    for (const [address, port, name] of SERVERS) {
      this.servers.push({ address, port, server: await NamedServer.start(address, port, name) });
    }
  }

  /** Stops the server on address:port (a Service whose endpoints are gone), until startServer. */
  async stopServer(address: string, port: number): Promise<void> {
    const i = this.servers.findIndex((s) => s.address === address && s.port === port);
    if (i < 0) throw new Error(`no server on ${address}:${port}`);
    await this.servers.splice(i, 1)[0]!.server.stop();
  }

  /** Starts the scenario's server on address:port again. */
  async startServer(address: string, port: number): Promise<void> {
    const [, , name] = SERVERS.find(([a, p]) => a === address && p === port)!;
    this.servers.push({ address, port, server: await NamedServer.start(address, port, name) });
  }

  async tearDown(): Promise<void> {
    for (const s of this.servers.splice(0)) await s.server.stop();
    this.network.tearDown();
  }
}

/** A Service of the scenario as the API server serves it. */
export function wireService(s: ServiceInfo): Record<string, unknown> {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: s.namespace, name: s.name, creationTimestamp: s.creationTimestamp },
    spec: {
      type: s.type,
      clusterIP: s.clusterIP,
      clusterIPs: s.clusterIPs ?? [s.clusterIP],
      externalIPs: s.externalIPs,
      externalTrafficPolicy: s.externalTrafficPolicy,
      ports: s.ports,
    },
    status: { loadBalancer: { ingress: s.ingress ?? [] } },
  };
}

/** The scenario's Node and Services, stored in the API stand-in as the wire carries them. */
export function applyScenario(api: { apply(obj: Record<string, unknown>): unknown }): void {
  api.apply({
    apiVersion: 'v1',
    kind: 'Node',
    metadata: { name: 'node-1' },
    spec: { podCIDR: NODE.podCidr4, podCIDRs: [NODE.podCidr4, NODE.podCidr6] },
  });
  for (const s of SERVICES) api.apply(wireService(s));
}

/**
 * The end of a file that ran the real CLI: its processes stopped as a kubelet stops them
 * (SIGTERM), every object of ours removed (--cleanup), the API stand-in stopped, then the
 * scenario and the work directory gone, whatever failed before.
 */
export async function tearDownCliRun(
  children: ReadonlyArray<ChildProcess | undefined>,
  api: { stop(): Promise<void> } | undefined,
  scenario: Scenario,
  dir: string,
): Promise<void> {
  for (const child of children) {
    if (child && child.exitCode === null) {
      child.kill('SIGTERM');
      await once(child, 'exit');
    }
  }
  try {
    sh(process.execPath, shippedArgs(['--cleanup']));
    await api?.stop();
  } finally {
    await scenario.tearDown();
    await rm(dir, { recursive: true, force: true });
  }
}
