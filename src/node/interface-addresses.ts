// The addresses of the node's own interfaces, which no Service may claim (semantics.md): the
// controller runs in the node's network namespace (hostNetwork), so its interfaces are the node's.

import { networkInterfaces } from 'node:os';

/**
 * kube-proxy in IPVS mode binds every ClusterIP, external IP and LoadBalancer IP to this dummy
 * interface: its addresses are the Services', not the node's.
 */
export const IPVS_DUMMY_INTERFACE = 'kube-ipvs0';

/** Every address on the node's interfaces but kube-ipvs0, as the kernel lists them now. */
export function interfaceAddresses(): string[] {
  const out: string[] = [];
  for (const [name, addresses] of Object.entries(networkInterfaces())) {
    if (name === IPVS_DUMMY_INTERFACE) continue;
    for (const a of addresses ?? []) out.push(a.address.split('%')[0]!);
  }
  return out;
}
