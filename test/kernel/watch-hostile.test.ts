// Hostile and silent watch streams against the whole controller (the real CLI, nft backend)
// through the API stand-in: lines that are valid JSON but no watch event, lines that are not
// JSON at all, a half-open watch that delivers nothing, an API server that cannot be reached.
// The controller keeps running, keeps its rules, and programs the changes that come after.

import type { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect } from 'chai';
import { MAP_NAME, TABLE_NAME } from '../../src/backends/nft/render.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { assertIsolatedNetns, sh } from '../../testbed/node-network.js';
import { scrapeMetrics } from '../support/scrape.js';
import { MALFORMED_WATCH_LINES } from '../support/fixtures.js';
import { shippedArgs } from '../../testbed/shipped-controller.js';
import { waitFor as waitUntil } from '../support/eventually.js';
import { wireLbService, wireNode } from '../support/wire-objects.js';
import { spawnNodeProcess, standInFlags } from '../support/node-process.js';

const METRICS = '127.0.0.1:19477';
const DECODE_ERRORS = 'ipvs_node_controller_watch_decode_errors_total';

const service = (name: string, ingressIp: string, clusterIp: string) =>
  wireLbService(name, clusterIp, ingressIp, { portName: 'http' });

const NODE_OBJECT = wireNode(['10.244.1.0/24']);

type Listed = {
  nftables: Array<{ map?: { name: string; elem?: Array<[{ elem: { val: { concat: unknown[] } } }, string]> } }>;
};

/** The IPv4 kernel map as `ip proto port clusterIp`, sorted; [] when the table is not there. */
function kernelMap(): string[] {
  let text: string;
  try {
    text = sh('nft', ['-j', 'list', 'table', 'ip', TABLE_NAME]);
  } catch {
    return [];
  }
  const map = (JSON.parse(text) as Listed).nftables.find((o) => o.map?.name === MAP_NAME)?.map;
  return (map?.elem ?? []).map(([key, value]) => `${key.elem.val.concat.join(' ')} ${value}`).sort();
}

/** What the map must hold for the stand-in's Services. */
function expectedMap(api: ApiStandIn): string[] {
  return api
    .list('Service')
    .map((s) => `${s.status.loadBalancer.ingress[0].ip} tcp 80 ${s.spec.clusterIP}`)
    .sort();
}

const waitFor = (cond: () => boolean | Promise<boolean>, what: string, ms = 30_000) => waitUntil(cond, what, ms, 50);

describe('controller against hostile and silent watch streams (CLI + API stand-in + nft)', function () {
  this.timeout(120_000);
  let api: ApiStandIn;
  let dir: string;
  let kubeconfig: string;
  let controller: ChildProcess | undefined;
  let output = '';

  /** The shipped controller with `args`; what it prints goes to `output`. */
  function spawnController(args: string[]): ChildProcess {
    output = '';
    return spawnNodeProcess(shippedArgs(args), (text) => (output += text));
  }

  function startController(extra: string[] = []): ChildProcess {
    return spawnController([
      '--backend=nft',
      ...standInFlags(kubeconfig, '2s'),
      `--metrics-bind-address=${METRICS}`,
      '--healthz-bind-address=',
      ...extra,
    ]);
  }

  async function stopController(): Promise<void> {
    if (!controller) return;
    if (controller.exitCode === null && controller.signalCode === null) {
      controller.kill('SIGTERM');
      await once(controller, 'exit');
    }
    controller = undefined;
  }

  const running = () => controller !== undefined && controller.exitCode === null && controller.signalCode === null;
  const decodeErrors = async () =>
    (await scrapeMetrics(`http://${METRICS}`)).sum(DECODE_ERRORS, { resource: 'services' });

  before(async () => {
    assertIsolatedNetns();
    dir = mkdtempSync(join(tmpdir(), 'watch-hostile-'));
    kubeconfig = join(dir, 'kubeconfig');
  });

  beforeEach(async () => {
    api = await ApiStandIn.start({ bookmarkIntervalMs: 500 });
    await api.writeKubeconfig(kubeconfig);
    api.apply(NODE_OBJECT);
    for (let i = 0; i < 3; i++) api.apply(service(`web-${i}`, `192.0.2.${10 + i}`, `10.96.0.${10 + i}`));
  });

  afterEach(async function () {
    if (this.currentTest?.state === 'failed') console.log(`controller output:\n${output}`);
    await stopController();
    await api.stop();
    sh(process.execPath, shippedArgs(['--cleanup']));
  });

  after(() => rmSync(dir, { recursive: true, force: true }));

  it('survives each of the nine malformed lines with its rules intact, and programs the change after it', async () => {
    controller = startController();
    await waitFor(() => kernelMap().join() === expectedMap(api).join(), 'the first sync');
    for (const [n, line] of MALFORMED_WATCH_LINES.entries()) {
      await waitFor(() => api.openWatchCount('Service') === 1, `an open Service watch before line ${n + 1}`);
      const watches = api.stats.watches.services ?? 0;
      expect(api.injectWatchLine('Service', line)).to.equal(1);
      await waitFor(async () => (await decodeErrors()) === n + 1, `${line} to be counted`);
      // An ERROR event without a status leaves the stream unusable: it is replaced.
      if (line.includes('ERROR')) await waitFor(() => (api.stats.watches.services ?? 0) > watches, 'a new watch');
      expect(running(), `running after ${line}`).to.equal(true);
      expect(kernelMap(), `rules after ${line}`).to.deep.equal(expectedMap(api));
      api.apply(service('web-0', `198.18.0.${n + 1}`, '10.96.0.10'));
      await waitFor(() => kernelMap().join() === expectedMap(api).join(), `the change after ${line}`);
      expect(kernelMap()).to.include(`198.18.0.${n + 1} tcp 80 10.96.0.10`);
    }
    expect(running()).to.equal(true);
    // Logged once per watch stream, not once per line: the ERROR without a status ended the
    // first stream, so the ninth line was the first of the next one.
    expect(output.match(/Skipped a watch line that is not a watch event/g) ?? []).to.have.length(2);
  });

  it('counts watch lines that are not JSON in watch_decode_errors_total, and programs the change after them', async () => {
    controller = startController();
    await waitFor(() => kernelMap().join() === expectedMap(api).join(), 'the first sync');
    await waitFor(() => api.openWatchCount('Service') === 1, 'an open Service watch');
    const watches = api.stats.watches.services ?? 0;
    for (const line of ['<html>502 Bad Gateway</html>', '{"type":"ADDED","object":{"metadata":']) {
      expect(api.injectWatchLine('Service', line)).to.equal(1);
    }
    await waitFor(async () => (await decodeErrors()) === 2, 'both lines to be counted');
    expect(running()).to.equal(true);
    expect(kernelMap()).to.deep.equal(expectedMap(api));
    api.apply(service('web-1', '198.18.2.1', '10.96.0.11'));
    await waitFor(() => kernelMap().join() === expectedMap(api).join(), 'the change after them');
    expect(kernelMap()).to.include('198.18.2.1 tcp 80 10.96.0.11');
    // Skipped on the same stream, logged once for it.
    expect(api.stats.watches.services ?? 0).to.equal(watches);
    expect(output.match(/Skipped a watch line that is not a watch event/g) ?? []).to.have.length(1);
    expect(output).to.include('not JSON: \\"<html>502 Bad Gateway</html>\\"');
  });

  it('replaces a watch that stays open but delivers nothing, and programs what changed meanwhile', async () => {
    // Watches asked for 2-4 s; one silent past that (plus 1 s) is taken for dead.
    controller = startController(['--min-watch-timeout=2s']);
    await waitFor(() => kernelMap().join() === expectedMap(api).join(), 'the first sync');
    await waitFor(() => api.openWatchCount('Service') === 1, 'an open Service watch');
    expect(api.silenceOpenWatches('Service')).to.equal(1);
    api.apply(service('web-1', '198.18.1.1', '10.96.0.11'));
    api.remove('Service', 'default', 'web-2');
    api.apply(service('web-3', '198.18.1.3', '10.96.0.13'));
    await waitFor(() => kernelMap().join() === expectedMap(api).join(), 'the changes made during the silence');
    expect(kernelMap()).to.deep.equal([
      '192.0.2.10 tcp 80 10.96.0.10',
      '198.18.1.1 tcp 80 10.96.0.11',
      '198.18.1.3 tcp 80 10.96.0.13',
    ]);
    expect(output).to.match(/the watch delivered nothing for \d+ s: taken for dead/);
    expect(running()).to.equal(true);
  });

  it('keeps retrying an API server it cannot reach, without endpoints to hold the process up', async () => {
    await api.stop(); // its port now refuses connections
    controller = spawnController([
      '--backend=nft',
      '--kubeconfig',
      kubeconfig,
      '--node-name',
      'node-1',
      '--metrics-bind-address=',
      '--healthz-bind-address=',
    ]);
    await waitFor(
      () =>
        (output.match(/"resource":"services".*"msg":"Failed to list and watch, keeping the last rules"/g) ?? [])
          .length >= 3 || !running(),
      'three retries',
    );
    expect(running(), 'still running and retrying').to.equal(true);
    api = await ApiStandIn.start({ bookmarkIntervalMs: 500 }); // for afterEach
  });
});
