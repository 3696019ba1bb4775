// The conntrack clean-up's metrics (src/conntrack/conntrack-cleaner.ts): entries deleted one by
// one, tuples the kernel deleted by a filter, failures, and tuples truncated by one in-process
// deletion, each from zero.

import { Counter, type Registry } from 'prom-client';
import type { ConntrackCleanupReport } from '../conntrack/conntrack-cleaner.js';
import { FAMILIES } from '../model/types.js';

/** Registers the counters in `registry`; `onCleanup` adds a clean-up's report to them. */
export function conntrackMetrics(registry: Registry): { onCleanup(report: ConntrackCleanupReport): void } {
  const registers = [registry];
  const deleted = new Counter({
    name: 'ipvs_node_controller_conntrack_entries_deleted_total',
    help: 'UDP/SCTP conntrack entries deleted because the translation of their destination changed, appeared or went.',
    registers,
  });
  const flushed = new Counter({
    name: 'ipvs_node_controller_conntrack_flushed_tuples_total',
    help:
      'Stale UDP/SCTP tuples whose conntrack entries the kernel deleted by a filter (Linux 6.12 and later, IPv4); ' +
      'how many entries it deleted is not known, so they are not in conntrack_entries_deleted_total.',
    registers,
  });
  const errors = new Counter({
    name: 'ipvs_node_controller_conntrack_cleanup_errors_total',
    help: 'Failed deletions of stale conntrack entries; those flows keep their old translation until idle.',
    registers,
  });
  const truncated = new Counter({
    name: 'ipvs_node_controller_conntrack_truncated_total',
    help:
      'Stale UDP/SCTP tuples with more conntrack entries than their share of one in-process deletion; ' +
      'the rest were deleted by further calls and the conntrack command (its failures count as clean-up errors).',
    labelNames: ['family'],
    registers,
  });
  for (const family of FAMILIES) truncated.inc({ family }, 0);
  return {
    onCleanup(report) {
      deleted.inc(report.deleted);
      flushed.inc(report.flushed ?? 0);
      errors.inc(report.failures);
      for (const family of FAMILIES) {
        const n = report.truncated?.[family];
        if (n) truncated.inc({ family }, n);
      }
    },
  };
}
