// The whole controller, as users run it (the real CLI in a child process), against the API
// stand-in (real wire protocol, real client library), checked with packets on the kernel.

import { expect } from 'chai';
import type { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { execa } from 'execa';
import { ApiStandIn } from '../../testbed/api-server.js';
import { NamedServer, probe, sh } from '../../testbed/node-network.js';
import { LB_PATH, LB_V4, Scenario } from './scenario.js';
import { shippedArgs } from '../../testbed/shipped-controller.js';
import { wireLbService, wireNode } from '../support/wire-objects.js';
import { spawnNodeProcess, standInFlags } from '../support/node-process.js';

const NEW_LB = '192.0.2.30';

function serviceObject(ingressIp: string) {
  return wireLbService('web', '10.96.0.10', ingressIp, { portName: 'http', spec: { externalTrafficPolicy: 'Local' } });
}

const NODE_OBJECT = wireNode(['10.244.1.0/24', 'fd01::/64']);

/** Polls until the probe gives `expected` (the controller works asynchronously). */
async function eventually(check: () => Promise<string>, expected: string, what: string): Promise<void> {
  let last = '';
  for (let i = 0; i < 60; i++) {
    last = await check();
    if (last === expected) return;
    await sleep(100);
  }
  expect.fail(`${what}: expected '${expected}', last answer '${last}'`);
}

/** What each backend leaves in the kernel, to check that a node never carries two. */
const KERNEL_OBJECTS: Record<string, () => boolean> = {
  nft: () => /ipvs-node-controller/.test(sh('nft', ['list', 'tables'])),
  iptables: () =>
    /IPVS_OUTPUT/.test(sh('iptables-save', ['-t', 'nat'])) ||
    /IPVS_OUTPUT/.test(sh('iptables-legacy-save', ['-t', 'nat'])),
};

for (const backendName of ['nft', 'iptables'] as const)
  describe(`controller end to end, --backend=${backendName} (CLI + API stand-in + kernel)`, function () {
    this.timeout(60_000);
    const scenario = new Scenario();
    let api: ApiStandIn;
    let dir: string;
    let kubeconfig: string;
    let controller: ChildProcess | undefined;
    let output = '';
    let extraServer: NamedServer | undefined;
    const pod = () => scenario.network.pod.ns;

    function startController(): ChildProcess {
      return spawnNodeProcess(
        shippedArgs([`--backend=${backendName}`, ...standInFlags(kubeconfig, '2s'), '--log-level', 'debug']),
        (text) => (output += text),
      );
    }

    /** SIGTERM, then the exit code, or the signal that ended the process. */
    async function stopController(): Promise<number | string | null> {
      if (!controller || controller.exitCode !== null) return controller?.exitCode ?? null;
      controller.kill('SIGTERM');
      const [code, signal] = (await once(controller, 'exit')) as [number | null, NodeJS.Signals | null];
      controller = undefined;
      return code ?? signal;
    }

    before(async () => {
      await scenario.setUp();
      scenario.network.bindAddress(NEW_LB);
      extraServer = await NamedServer.start(NEW_LB, 80, LB_PATH);
      api = await ApiStandIn.start({ bookmarkIntervalMs: 500 });
      dir = mkdtempSync(join(tmpdir(), 'e2e-'));
      kubeconfig = join(dir, 'kubeconfig');
      await api.writeKubeconfig(kubeconfig);
      api.apply(NODE_OBJECT);
    });

    after(async () => {
      await stopController();
      await api?.stop();
      await extraServer?.stop();
      try {
        sh(process.execPath, shippedArgs(['--cleanup']));
      } finally {
        rmSync(dir, { recursive: true, force: true });
        await scenario.tearDown();
      }
    });

    afterEach(function () {
      if (this.currentTest?.state === 'failed') console.log(`controller output:\n${output}`);
    });

    it('programs a Service that exists at start, and removes what another backend left', async () => {
      // Leftovers of the other backend, as after a switch of --backend.
      const other = backendName === 'nft' ? 'iptables' : 'nft';
      if (other === 'nft') sh('nft', ['add table ip ipvs-node-controller']);
      else
        sh('iptables-restore', ['--noflush', '-w'], '*nat\n:IPVS_OUTPUT - [0:0]\n-I OUTPUT 1 -j IPVS_OUTPUT\nCOMMIT\n');
      expect(KERNEL_OBJECTS[other]!(), 'leftover in place').to.equal(true);
      api.apply(serviceObject(LB_V4));
      controller = startController();
      await eventually(() => probe(pod(), 'tcp', LB_V4, 80), 'svc-a', 'pod to LoadBalancer IP');
      expect(await probe(undefined, 'tcp', LB_V4, 80)).to.equal('svc-a');
      expect(await probe(scenario.network.outside.ns, 'tcp', LB_V4, 80)).to.equal(LB_PATH);
      await eventually(async () => String(KERNEL_OBJECTS[other]!()), 'false', `${other} leftovers removed`);
      expect(KERNEL_OBJECTS[backendName]!()).to.equal(true);
    });

    it('follows a change of the ingress IP', async () => {
      api.apply(serviceObject(NEW_LB));
      await eventually(() => probe(pod(), 'tcp', NEW_LB, 80), 'svc-a', 'pod to the new LoadBalancer IP');
      await eventually(() => probe(pod(), 'tcp', LB_V4, 80), LB_PATH, 'the old IP is no longer translated');
    });

    it('keeps the rules while the API server is unreachable, and follows changes after it returns', async () => {
      api.setUnavailable(true);
      await sleep(2500); // longer than --sync-period: full resyncs run from the last known caches
      expect(await probe(pod(), 'tcp', NEW_LB, 80)).to.equal('svc-a');
      expect(output).to.match(/"resource":"services".*"msg":"Failed to list and watch, keeping the last rules"/);
      api.setUnavailable(false);
      api.apply(serviceObject(LB_V4));
      await eventually(() => probe(pod(), 'tcp', LB_V4, 80), 'svc-a', 'change after the API server returned');
    });

    it('loses no connection attempt while the controller restarts', async () => {
      const answers: string[] = [];
      let probing = true;
      const loop = (async () => {
        while (probing) answers.push(await probe(pod(), 'tcp', LB_V4, 80));
      })();
      await sleep(300);
      expect(await stopController(), 'SIGTERM exits 0').to.equal(0);
      await sleep(1000); // down: the rules stay in the kernel
      output = '';
      controller = startController();
      await eventually(async () => (/"msg":"Caches synced"/.test(output) ? 'synced' : 'waiting'), 'synced', 'restart');
      await sleep(500);
      probing = false;
      await loop;
      expect(answers.length, `made ${answers.length} attempts`).to.be.at.least(5);
      expect([...new Set(answers)], 'every attempt was translated').to.deep.equal(['svc-a']);
    });

    it('removes the translation of a deleted Service', async () => {
      expect(api.remove('Service', 'default', 'web')).to.equal(true);
      await eventually(() => probe(pod(), 'tcp', LB_V4, 80), LB_PATH, 'after delete');
      expect(await probe(undefined, 'tcp', LB_V4, 80)).to.equal(LB_PATH);
    });

    it('--cleanup removes our objects and exits 0, twice', async () => {
      expect(await stopController()).to.equal(0);
      expect(KERNEL_OBJECTS[backendName]!(), 'SIGTERM left the rules in place').to.equal(true);
      sh(process.execPath, shippedArgs(['--cleanup']));
      expect(KERNEL_OBJECTS.nft!()).to.equal(false);
      expect(KERNEL_OBJECTS.iptables!()).to.equal(false);
      sh(process.execPath, shippedArgs(['--cleanup']));
    });

    it('prints a --dry-run ruleset that the kernel tools accept', async () => {
      api.apply(serviceObject(LB_V4));
      // Asynchronously: the API stand-in runs in this process and must keep answering.
      const { stdout: text } = await execa(
        process.execPath,
        shippedArgs([
          `--backend=${backendName}`,
          ...['--dry-run', '--kubeconfig', kubeconfig, '--node-name', 'node-1'],
        ]),
      );
      if (backendName === 'nft') {
        expect(text).to.match(/192\.0\.2\.10 \. tcp \. 80 comment "default\/web" : 10\.96\.0\.10/);
        sh('nft', ['-c', '-f', '-'], text);
      } else {
        // The entry chain goes to the bucket of the address's last byte, which holds its rules.
        expect(text).to.match(/-A IPVS_OUTPUT -d 0\.0\.0\.10\/0\.0\.0\.255 -g IPVS_OUTPUT_10/);
        expect(text).to.match(
          /-A IPVS_OUTPUT_10 -d 192\.0\.2\.10\/32 -p tcp -m comment --comment "default\/web" .*-j DNAT --to-destination 10\.96\.0\.10/,
        );
        const ipv4Part = text.split('# ipv6')[0]!.replace(/^#.*$/gm, '');
        sh('iptables-restore', ['--test', '--noflush', '-w'], ipv4Part);
      }
    });
  });
