// A change made while our jump is being put back is programmed at once, not after the flow
// clean-up the repair asks for: that clean-up (conntrack listings, then one deletion per pinned
// flow) runs in the controller's conntrack client, outside the driver's writes. Here the clean-up
// is held up for as long as the test wants: the `conntrack` found first on PATH waits at a gate
// before it runs the real command, as a conntrack table of millions of entries makes every listing
// slow on a busy node. The change must be in the kernel while a clean-up command still waits
// (were the change queued behind the clean-up, it would come only once the clean-up's commands
// had been killed at their time limit).
// Both variants, through the controller and the API stand-in.

import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { pino } from 'pino';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import { composeReconciler } from '../../src/cli/compose.js';
import { assertIsolatedNetns, probe } from '../../testbed/node-network.js';
import { ControllerOnStandIn } from '../support/controller-on-stand-in.js';
import { wireLbService } from '../support/wire-objects.js';
import { installWriterChain, natSave, prependWriterJumps, removeWriterObjects } from '../support/kube-proxy-jump.js';
import { LB_V4, Scenario } from './scenario.js';

/** The runs of the gated conntrack (each logs its PID as it starts) whose process still lives. */
function runsUnderWay(log: string): number {
  const lines = existsSync(log) ? readFileSync(log, 'utf8').split('\n') : [];
  return lines.filter((l) => l.startsWith('start') && existsSync(`/proc/${l.split(' ')[1]}/cmdline`)).length;
}

for (const variant of ['nft', 'legacy'] as const) {
  describe(`iptables-${variant}: a change while our jump is put back`, function () {
    this.timeout(120_000);
    const scenario = new Scenario();
    let dir: string;
    let path: string | undefined;

    before(async () => {
      assertIsolatedNetns();
      await scenario.setUp();
      // kube-proxy's IPVS-mode shape: above ours, its chain ACCEPTs the load balancer IP.
      installWriterChain(variant, LB_V4, false);
      dir = mkdtempSync(join(tmpdir(), 'repair-latency-'));
      const real = execFileSync('sh', ['-c', 'command -v conntrack'], { encoding: 'utf8' }).trim();
      writeFileSync(
        join(dir, 'conntrack'),
        [
          '#!/bin/sh',
          `echo "start $$ $*" >> ${dir}/log`,
          // Deaf to a timeout's SIGTERM: only a SIGKILL or the gate ends the wait.
          "trap '' TERM",
          `while [ ! -e ${dir}/gate ]; do sleep 0.05; done`,
          `exec ${real} "$@"`,
          '',
        ].join('\n'),
      );
      chmodSync(join(dir, 'conntrack'), 0o755);
      path = process.env.PATH;
      process.env.PATH = `${dir}:${path ?? ''}`;
    });

    after(async () => {
      process.env.PATH = path;
      try {
        removeWriterObjects(variant);
      } finally {
        rmSync(dir, { recursive: true, force: true });
        await scenario.tearDown();
      }
    });

    it('is in the kernel while the clean-up of the flows the displacement pinned still waits', async () => {
      // As the composition root builds it: the conntrack clean-up (the gated command) subscribed.
      const backend = composeReconciler(new IptablesDriver(variant, { jumpCheckIntervalMs: 200 }), {
        logger: pino({ enabled: false }),
      });
      let running: ControllerOnStandIn | undefined;
      const log = join(dir, 'log');
      try {
        running = await ControllerOnStandIn.start(backend, [wireLbService('svc-a', '10.96.0.10', LB_V4)]);
        let ok = false;
        for (let i = 0; i < 100 && !ok; i++) ok = (await probe(undefined, 'tcp', LB_V4, 80, 500)) === 'svc-a';
        expect(ok, 'translated after the first sync').to.equal(true);
        expect(runsUnderWay(log), 'no conntrack run before the displacement').to.equal(0);

        // kube-proxy restarts: its jump goes first; ours is put back, and the clean-up starts and waits.
        prependWriterJumps(variant);
        // iptables-legacy paces its checks by what a listing costs (seconds in a slow guest).
        for (let i = 0; i < 4000 && runsUnderWay(log) === 0; i++) await sleep(50);
        expect(runsUnderWay(log), 'the clean-up of the repair is under way').to.equal(1);
        expect((backend.driver as IptablesDriver).jumpRepairs).to.be.at.least(1);

        // The change, and the kernel looked at until it holds it.
        running.api.apply(wireLbService('svc-new', '10.96.0.11', '192.0.2.99', { port: 8080 }));
        let programmed = false;
        let waiting = 0;
        for (let i = 0; i < 300 && !programmed; i++) {
          await sleep(50);
          programmed = natSave(variant).includes('default/svc-new');
          waiting = runsUnderWay(log);
        }
        expect(programmed, 'the new Service is programmed').to.equal(true);
        expect(waiting, 'a conntrack run of the clean-up still waited when the change was in the kernel').to.equal(1);

        // Let the clean-up go: it ends, and the translation is there from pods and the node.
        writeFileSync(join(dir, 'gate'), '');
        for (let i = 0; i < 200 && runsUnderWay(log) > 0; i++) await sleep(50);
        expect(runsUnderWay(log)).to.equal(0);
        expect(readFileSync(log, 'utf8')).to.match(/^start \d+ -L -f ipv4 -p tcp$/m);
        expect(await probe(scenario.network.pod.ns, 'tcp', LB_V4, 80)).to.equal('svc-a');
      } finally {
        await running?.stop();
        await backend.cleanup();
        rmSync(join(dir, 'gate'), { force: true });
        rmSync(log, { force: true });
      }
    });
  });
}
