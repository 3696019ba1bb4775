// The continuous probe end to end: the real CLI (the bundle), the API stand-in, the kernel of
// this (isolated) network namespace, per backend. The address a Service's path dials answers
// nothing when untranslated (its load-balancer server is stopped), so an answered probe is a
// translated one; the Service's endpoint (the server on its ClusterIP) is stopped and started
// again, and /metrics and /readyz follow.

import { expect } from 'chai';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PROBE_ANNOTATION } from '../../src/model/types.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { requireTools } from '../../testbed/node-network.js';
import { shippedArgs } from '../../testbed/shipped-controller.js';
import { eventually } from '../support/eventually.js';
import { httpGet, scrapeMetrics } from '../support/scrape.js';
import { LB_V4, LB_V6, SERVICES, Scenario, applyScenario, tearDownCliRun, wireService } from './scenario.js';

const METRICS = 'http://127.0.0.1:9487';
const HEALTH = 'http://127.0.0.1:9488';
const P = 'ipvs_node_controller_';

for (const backend of ['nft', 'iptables'] as const) {
  describe(`the continuous probe through the ${backend} backend (real CLI, API stand-in)`, function () {
    this.timeout(120_000);
    const scenario = new Scenario();
    let api: ApiStandIn;
    let dir: string;
    let controller: ChildProcess | undefined;
    const log: string[] = [];

    before(async () => {
      requireTools(backend === 'nft' ? 'nft' : 'iptables');
      await scenario.setUp();
      // Untranslated, svc-a's and svc-b's addresses answer nothing: refused.
      await scenario.stopServer(LB_V4, 80);
      await scenario.stopServer(LB_V4, 8080);
      await scenario.stopServer(LB_V6, 80);
      dir = await mkdtemp(join(tmpdir(), 'probe-'));
      api = await ApiStandIn.start({ bookmarkIntervalMs: 200 });
      applyScenario(api);
      // svc-b's owner opts in.
      const svcB = wireService(SERVICES.find((s) => s.name === 'svc-b')!);
      (svcB.metadata as Record<string, unknown>).annotations = { [PROBE_ANNOTATION]: 'true' };
      api.apply(svcB);
      await api.writeKubeconfig(join(dir, 'kubeconfig'));
      controller = spawn(
        process.execPath,
        shippedArgs([
          `--kubeconfig=${join(dir, 'kubeconfig')}`,
          '--node-name=node-1',
          `--backend=${backend}`,
          '--metrics-bind-address=127.0.0.1:9487',
          '--healthz-bind-address=127.0.0.1:9488',
          '--probe-service=default/svc-a',
          '--probe-readiness',
          '--probe-interval=5s',
          '--probe-timeout=500ms',
        ]),
        { stdio: ['ignore', 'pipe', 'inherit'] },
      );
      controller.stdout!.on('data', (d: Buffer) => log.push(...d.toString().trimEnd().split('\n')));
    });

    afterEach(function () {
      if (this.currentTest?.state === 'failed') console.log(`controller log:\n${log.join('\n')}`);
    });

    after(() => tearDownCliRun([controller], api, scenario, dir));

    const readyz = async () => {
      const a = await httpGet(`${HEALTH}/readyz`);
      return { status: a.status, detail: String(JSON.parse(a.body).detail) };
    };

    it("probes the operator's Service and the annotated one, through the translation, and is ready", async () => {
      const m = await eventually('both probed Services answering', async () => {
        const e = await scrapeMetrics(METRICS);
        return (
          e.value(`${P}probe_success`, { service: 'default/svc-a', origin: 'flag' }) === 1 &&
          e.value(`${P}probe_success`, { service: 'default/svc-b', origin: 'annotation' }) === 1 &&
          e
        );
      });
      // svc-a: TCP and UDP on port 80 over IPv4 and IPv6, four paths; svc-b one.
      expect(m.sum(`${P}probes_total`, { service: 'default/svc-a', outcome: 'answered' })).to.be.at.least(4);
      expect(m.sum(`${P}probes_total`, { service: 'default/svc-b', outcome: 'answered' })).to.be.at.least(1);
      expect(m.sum(`${P}probes_total`, { outcome: 'refused' })).to.equal(0);
      // Measured, not bounded here: the bench (probe-cost) says how long a path takes.
      expect(m.value(`${P}probe_duration_seconds`, { service: 'default/svc-a' })).to.be.above(0);
      // No other Service is probed.
      expect(m.sum(`${P}probe_success`)).to.equal(2);
      expect(m.text).to.not.include('svc-ext');
      expect((await readyz()).status).to.equal(200);
    });

    it("fails readiness while the operator's Service does not answer, and names it; ready again after", async () => {
      await scenario.stopServer('10.96.0.10', 80);
      try {
        const r = await eventually('/readyz failing on the probe', async () => {
          const a = await readyz();
          return a.status === 503 && a;
        });
        expect(r.detail).to.match(
          /^the probe of --probe-service default\/svc-a \(.*192\.0\.2\.10:80\/TCP refused.*\) failed/,
        );
        const m = await scrapeMetrics(METRICS);
        expect(m.value(`${P}probe_success`, { service: 'default/svc-a', origin: 'flag' })).to.equal(0);
        expect(m.value(`${P}probe_success`, { service: 'default/svc-b', origin: 'annotation' })).to.equal(1);
        expect(m.sum(`${P}probes_total`, { service: 'default/svc-a', outcome: 'refused' })).to.be.at.least(2);
        expect(log.some((l) => l.includes('Probe failing') && l.includes('default/svc-a'))).to.equal(true);
      } finally {
        await scenario.startServer('10.96.0.10', 80);
      }
      await eventually('/readyz ready again', async () => (await readyz()).status === 200);
    });

    it("an annotated Service's failure never makes the node unready", async () => {
      await scenario.stopServer('10.96.0.11', 8080);
      try {
        await eventually('svc-b failing', async () => {
          const e = await scrapeMetrics(METRICS);
          return e.value(`${P}probe_success`, { service: 'default/svc-b', origin: 'annotation' }) === 0;
        });
        expect((await readyz()).status).to.equal(200);
      } finally {
        await scenario.startServer('10.96.0.11', 8080);
      }
    });
  });
}
