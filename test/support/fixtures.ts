// Fixtures shared by the tests: the model configuration of a default kube-proxy node, and a
// seeded random generator.

import { writeFileSync } from 'node:fs';
import { DesiredStateModel } from '../../src/model/desired-state.js';
import type { DesiredState, Entry, ModelConfig, NodeInfo, ServiceInfo } from '../../src/model/types.js';

/** kube-proxy's defaults: local pods by the node's podCIDRs, masquerade bit 14, every Service. */
export const CONFIG: Readonly<ModelConfig> = Object.freeze({
  detectLocalMode: 'NodeCIDR',
  clusterCidrs: [],
  masqueradeBit: 14,
  localTrafficPolicyOnly: false,
});

/** LoadBalancer Service number `i`: ClusterIP 10.96.0.i, LoadBalancer IP 192.0.2.i, TCP port 80; `over` replaces fields. */
export function lbService(i: number, over: Partial<ServiceInfo> = {}): ServiceInfo {
  return {
    namespace: 'default',
    name: `svc-${i}`,
    type: 'LoadBalancer',
    creationTimestamp: '2024-01-01T00:00:00Z',
    clusterIP: `10.96.0.${i}`,
    ports: [{ port: 80, protocol: 'TCP' }],
    ingress: [{ ip: `192.0.2.${i}` }],
    ...over,
  };
}

/** The IPv4 entry of default/web: 192.0.2.10 TCP port 80 to the ClusterIP 10.96.0.10; `over` replaces fields. */
export function webEntry(over: Partial<Entry> = {}): Entry {
  return {
    family: 'ipv4',
    externalIp: '192.0.2.10',
    protocol: 'TCP',
    port: 80,
    clusterIp: '10.96.0.10',
    service: 'default/web',
    ...over,
  };
}

/** IPv6 entries, one a row of [externalIp, protocol, port, clusterIp, sourceRanges]: row i of Service v6/svc-i. */
export function ipv6Entries(
  rows: ReadonlyArray<readonly [string, Entry['protocol'], number, string, (readonly string[] | undefined)?]>,
): Entry[] {
  return rows.map(([externalIp, protocol, port, clusterIp, sourceRanges], i) => ({
    family: 'ipv6',
    externalIp,
    protocol,
    port,
    clusterIp,
    service: `v6/svc-${i}`,
    ...(sourceRanges ? { sourceRanges } : {}),
  }));
}

/**
 * Filler Service number `i` (0 to 65,535) beside a test's own: filler/svc-i, ClusterIP
 * 10.97.x.y of `i + clusterShift`, LoadBalancer IP 198.18.x.y of `i`, TCP port 443.
 */
export function fillerService(i: number, clusterShift = 0): ServiceInfo {
  const c = i + clusterShift;
  return {
    namespace: 'filler',
    name: `svc-${i}`,
    type: 'LoadBalancer',
    creationTimestamp: '2024-02-01T00:00:00Z',
    clusterIP: `10.97.${(c >> 8) & 255}.${c & 255}`,
    ports: [{ port: 443, protocol: 'TCP' }],
    ingress: [{ ip: `198.18.${(i >> 8) & 255}.${i & 255}` }],
  };
}

/**
 * A seeded generator of numbers in [0, 1), so that a failure can be replayed with its seed. A
 * linear congruential generator: the randomised tests were tuned to its sequences.
 */
export function seededRandom(seed: number): () => number {
  let state = seed;
  return () => {
    state = (state * 1103515245 + 12345) % 2147483648;
    return state / 2147483648;
  };
}

/** The nine watch lines that are valid JSON but no watch event (each once ended the process). */
/**
 * Services for random churn (churnServices): numbered, in three namespaces, mostly TCP, with
 * LoadBalancer IPs from a small pool so that Services collide and take keys over from each
 * other. `clusterV4` is the first two octets of the ClusterIPs, `clusterV6` and `ingressV6` the
 * prefixes (ending in `::`) of the IPv6 ClusterIPs and LoadBalancer IPs.
 */
export function churnServiceMaker(
  rnd: () => number,
  addresses: { clusterV4: string; clusterV6: string; ingressV6: string },
): () => ServiceInfo {
  let serial = 0;
  return () => {
    const i = serial++;
    const v6 = rnd() < 0.3;
    return {
      namespace: `ns-${i % 3}`,
      name: `svc-${i}`,
      creationTimestamp: `2024-01-0${1 + Math.floor(rnd() * 5)}T00:00:00Z`,
      type: 'LoadBalancer',
      clusterIPs: [`${addresses.clusterV4}.${i >> 8}.${i & 255}`, `${addresses.clusterV6}${i.toString(16)}`],
      ports: [{ port: 80 + Math.floor(rnd() * 3), protocol: rnd() < 0.8 ? 'TCP' : 'UDP' }],
      ingress: [
        {
          ip: v6
            ? `${addresses.ingressV6}${Math.floor(rnd() * 60).toString(16)}`
            : `198.18.0.${Math.floor(rnd() * 150)}`,
        },
      ],
    };
  };
}

/**
 * One step of random churn in a Service cache (after a sync of step `step`): one to four
 * replacements, copies with the same content, deletions or additions, and now and then the
 * whole order reversed (a cache's order is not a promise). Returns a new array.
 */
export function churnServices<T extends object>(
  services: readonly T[],
  step: number,
  rnd: () => number,
  make: () => T,
): T[] {
  const out = [...services];
  for (let k = 1 + Math.floor(rnd() * 4); k > 0; k--) {
    const at = Math.floor(rnd() * out.length);
    const r = rnd();
    if (r < 0.5) out[at] = make();
    else if (r < 0.7)
      out[at] = { ...out[at]! }; // the same content as a new object
    else if (r < 0.85) out.splice(at, 1);
    else out.push(make());
  }
  if (step % 20 === 19) out.reverse();
  return out;
}

/**
 * 60 syncs through random churn (churnServices) of 200 Services (churnServiceMaker with
 * `addresses`) from `seed`, the model's state on `node` each time, the first sync full:
 * `check` after each. Returns how many of the syncs were partial.
 */
export async function churnedSyncs(
  sync: (desired: DesiredState, options: { full: boolean }) => Promise<{ mode: string }>,
  node: NodeInfo,
  seed: number,
  addresses: Parameters<typeof churnServiceMaker>[1],
  check: (desired: DesiredState, step: number) => Promise<void>,
): Promise<number> {
  const rnd = seededRandom(seed);
  const makeService = churnServiceMaker(rnd, addresses);
  const model = new DesiredStateModel(CONFIG);
  let services = Array.from({ length: 200 }, makeService);
  let partial = 0;
  for (let step = 0; step < 60; step++) {
    const desired = model.update(services, node);
    const result = await sync(desired, { full: step === 0 });
    if (result.mode === 'partial') partial++;
    await check(desired, step);
    services = churnServices(services, step, rnd, makeService);
  }
  return partial;
}

export const MALFORMED_WATCH_LINES: readonly string[] = [
  '42',
  '"a string"',
  '[1, 2]',
  'true',
  '{}',
  '{"type": 42}',
  '{"type":"BOOKMARK","object":null}',
  '{"type":"ERROR","object":null}',
  '{"type":"ERROR"}',
];

/** A kubeconfig whose API server refuses every connection at once (nothing listens on port 1). */
export function writeUnreachableKubeconfig(path: string): void {
  writeFileSync(
    path,
    [
      'apiVersion: v1',
      'kind: Config',
      'clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]',
      'users: [{name: u, user: {token: t}}]',
      'contexts: [{name: x, context: {cluster: c, user: u}}]',
      'current-context: x',
    ].join('\n'),
  );
}
