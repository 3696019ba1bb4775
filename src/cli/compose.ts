// The composition root's one assembly: the reconciler over the driver the registry chose, with
// its subscribers. The backends and the reconciler know nothing of each other (both import only
// the contract, src/driver/); here the two are put together, and the conntrack clean-up is
// subscribed where the driver's translations are NAT decisions conntrack keeps.

import type { Logger } from 'pino';
import { ConntrackCleaner, type ConntrackCleanupReport } from '../conntrack/conntrack-cleaner.js';
import { loadConntrackNetlink } from '../conntrack/conntrack-netlink.js';
import { ConntrackSubscriber, type ConntrackClient } from '../conntrack/conntrack-subscriber.js';
import type { Driver } from '../driver/driver.js';
import { Reconciler } from '../reconciler/reconciler.js';

export interface ReconcilerWiring {
  logger: Logger;
  /** Told of every conntrack clean-up (the metrics). */
  onConntrackCleanup?: (report: ConntrackCleanupReport) => void;
  /**
   * The conntrack client. Default: ctnetlink in the process (the conntrack addon), else the
   * conntrack command, where the driver's translations are conntrack's
   * (capabilities.conntrackMatters: not eBPF's, which translates sockets); null: none.
   */
  conntrack?: ConntrackClient | null;
}

/** The reconciler that programs through `driver`, its subscribers given. */
export function composeReconciler(driver: Driver, wiring: ReconcilerWiring): Reconciler {
  const conntrack =
    wiring.conntrack === undefined
      ? driver.capabilities.conntrackMatters
        ? new ConntrackCleaner({ logger: wiring.logger, netlink: loadConntrackNetlink().netlink })
        : undefined
      : (wiring.conntrack ?? undefined);
  return new Reconciler(driver, conntrack ? [new ConntrackSubscriber(conntrack, wiring.onConntrackCleanup)] : []);
}
