// loadBalancerSourceRanges (design/semantics.md, "Source ranges"), on every backend, with the
// controller as shipped and real packets. kube-proxy drops traffic to a LoadBalancer IP from
// sources outside the ranges, pods and the node included; the controller translates only the
// sources kube-proxy lets through and leaves the others to kube-proxy's filter (here: the server
// bound on the LoadBalancer IP itself answers them). The node's own process connects from the
// LoadBalancer IP (bound on kube-ipvs0), which kube-proxy lets through only when the node IP is
// inside a range (allowFromNode). The eBPF backend cannot filter sources and translates neither.

import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import { BACKEND_VARIANTS, variantNodeHooks, type BackendVariant } from '../support/variant-node.js';
import { TenantNode, UNTRANSLATED, lbService } from './tenant-node.js';

const CLUSTER_IP = '10.96.0.40';
const LB_IP = '198.51.100.40';
/** A Service without ranges: translated from every source, on every backend. */
const OPEN_CLUSTER_IP = '10.96.0.41';
const OPEN_LB_IP = '198.51.100.41';
/** The pod's address and the node's InternalIP in testbed/node-network.ts and tenant-node.ts. */
const POD_IP = '10.244.1.2';
const NODE_RANGE = '192.168.50.0/24';
/** Waits are longer in a slow guest (the VM layer's factor): a process costs seconds there. */
const SLOW = Number(process.env.IPVS_NODE_CONTROLLER_TEST_TIMEOUT_FACTOR ?? '1');
const WAIT = 20_000 * SLOW;

function ranged(ranges: string[]) {
  const svc = lbService('filtered', CLUSTER_IP, LB_IP);
  return { ...svc, spec: { ...svc.spec, loadBalancerSourceRanges: ranges } };
}

/** Every backend, nft through each of its executors. */
const VARIANTS: Array<BackendVariant & { args?: string[]; executor?: 'addon' | 'cli' }> = [
  { name: 'nft (addon)', backend: 'nft', args: ['--nft-executor=addon'], executor: 'addon' },
  { name: 'nft (CLI)', backend: 'nft', args: ['--nft-executor=cli'], executor: 'cli' },
  ...BACKEND_VARIANTS.filter((v) => v.backend !== 'nft'),
];

for (const variant of VARIANTS) {
  describe(`loadBalancerSourceRanges, ${variant.name}`, function () {
    this.timeout(180_000);
    const node = new TenantNode(variant.backend);
    /**
     * Whether the backend filters sources here: eBPF never; nft where the kernel takes the objects
     * that filter them, as its probe reports.
     */
    let filters = variant.backend !== 'ebpf';
    /** What a source inside the ranges reaches. */
    let inside = filters ? 'filtered' : UNTRANSLATED;

    variantNodeHooks(variant, node);

    before(async () => {
      await node.serve(CLUSTER_IP, 80, 'filtered');
      await node.serve(LB_IP, 80, UNTRANSLATED);
      await node.serve(OPEN_CLUSTER_IP, 80, 'open');
      await node.serve(OPEN_LB_IP, 80, UNTRANSLATED);
      node.api.apply(lbService('open', OPEN_CLUSTER_IP, OPEN_LB_IP));
      node.api.apply(ranged([`${POD_IP}/32`]));
      // Full syncs (each verifies what the kernel holds) every 2 s.
      node.startController([...(variant.args ?? []), '--sync-period=2s']);
      await node.waitForOutput(/"msg":"Synced"/, 30_000 * SLOW);
      if (variant.backend === 'nft') {
        filters = !node.output.includes('source ranges not filtered');
        inside = filters ? 'filtered' : UNTRANSLATED;
      }
      await node.eventually(OPEN_LB_IP, 80, 'open', WAIT, { from: 'pod' });
      await node.eventually(OPEN_LB_IP, 80, 'open', WAIT, { from: 'node' });
    });

    if (variant.executor) {
      it(`programs nftables through the ${variant.executor}`, () => {
        expect(node.output).to.include(`nftables via ${variant.executor}`);
      });
    }

    it("translates a pod inside the ranges and leaves the node outside them to kube-proxy's filter", async () => {
      await node.eventually(LB_IP, 80, inside, WAIT, { from: 'pod' });
      // The node, outside the ranges: only the server on the LoadBalancer IP answers it.
      await node.eventually(LB_IP, 80, UNTRANSLATED, WAIT, { from: 'node' });
      await node.eventually(OPEN_LB_IP, 80, 'open', WAIT, { from: 'node' });
    });

    it('follows a change of ranges: the node inside (allowFromNode), the pod outside', async () => {
      node.api.apply(ranged([NODE_RANGE]));
      await node.eventually(LB_IP, 80, inside, WAIT, { from: 'node' });
      await node.eventually(LB_IP, 80, UNTRANSLATED, WAIT, { from: 'pod' });
      // A Service without ranges is still translated (a probe may time out while a slow guest syncs).
      await node.eventually(OPEN_LB_IP, 80, 'open', WAIT, { from: 'pod' });
    });

    it('translates every source again when the ranges are removed', async () => {
      node.api.apply(lbService('filtered', CLUSTER_IP, LB_IP));
      await node.eventually(LB_IP, 80, 'filtered', WAIT, { from: 'pod' });
      await node.eventually(LB_IP, 80, 'filtered', WAIT, { from: 'node' });
      // And back to a range: the sets written again after they were removed.
      node.api.apply(ranged([`${POD_IP}/32`]));
      await node.eventually(LB_IP, 80, UNTRANSLATED, WAIT, { from: 'node' });
      await node.eventually(LB_IP, 80, inside, WAIT, { from: 'pod' });
    });

    // eBPF filters no source (its ranged addresses are skipped): nothing of this applies there.
    const ifFiltering = variant.backend === 'ebpf' ? () => undefined : it;

    ifFiltering(
      'after a restart whose first write has no ranged entry, a ranged Service that comes later is filtered',
      async function () {
        // A kernel that refuses the source-range lookup (Debian's 6.12): the ranged address is skipped,
        // as the test below checks.
        if (!filters) this.skip();
        // The last run leaves the source-range sets and the gate (SIGTERM leaves the rules).
        await node.eventually(LB_IP, 80, inside, WAIT, { from: 'pod' });
        await node.stopController();
        expect(node.api.remove('Service', 'default', 'filtered')).to.equal(true);
        node.startController([...(variant.args ?? []), '--sync-period=2s']);
        await node.eventually(LB_IP, 80, UNTRANSLATED, WAIT, { from: 'pod' });
        await node.eventually(OPEN_LB_IP, 80, 'open', WAIT, { from: 'pod' });
        // The ranged Service comes back with a range that holds neither the pod nor the node.
        node.api.apply(ranged(['203.0.113.0/24']));
        const programmed = async () =>
          (await node.metrics()).value('ipvs_node_controller_programmed_entries', {
            family: 'ipv4',
            backend: variant.backend,
          });
        for (let i = 0; i < 300 * SLOW && (await programmed()) !== 2; i++) await new Promise((r) => setTimeout(r, 100));
        expect(await programmed(), 'the ranged entry is programmed').to.equal(2);
        for (let i = 0; i < 3; i++) {
          expect(await node.probe(LB_IP, 80, 'pod'), 'the pod, outside the ranges').to.equal(UNTRANSLATED);
        }
        expect(await node.probe(LB_IP, 80, 'node'), 'the node, outside the ranges').to.equal(UNTRANSLATED);
        node.api.apply(ranged([`${POD_IP}/32`]));
        await node.eventually(LB_IP, 80, inside, WAIT, { from: 'pod' });
      },
    );

    ifFiltering(
      "a range that holds the LoadBalancer IP but not the node IP: the node's own connection (from that address) is left to kube-proxy's filter",
      async function () {
        if (!filters) this.skip();
        // 198.51.100.0/24 holds the LoadBalancer IP; with the node IP in a range too (allowFromNode)
        // the node's connection, whose source is the LoadBalancer IP, is translated.
        node.api.apply(ranged(['198.51.100.0/24', NODE_RANGE]));
        await node.eventually(LB_IP, 80, inside, WAIT, { from: 'node' });
        // Without it, that address is refused as a source though a range holds it; the pod is in a range.
        node.api.apply(ranged(['198.51.100.0/24', `${POD_IP}/32`]));
        await node.eventually(LB_IP, 80, UNTRANSLATED, WAIT, { from: 'node' });
        await node.eventually(LB_IP, 80, inside, WAIT, { from: 'pod' });
        for (let i = 0; i < 3; i++) {
          expect(await node.probe(LB_IP, 80, 'node'), 'the node, from the LoadBalancer IP').to.equal(UNTRANSLATED);
        }
      },
    );

    ifFiltering('edits of one range under traffic lose no connection of a source that stays inside', async function () {
      if (!filters) this.skip();
      /** What the backend programmed, as its tools list it. */
      const programmed = () =>
        variant.backend === 'nft'
          ? execFileSync('nft', ['list', 'ruleset']).toString()
          : execFileSync(`iptables-${variant.legacy ? 'legacy' : 'nft'}-save`, ['-c', '-t', 'nat']).toString();
      const written = async (range: string) => {
        for (let i = 0; i < 200 * SLOW && !programmed().includes(range); i++) await sleep(50);
        expect(programmed(), `${range} programmed`).to.include(range);
      };
      node.api.apply(ranged([NODE_RANGE, '203.0.113.0/24']));
      await written('203.0.113.0/24');
      await node.eventually(LB_IP, 80, inside, WAIT, { from: 'node' });
      const loop = await node.connectLoop(LB_IP, 80, inside, 20);
      for (let i = 1; i <= 10; i++) {
        node.api.apply(ranged([NODE_RANGE, `203.0.${113 + i}.0/24`]));
        await written(`203.0.${113 + i}.0/24`);
      }
      const report = await loop.stop();
      expect(report.failed, JSON.stringify(report.failures.slice(0, 3))).to.equal(0);
      expect(report.answered).to.be.above(0);
      if (variant.backend !== 'iptables') return;
      // iptables: an edit rewrites the Service's source-range chains only; the entry's bucket rule
      // is not written again, so its packet counter goes on from where it was.
      const bucketRule = () => {
        const line = programmed()
          .split('\n')
          .find((l) => l.includes(`-A IPVS_OUTPUT_40 -d ${LB_IP}/32 `) && l.includes('--dport 80 '));
        expect(line, 'the bucket rule of the LoadBalancer IP').to.not.equal(undefined);
        return Number(/^\[(\d+):/.exec(line!)![1]);
      };
      const counted = bucketRule();
      expect(counted).to.be.above(0);
      node.api.apply(ranged([NODE_RANGE, '203.0.200.0/24']));
      await written('203.0.200.0/24');
      expect(bucketRule(), 'the bucket rule kept its counter').to.equal(counted);
      expect(programmed()).to.not.include('203.0.123.0/24');
    });

    it('verifies what it programmed without finding drift, or says why the ranged address is left untranslated', async () => {
      if (!filters) {
        await node.waitForOutput(/"reason":"sourceRangesUnsupported"/, 30_000 * SLOW);
        const metrics = await node.metrics();
        expect(metrics.value('ipvs_node_controller_skipped_addresses', { reason: 'sourceRangesUnsupported' })).to.equal(
          1,
        );
        if (variant.backend === 'nft') expect(node.output).to.include('refuses the objects that filter them');
        return;
      }
      const syncs = async () => (await node.metrics()).sum('ipvs_node_controller_syncs_total');
      const before = await syncs();
      // Two periodic full syncs, each reading the tables back.
      for (let i = 0; i < 300 * SLOW && (await syncs()) < before + 2; i++) {
        await new Promise((r) => setTimeout(r, 100));
      }
      expect(await syncs()).to.be.at.least(before + 2);
      expect(node.output).not.to.match(/"repairedElements":[1-9]/);
      const metrics = await node.metrics();
      expect(metrics.sum('ipvs_node_controller_skipped_addresses', { reason: 'sourceRangesUnsupported' })).to.equal(0);
    });
  });
}
