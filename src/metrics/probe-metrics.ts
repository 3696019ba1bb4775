// The continuous probe's metrics, per probed Service: at most --probe-max-services of each. A
// Service no longer probed loses its series at the next round.

import { Counter, Gauge, type Registry } from 'prom-client';
import type { ProbeObserver, ProbeResult } from '../probe/prober.js';

export function registerProbeMetrics(registry: Registry): ProbeObserver {
  const success = new Gauge({
    name: 'ipvs_node_controller_probe_success',
    help: "1 when every probed path of the Service answered in the last round from this node, 0 when one did not (or none could be tried); origin: 'flag' (--probe-service) or 'annotation' (ipvs-node-controller/probe)",
    labelNames: ['service', 'origin'],
    registers: [registry],
  });
  const duration = new Gauge({
    name: 'ipvs_node_controller_probe_duration_seconds',
    help: "The slowest probed path's time in the last round: the TCP connect, or the UDP datagram's answer (or --probe-timeout)",
    labelNames: ['service'],
    registers: [registry],
  });
  const tries = new Counter({
    name: 'ipvs_node_controller_probes_total',
    help: 'Paths probed, by Service and outcome (answered, refused, timed out, unreachable, failed)',
    labelNames: ['service', 'outcome'],
    registers: [registry],
  });
  let shown = new Map<string, string>();
  let outcomes = new Map<string, Set<string>>();
  return {
    onProbeRound(results: readonly ProbeResult[]) {
      const now = new Map(results.map((r) => [r.service, r.origin]));
      for (const [service, origin] of shown) {
        if (now.get(service) === origin) continue;
        success.remove({ service, origin });
        if (now.has(service)) continue;
        duration.remove({ service });
        for (const outcome of outcomes.get(service) ?? []) tries.remove({ service, outcome });
        outcomes.delete(service);
      }
      for (const r of results) {
        success.set({ service: r.service, origin: r.origin }, r.ok ? 1 : 0);
        duration.set({ service: r.service }, r.ms / 1000);
        let seen = outcomes.get(r.service);
        if (!seen) outcomes.set(r.service, (seen = new Set()));
        for (const p of r.paths) {
          tries.inc({ service: r.service, outcome: p.outcome });
          seen.add(p.outcome);
        }
      }
      shown = now;
      outcomes = new Map([...outcomes].filter(([s]) => now.has(s)));
    },
  };
}
