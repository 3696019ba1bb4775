// translated_connections_total{family,source}: the backend's kernel counters of the
// connections our rules translated, read when scraped.

import { Counter, type Registry } from 'prom-client';
import type { TranslatedConnections } from '../driver/driver.js';

/** Scrapes within this long of a read share it. */
const READ_EVERY_MS = 1_000;

/**
 * Registers the counter in `registry`, read through `read` when scraped, at most once a
 * second (scrapes meanwhile share that read). A family or source the read leaves out, or a read
 * that fails, keeps its last value. The kernel's counts start again at 0 when a table is made
 * again (--cleanup, a replaced table): a counter reset, as rate() takes it.
 */
export function registerTranslationCounter(
  registry: Registry,
  read: () => Promise<TranslatedConnections[]>,
  clock: () => number = Date.now,
): void {
  const last = new Map<string, TranslatedConnections>();
  let lastRead: { at: number; pending: Promise<void> } | undefined;
  const refresh = async () => {
    try {
      for (const row of await read()) last.set(`${row.family} ${row.source}`, row);
    } catch {
      // Kept as last read.
    }
  };
  new Counter({
    name: 'ipvs_node_controller_translated_connections_total',
    help:
      'Connections translated to the ClusterIP, by family and by source: pods (local pods) or node ' +
      "(the node's processes and host-network pods). Read from the backend's kernel counters when scraped " +
      "(nft: per new connection; iptables: per new connection, from the DNAT rules' packet counters, " +
      'kept across the rules its own writes replace; ebpf: per connect(), and per datagram of an unconnected UDP socket).',
    labelNames: ['family', 'source'],
    registers: [registry],
    async collect() {
      const now = clock();
      if (!lastRead || now - lastRead.at >= READ_EVERY_MS) lastRead = { at: now, pending: refresh() };
      await lastRead.pending;
      this.reset();
      for (const row of last.values()) this.inc({ family: row.family, source: row.source }, row.connections);
    },
  });
}
