// `npm run demo` as a user meets it: the blackhole before the controller, translation after, and
// kubectl get / apply / delete against the demo's API stand-in with the rules following; Ctrl-C
// (SIGINT) tears it all down.

import assert from 'node:assert/strict';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { assertIsolatedNetns, requireTools } from '../support/node-network.js';
import { httpGet, scrapeMetrics } from '../support/scrape.js';

const run = promisify(execFile);
const here = dirname(fileURLToPath(import.meta.url));
const DEMO = join(here, '..', '..', 'demo', 'run.js');
const EXTRA = join(here, '..', '..', '..', 'demo', 'extra-service.yaml');

describe('the demo (npm run demo)', function () {
  this.timeout(120_000);
  let demo: ChildProcess | undefined;
  let output = '';

  async function outputMatching(re: RegExp, what: string): Promise<RegExpMatchArray> {
    const deadline = Date.now() + 60_000;
    for (;;) {
      const m = re.exec(output);
      if (m) return m;
      if (demo?.exitCode !== null) throw new Error(`the demo exited while waiting for ${what}:\n${output}`);
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}:\n${output}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  before(() => {
    assertIsolatedNetns(); // the demo's loopback relays stay in the test's namespace
    requireTools('unshare', 'ip', 'nft', 'kubectl');
  });
  after(async () => {
    if (demo && demo.exitCode === null) {
      demo.kill('SIGINT');
      await once(demo, 'exit');
    }
  });

  it('shows the blackhole, then the translation, then follows kubectl apply and delete; SIGINT tears down', async () => {
    demo = spawn(process.execPath, [DEMO], { stdio: ['ignore', 'pipe', 'pipe'] });
    demo.stdout!.on('data', (d: Buffer) => (output += d.toString()));
    demo.stderr!.on('data', (d: Buffer) => (output += d.toString()));

    const [, kubeconfig] = await outputMatching(/export KUBECONFIG=(\S+)/, 'the kubeconfig');
    const [, metricsPort] = await outputMatching(/curl -s http:\/\/127\.0\.0\.1:(\d+)\/metrics/, 'the metrics address');
    const before = output.slice(output.indexOf('1. Without the controller'), output.indexOf('2. Starting'));
    const after = output.slice(output.indexOf('2. Starting'), output.indexOf('3. Your turn'));
    for (const client of ['host network (node)', 'pod-a (10.244.1.2)', 'pod-b (10.244.1.3)']) {
      for (const target of ['203.0.113.10:80/tcp', '203.0.113.10:8443/tcp']) {
        const line = (text: string) => text.split('\n').find((l) => l.includes(client) && l.includes(target)) ?? '';
        assert.match(line(before), /no answer: blackholed/, `${client} -> ${target} before`);
        const service = target.endsWith(':80/tcp') ? 'shop/web' : 'shop/api';
        assert.match(
          line(after),
          new RegExp(`ok answered by the endpoints of ${service}`),
          `${client} -> ${target} after`,
        );
      }
    }

    const kubectl = async (...args: string[]) => (await run('kubectl', ['--kubeconfig', kubeconfig!, ...args])).stdout;
    const rows = (await kubectl('get', 'services', '-A'))
      .trim()
      .split('\n')
      .map((l) => l.trim().split(/\s+/));
    assert.deepEqual(
      rows.slice(1).map((r) => [r[0], r[1], r[2], r[4]]),
      [
        ['shop', 'api', 'LoadBalancer', '203.0.113.10'],
        ['shop', 'web', 'LoadBalancer', '203.0.113.10'],
      ],
    );

    assert.match(await kubectl('apply', '--validate=false', '-f', EXTRA), /service\/cart created/);
    await outputMatching(/\+ 203\.0\.113\.11 tcp 8080 -> (\S+)\s+\(shop\/cart\)/, 'the new rule');
    await outputMatching(
      /pod-a \(10\.244\.1\.2\)\s+-> 203\.0\.113\.11:8080\/tcp\s+ok answered by the endpoints of shop\/cart/,
      'the probe',
    );
    const cart = (await kubectl('get', 'service', '-n', 'shop', 'cart', '--no-headers')).trim().split(/\s+/);
    assert.equal(cart[3], '203.0.113.11', 'the demo load balancer assigned the next address');
    const metrics = await scrapeMetrics(`http://127.0.0.1:${metricsPort}`);
    assert.equal(metrics.value('ipvs_node_controller_programmed_entries', { backend: 'nft', family: 'ipv4' }), 3);

    assert.match(await kubectl('delete', '-f', EXTRA), /service "cart" deleted/);
    await outputMatching(/- 203\.0\.113\.11 tcp 8080 -> \S+\s+\(shop\/cart\)/, 'the rule removal');

    demo.kill('SIGINT');
    const [code] = (await once(demo, 'exit')) as [number | null];
    assert.equal(code, 0, output);
    assert.match(output, /Torn down/);
    assert.equal(existsSync(dirname(kubeconfig!)), false, 'the temporary directory is removed');
    await assert.rejects(httpGet(`http://127.0.0.1:${metricsPort}/metrics`), /ECONNREFUSED/);
  });
});
