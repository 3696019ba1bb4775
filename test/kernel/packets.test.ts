// Every row of semantics.md that a packet can show, for every kernel backend: real packets
// from a pod namespace, the node namespace and an outside host.

import { Reconciler } from '../../src/reconciler/reconciler.js';
import { expect } from 'chai';
import { NftDriver } from '../../src/backends/nft/nft-driver.js';
import { NftCliExecutor } from '../../src/backends/nft/executor.js';
import { loadNftAddon } from '../../src/backends/nft/addon-executor.js';
import type { KeyLookup } from '../../src/backends/nft/render.js';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import type { IptablesVariant } from '../../src/backends/iptables/variant.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import type { DesiredState, ModelConfig, NodeInfo } from '../../src/model/types.js';
import { probe, readJsonCounters, sh } from '../../testbed/node-network.js';
import { CONFIG, EXTERNAL_IP, LB_PATH, LB_PROXY, LB_V4, LB_V6, NODE_INFO, SERVICES, Scenario } from './scenario.js';

export interface BackendUnderTest {
  name: string;
  make(): Reconciler;
  /** Removes our objects behind the controller's back (someone flushed the ruleset). */
  removeByHand(): void;
}

function addonBackend(lookup: 'auto' | KeyLookup = 'auto'): Reconciler {
  const load = loadNftAddon();
  if (!load.executor) throw new Error(`the nftables addon must be built for kernel tests: ${load.reason}`);
  return new Reconciler(new NftDriver(load.executor, { lookup }));
}

/** Someone flushed our IPv4 chain and deleted its jump behind the controller's back. */
function removeIptablesByHand(variant: IptablesVariant): void {
  sh(`iptables-${variant}`, ['-w', '-t', 'nat', '-D', 'PREROUTING', '-j', 'IPVS_PREROUTING']);
  sh(`iptables-${variant}`, ['-w', '-t', 'nat', '-F', 'IPVS_PREROUTING']);
}

export const BACKENDS: BackendUnderTest[] = [
  {
    name: 'nft (addon)',
    make: () => addonBackend(),
    removeByHand: () => sh('nft', ['delete', 'table', 'ip', 'ipvs-node-controller']),
  },
  {
    // The lookup of kernels that refuse a map looked up as a set, proven on every kernel.
    name: 'nft (addon, keys in a set)',
    make: () => addonBackend('set'),
    removeByHand: () => sh('nft', ['delete', 'table', 'ip', 'ipvs-node-controller']),
  },
  {
    name: 'nft (cli)',
    make: () => new Reconciler(new NftDriver(new NftCliExecutor())),
    removeByHand: () => sh('nft', ['delete', 'table', 'ip', 'ipvs-node-controller']),
  },
  ...(['legacy', 'nft'] as const).map((variant) => ({
    name: `iptables (${variant})`,
    make: () => new Reconciler(new IptablesDriver(variant)),
    removeByHand: () => removeIptablesByHand(variant),
  })),
];

/** The families and sources the translation counters count. */
const COUNTED = [
  ['ipv4', 'pods'],
  ['ipv4', 'node'],
  ['ipv6', 'pods'],
  ['ipv6', 'node'],
] as const;

/** The scenario's Services without svc-b (which shares svc-a's IPv4 address on port 8080). */
function withoutSvcB(): DesiredState {
  return buildDesiredState(
    SERVICES.filter((s) => s.name !== 'svc-b'),
    NODE_INFO,
    CONFIG,
  );
}

function desired(config: Partial<ModelConfig> = {}, node: NodeInfo | undefined = NODE_INFO): DesiredState {
  return buildDesiredState(SERVICES, node, { ...CONFIG, ...config });
}

/**
 * Counts the pod's packets to the ClusterIP (input: the node's own cross it too, over loopback), and
 * the marked ones, as kube-proxy's masquerade rule would see them.
 */
function installMarkObserver(): void {
  sh(
    'nft',
    ['-f', '-'],
    `table inet mark-observer {
      chain input { type filter hook input priority 0; policy accept;
        ip saddr 10.244.1.2 ip daddr 10.96.0.10 tcp dport 80 counter comment "translated-input"
        meta mark & 0x4000 == 0x4000 ip saddr 10.244.1.2 ip daddr 10.96.0.10 tcp dport 80 counter comment "marked-input"
      }
      chain output { type filter hook output priority 0; policy accept;
        meta mark & 0x4000 == 0x4000 ip daddr 10.96.0.10 tcp dport 80 counter comment "marked-output"
      }
    }\n`,
  );
}

for (const backendUnderTest of BACKENDS) {
  describe(`packets through the ${backendUnderTest.name} backend`, function () {
    const scenario = new Scenario();
    const pod = () => scenario.network.pod.ns;
    const outside = () => scenario.network.outside.ns;
    let backend: Reconciler | undefined;

    before(async () => {
      await scenario.setUp();
      backend = backendUnderTest.make();
      const probed = await backend!.driver.probe();
      expect(probed.ok, probed.detail).to.equal(true);
    });
    after(async () => {
      try {
        await backend?.cleanup();
        await backend?.close?.();
      } finally {
        await scenario.tearDown();
      }
    });

    it('leaves traffic alone before anything is programmed', async () => {
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal(LB_PATH);
      expect(await probe(undefined, 'tcp', LB_V4, 80)).to.equal(LB_PATH);
    });

    it('translates a pod connection to a LoadBalancer IP to the ClusterIP (prerouting)', async () => {
      await backend!.sync(desired(), { full: true });
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
      expect(await probe(pod(), 'udp', LB_V4, 80)).to.equal(`svc-a from ${LB_V4}`);
    });

    it('translates a host-network connection (output, source local)', async () => {
      expect(await probe(undefined, 'tcp', LB_V4, 80)).to.equal('svc-a');
      expect(await probe(undefined, 'udp', LB_V4, 80)).to.equal(`svc-a from ${LB_V4}`);
    });

    // A restart is another driver's first write, whole, over the kernel's rules. nft keeps its
    // named counters across it, so the new driver's total goes on from the old one's. iptables
    // keeps a total per process (the counts of the rules its own writes flushed or deleted):
    // the new driver starts from the kernel's present counts, and moves by exactly the connections
    // made since, across its own whole write.
    const keepsTotalsAcrossRestarts = backendUnderTest.name.startsWith('nft');
    it('counts the connections it translates, by family and source, across its own writes and a restart', async () => {
      type Read = (family: string, source: string) => number | undefined;
      const read = async (driver = backend!.driver): Promise<Read> => {
        const rows = await driver.translatedConnections!();
        return (family, source) => rows.find((r) => r.family === family && r.source === source)?.connections;
      };
      const moved = (from: Read, to: Read, by: Record<string, number>) => {
        for (const [family, source] of COUNTED) {
          const key = `${family} ${source}`;
          expect(to(family, source), key).to.equal(from(family, source)! + (by[key] ?? 0));
        }
      };
      const before = await read();
      for (const [family, source] of COUNTED) {
        expect(before(family, source), `${family} ${source}`).to.be.a('number');
      }
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
      expect(await probe(pod(), 'udp', LB_V4, 80)).to.equal(`svc-a from ${LB_V4}`);
      expect(await probe(undefined, 'tcp', LB_V4, 80)).to.equal('svc-a');
      expect(await probe(pod(), 'tcp', LB_V6, 80)).to.equal('svc-a6');
      // Not translated, not counted.
      expect(await probe(pod(), 'tcp', LB_PROXY, 80)).to.equal(LB_PATH);
      // Another Service's connection, then that Service deleted (its rules go) and back.
      expect(await probe(pod(), 'tcp', LB_V4, 8080)).to.equal('svc-b');
      await backend!.sync(withoutSvcB(), { full: false });
      expect(await probe(pod(), 'tcp', LB_V4, 8080)).to.equal(LB_PATH);
      await backend!.sync(desired(), { full: false });
      // A full resync (a verification), then a whole write: another masquerade mark, another shape.
      await backend!.sync(desired(), { full: true });
      await backend!.sync(desired({ masqueradeBit: 15 }), { full: false });
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
      const written = await read();
      moved(before, written, { 'ipv4 pods': 5, 'ipv4 node': 1, 'ipv6 pods': 1 });
      const restarted = backendUnderTest.make();
      try {
        const start = keepsTotalsAcrossRestarts ? written : await read(restarted.driver);
        await restarted.sync(desired(), { full: true });
        expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
        expect(await probe(undefined, 'udp', LB_V4, 80)).to.equal(`svc-a from ${LB_V4}`);
        moved(start, await read(restarted.driver), { 'ipv4 pods': 1, 'ipv4 node': 1 });
      } finally {
        await restarted.close?.();
      }
      // The first driver's total, read again after the other's write, has not gone back (iptables:
      // a flush by another process is seen only where its rule counts less than before).
      const again = await read();
      for (const [family, source] of COUNTED) {
        expect(again(family, source), `${family} ${source}`).to.be.at.least(written(family, source)!);
      }
    });

    it("marks the node's translated packets for masquerade, and leaves a pod's unmarked", async () => {
      installMarkObserver();
      try {
        expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
        expect(await probe(undefined, 'tcp', LB_V4, 80)).to.equal('svc-a');
        const counters = readJsonCounters('inet', 'mark-observer');
        expect(counters.get('translated-input')!, "the pod's packets reached the ClusterIP").to.be.above(0);
        expect(counters.get('marked-input')!, "a pod's traffic keeps its source: no masquerade bit").to.equal(0);
        expect(counters.get('marked-output')!, "the node's traffic carries the masquerade bit").to.be.above(0);
      } finally {
        sh('nft', ['delete', 'table', 'inet', 'mark-observer']);
      }
    });

    it('translates only a destination bound on the node: once unbound, the address is left alone', async () => {
      sh('ip', ['addr', 'del', `${LB_V4}/32`, 'dev', 'kube-ipvs0']);
      try {
        // Nothing answers the address any more (it is bound nowhere): not the ClusterIP either.
        expect(await probe(pod(), 'tcp', LB_V4, 80, 500)).to.not.equal('svc-a');
        expect(await probe(undefined, 'tcp', LB_V4, 80, 500)).to.not.equal('svc-a');
      } finally {
        scenario.network.bindAddress(LB_V4);
      }
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
      expect(await probe(undefined, 'tcp', LB_V4, 80)).to.equal('svc-a');
    });

    it('does not translate traffic from outside the node', async () => {
      expect(await probe(outside(), 'tcp', LB_V4, 80)).to.equal(LB_PATH);
      expect(await probe(outside(), 'udp', LB_V4, 80)).to.equal(`${LB_PATH} from ${LB_V4}`);
    });

    it('sends a second Service on the same IP and another port to its own ClusterIP', async () => {
      expect(await probe(pod(), 'tcp', LB_V4, 8080)).to.equal('svc-b');
      expect(await probe(undefined, 'tcp', LB_V4, 8080)).to.equal('svc-b');
    });

    it('leaves ipMode Proxy addresses to the load balancer', async () => {
      expect(await probe(pod(), 'tcp', LB_PROXY, 80)).to.equal(LB_PATH);
      expect(await probe(undefined, 'tcp', LB_PROXY, 80)).to.equal(LB_PATH);
    });

    it('translates spec.externalIPs', async () => {
      expect(await probe(pod(), 'tcp', EXTERNAL_IP, 443)).to.equal('svc-ext');
    });

    it('translates IPv6 LoadBalancer IPs of a dual-stack Service', async () => {
      expect(await probe(pod(), 'tcp', LB_V6, 80)).to.equal('svc-a6');
      expect(await probe(undefined, 'tcp', LB_V6, 80)).to.equal('svc-a6');
      expect(await probe(outside(), 'tcp', LB_V6, 80)).to.equal(LB_PATH);
    });

    it('only translates what is asked for: another port on a translated IP is left alone', async () => {
      expect(await probe(pod(), 'udp', LB_V4, 8080)).to.equal(`${LB_PATH} from ${LB_V4}`);
    });

    it('restores rules removed by hand on the next full resync', async () => {
      backendUnderTest.removeByHand();
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal(LB_PATH);
      await backend!.sync(desired(), { full: true });
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
    });

    it('removes the translation of a deleted Service', async () => {
      await backend!.sync(withoutSvcB(), { full: false });
      expect(await probe(pod(), 'tcp', LB_V4, 8080)).to.equal(LB_PATH);
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
      await backend!.sync(desired(), { full: false });
      expect(await probe(pod(), 'tcp', LB_V4, 8080)).to.equal('svc-b');
    });

    it('programs output rules but no prerouting rules when the node has no podCIDR', async () => {
      await backend!.sync(desired({}, { name: 'node-1' }), { full: true });
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal(LB_PATH);
      expect(await probe(undefined, 'tcp', LB_V4, 80)).to.equal('svc-a');
    });

    it('recognises local pods by interface name prefix', async () => {
      const prefix = scenario.network.podVethName.slice(0, 4);
      await backend!.sync(desired({ detectLocalMode: 'InterfaceNamePrefix', podInterfaceNamePrefix: prefix }), {
        full: true,
      });
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
      expect(await probe(outside(), 'tcp', LB_V4, 80)).to.equal(LB_PATH);
    });

    it('recognises local pods by bridge interface', async () => {
      await backend!.sync(
        desired({ detectLocalMode: 'BridgeInterface', podBridgeInterface: scenario.network.podVethName }),
        { full: true },
      );
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
      expect(await probe(outside(), 'tcp', LB_V4, 80)).to.equal(LB_PATH);
    });

    it('recognises local pods by cluster CIDR', async () => {
      await backend!.sync(desired({ detectLocalMode: 'ClusterCIDR', clusterCidrs: ['10.244.0.0/16'] }), { full: true });
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
      expect(await probe(outside(), 'tcp', LB_V4, 80)).to.equal(LB_PATH);
      // No IPv6 cluster CIDR: IPv6 pod traffic is not recognised, host traffic still is.
      expect(await probe(pod(), 'tcp', LB_V6, 80)).to.equal(LB_PATH);
      expect(await probe(undefined, 'tcp', LB_V6, 80)).to.equal('svc-a6');
    });

    it('removes everything on cleanup, and a second cleanup succeeds', async () => {
      await backend!.cleanup();
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal(LB_PATH);
      expect(await probe(undefined, 'tcp', LB_V4, 80)).to.equal(LB_PATH);
      await backend!.cleanup();
    });
  });
}
