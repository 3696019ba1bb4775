// The conntrack clean-up and the iptables renderer's rejections reach the metrics.

import { expect } from 'chai';
import { ControllerMetrics } from '../../src/metrics/controller-metrics.js';
import type { Rejection } from '../../src/driver/driver.js';

async function value(metrics: ControllerMetrics, name: string): Promise<number | undefined> {
  const line = (await metrics.exposition()).text.split('\n').find((l) => l.startsWith(`${name} `));
  return line === undefined ? undefined : Number(line.split(' ')[1]);
}

describe('conntrack and iptables rejection metrics', () => {
  it('counts deleted entries and failed deletions, from zero', async () => {
    const metrics = new ControllerMetrics({ defaultMetrics: false });
    expect(await value(metrics, 'ipvs_node_controller_conntrack_entries_deleted_total')).to.equal(0);
    metrics.onConntrackCleanup({ tuples: 3, deleted: 5, failures: 1, durationMs: 2 });
    metrics.onConntrackCleanup({ tuples: 1, deleted: 2, failures: 0, durationMs: 1 });
    expect(await value(metrics, 'ipvs_node_controller_conntrack_entries_deleted_total')).to.equal(7);
    expect(await value(metrics, 'ipvs_node_controller_conntrack_cleanup_errors_total')).to.equal(1);
  });

  it('counts tuples the kernel deleted by a filter apart from the entries deleted one by one, from zero', async () => {
    const metrics = new ControllerMetrics({ defaultMetrics: false });
    const name = 'ipvs_node_controller_conntrack_flushed_tuples_total';
    expect(await value(metrics, name)).to.equal(0);
    metrics.onConntrackCleanup({ tuples: 2, deleted: 0, flushed: 2, failures: 0, durationMs: 1 });
    metrics.onConntrackCleanup({ tuples: 1, deleted: 4, failures: 0, durationMs: 1 });
    expect(await value(metrics, name)).to.equal(2);
    expect(await value(metrics, 'ipvs_node_controller_conntrack_entries_deleted_total')).to.equal(4);
  });

  it('counts tuples truncated by one in-process deletion, per family, from zero', async () => {
    const metrics = new ControllerMetrics({ defaultMetrics: false });
    const name = 'ipvs_node_controller_conntrack_truncated_total';
    expect(await value(metrics, `${name}{family="ipv4"}`)).to.equal(0);
    expect(await value(metrics, `${name}{family="ipv6"}`)).to.equal(0);
    metrics.onConntrackCleanup({ tuples: 3, deleted: 5, failures: 0, durationMs: 2, truncated: { ipv4: 2 } });
    metrics.onConntrackCleanup({ tuples: 1, deleted: 2, failures: 0, durationMs: 1, truncated: { ipv4: 1, ipv6: 1 } });
    metrics.onConntrackCleanup({ tuples: 1, deleted: 2, failures: 0, durationMs: 1 });
    expect(await value(metrics, `${name}{family="ipv4"}`)).to.equal(3);
    expect(await value(metrics, `${name}{family="ipv6"}`)).to.equal(1);
  });

  it('shows how many entries the iptables backend left out in the last successful sync', async () => {
    const metrics = new ControllerMetrics({ defaultMetrics: false });
    const rejected: Rejection[] = [{ family: 'ipv4', item: 'pod bridge interface', reason: 'bad' }];
    const report = (r: Rejection[]) => ({
      backend: 'iptables',
      requested: 'full' as const,
      durationMs: 1,
      result: { mode: 'full' as const, entries: { ipv4: 1, ipv6: 0 }, rejected: r },
    });
    metrics.onSync(report(rejected));
    expect(await value(metrics, 'ipvs_node_controller_rejected_entries')).to.equal(1);
    metrics.onSync(report([]));
    expect(await value(metrics, 'ipvs_node_controller_rejected_entries')).to.equal(0);
  });
});
