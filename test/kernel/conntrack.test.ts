// UDP flows with a fixed source port follow the translation of their destination, through the
// real controller (API stand-in, real client library, informers, sync runner) on every backend
// whose translation lives in conntrack: the controller deletes the stale entries, not the test.
// Senders in the pod namespace and on the node send every 20 ms; servers on the ClusterIPs and
// on the LoadBalancer IPs (the untranslated path) on the kube-ipvs0 stand-in count what arrives.

import type { Reconciler } from '../../src/reconciler/reconciler.js';
import { expect } from 'chai';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import { loadNftAddon } from '../../src/backends/nft/addon-executor.js';
import { NftDriver } from '../../src/backends/nft/nft-driver.js';
import { composeReconciler } from '../../src/cli/compose.js';
import { Controller } from '../../src/controller/controller.js';
import type { Driver } from '../../src/driver/driver.js';
import { createClusterCaches, loadKubeConfig } from '../../src/kube/cluster.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { NODE, NodeNetwork, requireTools, sh } from '../../testbed/node-network.js';
import { CountingUdpServer, UdpFlow } from '../support/udp-flow.js';
import { CONFIG } from '../support/fixtures.js';
import { linesLogger } from '../support/log-lines.js';
import { wireLbService, wireNode } from '../support/wire-objects.js';

const LB4 = '192.0.2.50';
const LB6 = '2001:db8::50';
const PORT = 5353;
const FIRST = { v4: '10.96.5.1', v6: 'fd00::5:1' };
const SECOND = { v4: '10.96.5.2', v6: 'fd00::5:2' };

const NODE_OBJECT = wireNode([NODE.podCidr4, NODE.podCidr6]);

function dnsService(clusterIps: { v4: string; v6: string }, ipMode4: 'VIP' | 'Proxy' = 'VIP') {
  return wireLbService('dns', clusterIps.v4, [{ ip: LB4, ipMode: ipMode4 }, { ip: LB6 }], {
    port: PORT,
    protocol: 'UDP',
    portName: 'dns',
    clusterIPs: [clusterIps.v4, clusterIps.v6],
    spec: { ipFamilies: ['IPv4', 'IPv6'] },
  });
}

interface BackendCase {
  name: string;
  make(): Driver;
}

const BACKENDS: BackendCase[] = [
  {
    name: 'nft (addon)',
    make: () => {
      const load = loadNftAddon();
      if (!load.executor) throw new Error(`the nftables addon must be built for kernel tests: ${load.reason}`);
      return new NftDriver(load.executor);
    },
  },
  ...(['legacy', 'nft'] as const).map((variant) => ({
    name: `iptables (${variant})`,
    make: () => new IptablesDriver(variant),
  })),
];

const TAGS = ['pod-v4', 'node-v4', 'pod-v6'] as const;
type Tag = (typeof TAGS)[number];

const CASES = [
  ...BACKENDS.map((b) => ({ ...b, cleanup: true })),
  // The control: the same controller without the clean-up, to show what the tests above catch.
  { ...BACKENDS[0]!, cleanup: false },
];

for (const backendCase of CASES) {
  const title = backendCase.cleanup
    ? `UDP flows follow their translation, through the controller (${backendCase.name})`
    : `without the conntrack clean-up (control, ${backendCase.name})`;
  describe(title, function () {
    this.timeout(60_000);
    const network = new NodeNetwork();
    const servers = new Map<string, CountingUdpServer>();
    const flows: UdpFlow[] = [];
    const logLines: string[] = [];
    const server = (name: string) => servers.get(name)!;
    let api: ApiStandIn;
    let dir: string;
    let backend: Reconciler;
    let controller: Controller | undefined;

    /**
     * Waits (generously) until, within one 300 ms window, each flow's datagrams arrive at the
     * server named for it and at no other server.
     */
    async function flowsArriveAt(expected: Record<Tag, string>, what: string): Promise<void> {
      let last = '';
      for (let attempt = 0; attempt < 50; attempt++) {
        const before = new Map([...servers].map(([name, s]) => [name, TAGS.map((t) => s.received(t))]));
        await sleep(300);
        const moved = (name: string, i: number) => servers.get(name)!.received(TAGS[i]!) - before.get(name)![i]!;
        const wrong: string[] = [];
        TAGS.forEach((tag, i) => {
          if (moved(expected[tag], i) < 3) wrong.push(`${tag}: ${moved(expected[tag], i)} at ${expected[tag]}`);
          for (const name of servers.keys()) {
            if (name !== expected[tag] && moved(name, i) > 0) wrong.push(`${tag}: ${moved(name, i)} at ${name}`);
          }
        });
        if (wrong.length === 0) return;
        last = wrong.join(', ');
      }
      expect.fail(`${what}: ${last}`);
    }

    before(async () => {
      requireTools('conntrack', 'nsenter');
      network.setUp();
      // A node always tracks connections (kube-proxy's masquerade rules need it); an empty nat
      // chain of ours alone does not turn tracking on in a fresh namespace.
      sh(
        'nft',
        ['-f', '-'],
        'table inet conntrack-on {\n chain c {\n type filter hook prerouting priority 0; policy accept;\n ct state new counter\n }\n}\n',
      );
      // Entries left by the suites before (same addresses and source ports) must not carry over.
      sh('conntrack', ['-F']);
      for (const address of [LB4, LB6, FIRST.v4, FIRST.v6, SECOND.v4, SECOND.v6]) network.bindAddress(address);
      for (const [name, address] of [
        ['lb-path-v4', LB4],
        ['lb-path-v6', LB6],
        ['first-v4', FIRST.v4],
        ['first-v6', FIRST.v6],
        ['second-v4', SECOND.v4],
        ['second-v6', SECOND.v6],
      ] as const) {
        servers.set(name, await CountingUdpServer.start(name, address, PORT));
      }
      api = await ApiStandIn.start({ bookmarkIntervalMs: 500 });
      dir = mkdtempSync(join(tmpdir(), 'conntrack-'));
      await api.writeKubeconfig(join(dir, 'kubeconfig'));
      api.apply(NODE_OBJECT);
      // As the composition root builds it: the conntrack clean-up subscribed, or (the control) not.
      backend = composeReconciler(backendCase.make(), {
        logger: linesLogger(logLines, 'debug'),
        ...(backendCase.cleanup ? {} : { conntrack: null }),
      });
      const probed = await backend.driver.probe();
      expect(probed.ok, probed.detail).to.equal(true);
      await startController();
    });

    async function startController(): Promise<void> {
      const logger = linesLogger(logLines, 'debug');
      const caches = createClusterCaches(loadKubeConfig(join(dir, 'kubeconfig')), 'node-1');
      controller = new Controller({
        caches,
        reconciler: backend,
        model: CONFIG,
        nodeName: 'node-1',
        minSyncPeriodMs: 0,
        syncPeriodMs: 60_000,
        logger,
      });
      await controller.start();
      // The first sync puts NAT hooks in place: from then on the kernel tracks the flows.
      for (let i = 0; i < 100 && controller.status.lastSuccessfulSyncAt === undefined; i++) await sleep(100);
      expect(controller.status.lastSuccessfulSyncAt, 'first sync').to.be.a('number');
    }

    after(async () => {
      try {
        for (const f of flows.splice(0)) await f.stop();
        await controller?.stop();
        await backend?.cleanup();
        await backend?.close?.();
        await api?.stop();
        for (const s of servers.values()) await s.stop();
      } finally {
        if (dir) rmSync(dir, { recursive: true, force: true });
        network.tearDown();
        if (/conntrack-on/.test(sh('nft', ['list', 'tables']))) sh('nft', ['delete', 'table', 'inet', 'conntrack-on']);
      }
    });

    afterEach(function () {
      if (this.currentTest?.state === 'failed') console.log(`controller log:\n${logLines.join('')}`);
    });

    if (!backendCase.cleanup) {
      it('a fixed-port flow keeps its old ClusterIP while a new flow gets the new one', async () => {
        api.apply(dnsService(FIRST));
        const programmed = () => {
          const ruleset = sh('nft', ['list', 'ruleset']);
          return ruleset.includes(`: ${FIRST.v4}`) && ruleset.includes(`: ${FIRST.v6}`);
        };
        for (let i = 0; i < 200 && !programmed(); i++) await sleep(100);
        expect(programmed(), 'the translation is programmed before the flows start').to.equal(true);
        const pod = network.pod.ns;
        flows.push(
          await UdpFlow.start({ ns: pod, address: LB4, port: PORT, sourcePort: 40001, tag: 'pod-v4' }),
          await UdpFlow.start({ address: LB4, port: PORT, sourcePort: 40002, tag: 'node-v4' }),
          await UdpFlow.start({ ns: pod, address: LB6, port: PORT, sourcePort: 40003, tag: 'pod-v6' }),
        );
        await flowsArriveAt({ 'pod-v4': 'first-v4', 'node-v4': 'first-v4', 'pod-v6': 'first-v6' }, 'first');
        expect(api.remove('Service', 'default', 'dns')).to.equal(true);
        api.apply(dnsService(SECOND));
        const fresh = await UdpFlow.start({ ns: pod, address: LB4, port: PORT, sourcePort: 40009, tag: 'fresh' });
        try {
          for (let i = 0; i < 50 && server('second-v4').received('fresh') < 3; i++) await sleep(100);
          expect(server('second-v4').received('fresh'), 'a new flow meets the new rules').to.be.at.least(3);
        } finally {
          await fresh.stop();
        }
        await flowsArriveAt({ 'pod-v4': 'first-v4', 'node-v4': 'first-v4', 'pod-v6': 'first-v6' }, 'stale');
      });
      return;
    }

    it('a flow whose first packets went through untranslated is translated once its translation appears', async () => {
      const pod = network.pod.ns;
      flows.push(
        await UdpFlow.start({ ns: pod, address: LB4, port: PORT, sourcePort: 40001, tag: 'pod-v4' }),
        await UdpFlow.start({ address: LB4, port: PORT, sourcePort: 40002, tag: 'node-v4' }),
        await UdpFlow.start({ ns: pod, address: LB6, port: PORT, sourcePort: 40003, tag: 'pod-v6' }),
      );
      await flowsArriveAt(
        { 'pod-v4': 'lb-path-v4', 'node-v4': 'lb-path-v4', 'pod-v6': 'lb-path-v6' },
        'before any Service',
      );
      // The kernel confirmed the untranslated entries: without their deletion they would stay so.
      const listed = sh('conntrack', ['-L', '-p', 'udp', '--orig-dst', LB4, '--dport', String(PORT)]);
      expect(listed)
        .to.match(/sport=40001 .* src=192\.0\.2\.50 /)
        .and.to.match(/sport=40002 .* src=192\.0\.2\.50 /);

      api.apply(dnsService(FIRST));
      await flowsArriveAt(
        { 'pod-v4': 'first-v4', 'node-v4': 'first-v4', 'pod-v6': 'first-v6' },
        'after the Service appeared',
      );
    });

    it('the flows follow a Service deleted and recreated with new ClusterIPs', async () => {
      expect(api.remove('Service', 'default', 'dns')).to.equal(true);
      api.apply(dnsService(SECOND));
      await flowsArriveAt(
        { 'pod-v4': 'second-v4', 'node-v4': 'second-v4', 'pod-v6': 'second-v6' },
        'after the ClusterIP change',
      );
    });

    it('the flows stop being translated when the controller steps aside for kube-proxy, and follow it back', async () => {
      // kube-proxy's mode as its monitor reports it (test/kernel/kube-proxy-mode.test.ts covers
      // the detection itself): our rules go, and so must the entries they made.
      controller!.onKubeProxyMode({ mode: 'nftables', source: 'proxyMode', detail: '/proxyMode: nftables' });
      await flowsArriveAt(
        { 'pod-v4': 'lb-path-v4', 'node-v4': 'lb-path-v4', 'pod-v6': 'lb-path-v6' },
        'after stepping aside',
      );
      expect(controller!.status.kubeProxy?.steppedAside).to.equal(true);
      controller!.onKubeProxyMode({ mode: 'ipvs', source: 'proxyMode', detail: '/proxyMode: ipvs' });
      await flowsArriveAt(
        { 'pod-v4': 'second-v4', 'node-v4': 'second-v4', 'pod-v6': 'second-v6' },
        'after kube-proxy is back in IPVS mode',
      );
    });

    it('the IPv4 flows stop being translated when the ingress turns to ipMode Proxy; IPv6 keeps its own', async () => {
      api.apply(dnsService(SECOND, 'Proxy'));
      await flowsArriveAt(
        { 'pod-v4': 'lb-path-v4', 'node-v4': 'lb-path-v4', 'pod-v6': 'second-v6' },
        'after ipMode Proxy',
      );
      api.apply(dnsService(SECOND, 'VIP'));
      await flowsArriveAt(
        { 'pod-v4': 'second-v4', 'node-v4': 'second-v4', 'pod-v6': 'second-v6' },
        'after ipMode VIP again',
      );
    });

    it('the flows stop being translated when the Service is deleted', async () => {
      expect(api.remove('Service', 'default', 'dns')).to.equal(true);
      await flowsArriveAt(
        { 'pod-v4': 'lb-path-v4', 'node-v4': 'lb-path-v4', 'pod-v6': 'lb-path-v6' },
        'after the deletion',
      );
      expect(logLines.join('')).to.match(/"msg":"Deleted stale conntrack entries"/);
    });

    it('a restarted controller translates flows that ran untranslated while it was down', async () => {
      await controller!.stop();
      controller = undefined;
      api.apply(dnsService(FIRST));
      await flowsArriveAt(
        { 'pod-v4': 'lb-path-v4', 'node-v4': 'lb-path-v4', 'pod-v6': 'lb-path-v6' },
        'while the controller is down',
      );
      // Its first sync does not know what the kernel held: only untranslated entries go.
      await startController();
      await flowsArriveAt({ 'pod-v4': 'first-v4', 'node-v4': 'first-v4', 'pod-v6': 'first-v6' }, 'after the restart');
    });
  });
}
