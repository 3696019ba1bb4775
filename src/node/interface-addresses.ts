// The addresses of the node's own interfaces, which no Service may claim (semantics.md): the
// controller runs in the node's network namespace (hostNetwork), so its interfaces are the node's.

import { networkInterfaces } from 'node:os';
import { nodeScopedKind, parseIp } from '../model/ip.js';

/**
 * kube-proxy in IPVS mode binds every ClusterIP, external IP and LoadBalancer IP to this dummy
 * interface: its addresses are the Services', not the node's.
 */
export const IPVS_DUMMY_INTERFACE = 'kube-ipvs0';

/** How often InterfaceAddressWatch reads the interfaces again. */
export const INTERFACE_READ_INTERVAL_MS = 1000;

/**
 * The addresses on the node's interfaces but kube-ipvs0 that a Service could claim, sorted and
 * once each, as the kernel lists them now. Left out: what always means this node whatever the
 * node's addresses (loopback, link-local, ...), which the model skips anyway (nodeScopedKind), so
 * that a pod's veth, whose host side has only its own `fe80::` address, coming or going changes
 * nothing the model reads.
 */
export function interfaceAddresses(interfaces: ReturnType<typeof networkInterfaces> = networkInterfaces()): string[] {
  const out = new Set<string>();
  for (const [name, addresses] of Object.entries(interfaces)) {
    if (name === IPVS_DUMMY_INTERFACE) continue;
    for (const a of addresses ?? []) {
      const ip = parseIp(a.address.split('%')[0]!);
      if (ip && !nodeScopedKind(ip)) out.add(ip.address);
    }
  }
  return [...out].sort();
}

/**
 * The node's interface addresses, read once a second rather than at every sync: a read is one
 * getifaddrs() over every interface (a node with a hundred pods has a hundred veths), about
 * 0.1 ms on a bare machine, and a Service change should not pay it. A read that finds other
 * addresses calls `onChange`, so an address added to the node is known within a second even
 * when no Service changes (a sync asks the model again).
 */
export class InterfaceAddressWatch {
  private addresses: readonly string[];
  private key: string;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly read: () => string[] = interfaceAddresses,
    private readonly intervalMs = INTERFACE_READ_INTERVAL_MS,
  ) {
    this.addresses = read();
    this.key = this.addresses.join(' ');
  }

  /** The addresses of the last read. */
  current(): readonly string[] {
    return this.addresses;
  }

  /** Reads every interval until stop(); `onChange` after a read that found other addresses. */
  start(onChange: () => void): void {
    this.stop();
    this.timer = setInterval(() => {
      let next: string[];
      try {
        next = this.read();
      } catch {
        return; // the last read stays; the next tick tries again
      }
      const key = next.join(' ');
      if (key === this.key) return;
      this.addresses = next;
      this.key = key;
      onChange();
    }, this.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }
}
