// Objects another backend left are removed after the first sync, and when the kernel refuses,
// again with back-off until they are gone; meanwhile /readyz warns and
// ipvs_node_controller_leftovers_pending is 1. The refusal is the kernel's own: an earlier run
// with the iptables backend (iptables-nft) left its chains, and another agent's verdict map still
// jumps to one of them, so deleting the chain fails with EBUSY until that agent drops its map.
// The controller runs the nft backend, against the API stand-in.

import { expect } from 'chai';
import { pino } from 'pino';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import { hasIptablesObjects } from '../../src/backends/iptables/nat-view.js';
import { BACKENDS, cleanupAll, removeLeftovers, type BackendRegistry } from '../../src/backends/registry.js';
import { composeReconciler } from '../../src/cli/compose.js';
import { ApiReachability, judgeReadiness } from '../../src/health/health.js';
import { ControllerMetrics } from '../../src/metrics/controller-metrics.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import { Reconciler } from '../../src/reconciler/reconciler.js';
import { assertIsolatedNetns, probe, sh } from '../../testbed/node-network.js';
import { ControllerOnStandIn } from '../support/controller-on-stand-in.js';
import { wireLbService } from '../support/wire-objects.js';
import { eventually } from '../support/eventually.js';
import { CONFIG, LB_V4, NODE_INFO, SERVICES, Scenario } from './scenario.js';

// These tests create no eBPF objects: the node's bpffs is not theirs to clean.
const REGISTRY: BackendRegistry = { ...BACKENDS, ebpf: { ...BACKENDS.ebpf, leftovers: () => [] } };
const OTHER_AGENT_MAP = ['ip', 'nat', 'other-agent'];

async function pendingMetric(metrics: ControllerMetrics): Promise<number | undefined> {
  const metric = await metrics.registry.getSingleMetric('ipvs_node_controller_leftovers_pending')?.get();
  return metric?.values[0]?.value;
}

describe('leftovers of another backend the kernel refuses to remove', function () {
  this.timeout(120_000);
  const scenario = new Scenario();

  before(async () => {
    assertIsolatedNetns();
    await scenario.setUp();
  });

  after(async () => {
    try {
      sh('nft', ['delete', 'map', ...OTHER_AGENT_MAP]);
    } catch {
      // gone already
    }
    try {
      await cleanupAll({}, REGISTRY);
    } finally {
      await scenario.tearDown();
    }
  });

  it('are removed by a later attempt once the kernel allows it; /readyz and the metric say so meanwhile', async () => {
    // An earlier run with the iptables backend (iptables-nft) left its chains and jumps.
    const earlier = new Reconciler(new IptablesDriver('nft', { jumpCheckIntervalMs: 0 }));
    await earlier.sync(buildDesiredState(SERVICES, NODE_INFO, CONFIG), { full: true });
    await earlier.close();
    // Another agent's verdict map jumps to our chain: the kernel refuses to delete a chain in use.
    sh('nft', ['add', 'map', ...OTHER_AGENT_MAP, '{ type ipv4_addr : verdict; }']);
    sh('nft', ['add', 'element', ...OTHER_AGENT_MAP, '{ 192.0.2.99 : jump IPVS_PREROUTING }']);

    const selected = await BACKENDS.nft.create({});
    const metrics = new ControllerMetrics({ defaultMetrics: false });
    // As the composition root builds it, the conntrack clean-up subscribed and counted.
    const reconciler = composeReconciler(selected.driver, {
      logger: pino({ enabled: false }),
      onConntrackCleanup: (report) => metrics.onConntrackCleanup(report),
    });
    let running: ControllerOnStandIn | undefined;
    try {
      running = await ControllerOnStandIn.start(reconciler, [wireLbService('svc-a', '10.96.0.10', LB_V4)], {
        observer: metrics,
        removeLeftovers: async () => {
          await removeLeftovers(selected.description, {}, REGISTRY);
        },
        leftoverRetryMs: { initial: 200, max: 1_000 },
      });
      const status = running.controller.status;
      const readiness = () =>
        judgeReadiness({
          status,
          api: new ApiReachability(),
          syncPeriodMs: 60_000,
          startedAt: Date.now(),
          now: Date.now(),
        });

      // The first attempt and the next ones fail: the chain is in use.
      await eventually('three failed attempts', () => (status.leftovers?.attempts ?? 0) >= 3);
      expect(status.leftovers!.error).to.match(/Device or resource busy/);
      expect(await hasIptablesObjects('nft'), 'our iptables-nft chains are still there').to.equal(true);
      expect(await pendingMetric(metrics)).to.equal(1);
      const meanwhile = readiness();
      expect(meanwhile.ok).to.equal(true);
      expect(meanwhile.warnings.join('\n')).to.match(/^leftovers of another backend could not be removed .*busy/m);
      expect(await probe(scenario.network.pod.ns, 'tcp', LB_V4, 80)).to.equal('svc-a');

      // The other agent drops its map: the next attempt removes the chains.
      sh('nft', ['delete', 'map', ...OTHER_AGENT_MAP]);
      await eventually('the leftovers removed', () => status.leftovers === undefined);
      expect(await hasIptablesObjects('nft')).to.equal(false);
      expect(await pendingMetric(metrics)).to.equal(0);
      expect(readiness().warnings.filter((w) => w.includes('leftovers'))).to.deep.equal([]);
      // The nft backend translates on its own.
      expect(await probe(scenario.network.pod.ns, 'tcp', LB_V4, 80)).to.equal('svc-a');
      expect(await probe(undefined, 'tcp', LB_V4, 80)).to.equal('svc-a');
    } finally {
      await running?.stop();
      await reconciler.cleanup();
      await reconciler.close();
    }
  });
});
