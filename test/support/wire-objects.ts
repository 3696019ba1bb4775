// Nodes and Services as the API server serves them (the wire's JSON, not the model's ServiceInfo):
// what the tests store in the API stand-in or feed the controller.

type Wire = Record<string, unknown>;

/**
 * A Node named `name` (node-1 by default) with `podCIDRs`, the first of them also its podCIDR;
 * `status`, when given, is its status (addresses, conditions).
 */
export function wireNode(podCIDRs: readonly string[], over: { name?: string; status?: Wire } = {}): Wire {
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: { name: over.name ?? 'node-1' },
    spec: { podCIDR: podCIDRs[0], podCIDRs: [...podCIDRs] },
    ...(over.status ? { status: over.status } : {}),
  };
}

export interface WireLbOptions {
  /** `default` unless given. */
  namespace?: string;
  /** More metadata: uid, creationTimestamp, labels. */
  metadata?: Wire;
  /** 80 and TCP unless given; the port has a name only when `portName` is given. */
  port?: number;
  protocol?: 'TCP' | 'UDP';
  portName?: string;
  /** [clusterIp] unless given. */
  clusterIPs?: readonly string[];
  /** More of the spec: externalTrafficPolicy, ipFamilies. */
  spec?: Wire;
}

/**
 * A LoadBalancer Service with one port: `ingress` an address (the one ingress IP) or the whole
 * list of its ingress points.
 */
export function wireLbService(
  name: string,
  clusterIp: string,
  ingress: string | ReadonlyArray<{ ip: string; ipMode?: string }>,
  options: WireLbOptions = {},
): Wire {
  const port = {
    ...(options.portName === undefined ? {} : { name: options.portName }),
    port: options.port ?? 80,
    protocol: options.protocol ?? 'TCP',
  };
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace: options.namespace ?? 'default', ...options.metadata },
    spec: {
      type: 'LoadBalancer',
      clusterIP: clusterIp,
      clusterIPs: [...(options.clusterIPs ?? [clusterIp])],
      ports: [port],
      ...options.spec,
    },
    status: { loadBalancer: { ingress: typeof ingress === 'string' ? [{ ip: ingress }] : [...ingress] } },
  };
}
