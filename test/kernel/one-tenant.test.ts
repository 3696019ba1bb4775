// One tenant's Service cannot hurt the others (design/semantics.md), on every backend, with the
// controller as shipped and real packets: a Service of 300 external IPs x 300 ports (90,000
// entries) arrives beside a neighbour that is probed throughout.
// - With the default limits it is refused whole (tooManyEntries): log, metric, readiness
//   warning, Event, and no translation of any of its addresses.
// - With the per-Service limit raised it is programmed (nft, with --max-entries raised too), or
//   refused because it does not fit in what the backend holds (overCapacity): iptables keeps its
//   default of 20,000 (every new connection walks the rules), ebpf its maps' 65,536.
// Either way no probe of the neighbour is lost, /healthz answers every poll within the
// DaemonSet probe's timeout, the controller's memory stays under the DaemonSet's limit, and a
// Service created afterwards is translated. How long that took is printed, not judged.

import { expect } from 'chai';
import { HealthzWatch, TENANT_BACKENDS, TenantNode, UNTRANSLATED, lbService } from './tenant-node.js';

const NEIGHBOUR = { name: 'neighbour', clusterIp: '10.96.0.10', lb: '192.0.2.10' };
const LATER = { name: 'later', clusterIp: '10.96.0.11', lb: '192.0.2.11' };
const BIG = { clusterIp: '10.96.0.20', addresses: 300, ports: 300 };
/** The DaemonSet's memory limit. */
const MEMORY_LIMIT_MIB = 512;

function bigService() {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: 'big', namespace: 'tenant', uid: 'uid-big', creationTimestamp: '2025-01-01T00:00:00Z' },
    spec: {
      type: 'ClusterIP',
      clusterIP: BIG.clusterIp,
      clusterIPs: [BIG.clusterIp],
      externalIPs: Array.from({ length: BIG.addresses }, (_, i) => `198.19.${i >> 8}.${i & 255}`),
      ports: Array.from({ length: BIG.ports }, (_, i) => ({ name: `p${i}`, protocol: 'TCP', port: 1024 + i })),
    },
  };
}

for (const backend of TENANT_BACKENDS) {
  describe(`one tenant's Service of 300 x 300 entries beside a neighbour, --backend=${backend}`, function () {
    this.timeout(240_000);
    const node = new TenantNode(backend);

    before(async () => {
      await node.setUp();
      await node.serve(NEIGHBOUR.clusterIp, 80, NEIGHBOUR.name);
      await node.serve(NEIGHBOUR.lb, 80, UNTRANSLATED);
      await node.serve(LATER.clusterIp, 80, LATER.name);
      await node.serve(LATER.lb, 80, UNTRANSLATED);
      // One of the big Service's addresses and its ClusterIP answer, so that a translation shows.
      await node.serve(BIG.clusterIp, 1024, 'big');
      await node.serve('198.19.0.1', 1024, UNTRANSLATED);
    });

    after(async () => {
      await node.tearDown();
    });

    afterEach(async function () {
      if (this.currentTest?.state === 'failed') console.log(node.tail());
      await node.stopController();
      node.api.remove('Service', 'tenant', 'big');
      node.api.remove('Service', 'default', LATER.name);
    });

    /** Writes the big Service while the neighbour is probed; returns what happened meanwhile. */
    async function bigServiceArrives(extraFlags: string[], settled: () => Promise<boolean>) {
      node.api.apply(lbService(NEIGHBOUR.name, NEIGHBOUR.clusterIp, NEIGHBOUR.lb));
      node.startController(['--emit-events', ...extraFlags]);
      // The rules of the test before stay in place until this controller's first sync.
      await node.waitForOutput(/"msg":"Synced"/);
      await node.eventually(NEIGHBOUR.lb, 80, NEIGHBOUR.name);
      const loop = await node.connectLoop(NEIGHBOUR.lb, 80, NEIGHBOUR.name, 20);
      const health = new HealthzWatch(node.healthzPort);
      let probes;
      try {
        node.resetPeakMemory();
        node.api.apply(bigService());
        for (let i = 0; i < 1200 && !(await settled()); i++) await new Promise((r) => setTimeout(r, 100));
        expect(await settled(), `the big Service was neither programmed nor refused\n${node.tail()}`).to.equal(true);
        node.api.apply(lbService(LATER.name, LATER.clusterIp, LATER.lb, 80, '2025-06-01T00:00:00Z'));
        const laterMs = await node.eventually(LATER.lb, 80, LATER.name);
        console.log(
          `      ${backend}: a Service created after it was translated ${laterMs.toFixed(0)} ms after its write`,
        );
        await new Promise((r) => setTimeout(r, 1500)); // one more /healthz poll after it all
      } finally {
        await health.stop();
        probes = await loop.stop();
      }
      const peak = node.peakMemoryMiB();
      console.log(`      ${backend}: resident memory peak ${peak.toFixed(0)} MiB; ${probes.total} probes`);
      expect(probes.failed, JSON.stringify(probes.failures)).to.equal(0);
      expect(probes.answered).to.be.above(10);
      expect(health.answers.length, 'polls of /healthz').to.be.above(0);
      expect(health.answers.filter((a) => a.status !== 200)).to.deep.equal([]);
      expect(peak).to.be.below(MEMORY_LIMIT_MIB);
    }

    const skipped = async (reason: string) =>
      (await node.metrics()).value('ipvs_node_controller_skipped_addresses', { reason }) === 1;

    it('refuses it whole with the default limits, says why, and the neighbour never notices', async function () {
      await bigServiceArrives([], () => skipped('tooManyEntries'));
      expect(node.output).to.match(
        /"service":\{"namespace":"tenant","name":"big"\},"reason":"tooManyEntries",.*"msg":"Service address skipped"/,
      );
      expect(await node.probe('198.19.0.1', 1024)).to.equal(UNTRANSLATED);
      const ready = await node.readyz();
      expect(ready.status).to.equal(200);
      expect(ready.body.warnings).to.include(
        '1 Services are not translated: each asks for more than 10000 entries (tooManyEntries, --max-entries-per-service)',
      );
      const events = node.api.list('Event').filter((e) => e.involvedObject?.name === 'big');
      expect(events.map((e) => String(e.message))).to.satisfy((m: string[]) =>
        m.some((t) => t.includes('tooManyEntries')),
      );
    });

    const capacity = backend === 'nft' ? 'programs it' : 'refuses it as more than the backend holds';
    it(`${capacity} when the per-Service limit is raised, and the neighbour never notices`, async function () {
      const flags = ['--max-entries-per-service=100000', ...(backend === 'nft' ? ['--max-entries=100000'] : [])];
      if (backend !== 'nft') {
        await bigServiceArrives(flags, () => skipped('overCapacity'));
        expect(await node.probe('198.19.0.1', 1024)).to.equal(UNTRANSLATED);
        expect(node.output).to.match(
          /"service":\{"namespace":"tenant","name":"big"\},"reason":"overCapacity",.*"msg":"Service address skipped"/,
        );
      } else {
        const entries = 1 + BIG.addresses * BIG.ports;
        const programmed = () => node.output.includes(`"entries":{"ipv4":${entries},"ipv6":0}`);
        await bigServiceArrives(flags, () => Promise.resolve(programmed()));
        expect(await node.probe('198.19.0.1', 1024)).to.equal('big');
      }
    });
  });
}
