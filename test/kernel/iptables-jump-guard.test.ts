// A kube-proxy restart prepends its jump to nat PREROUTING and OUTPUT; when its chain ACCEPTs
// the LoadBalancer IP (as kube-proxy's IPVS-mode chains do), our DNAT no longer runs. The
// iptables backend notices between syncs (none runs here at all) and moves its jump back to
// rule 1, writing nothing else. Real packets, both variants.

import { Reconciler } from '../../src/reconciler/reconciler.js';
import { expect } from 'chai';
import { setTimeout as sleep } from 'node:timers/promises';
import { pino } from 'pino';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import { composeReconciler } from '../../src/cli/compose.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import { probe } from '../../testbed/node-network.js';
import { ControllerOnStandIn } from '../support/controller-on-stand-in.js';
import { wireLbService } from '../support/wire-objects.js';
import {
  WRITER_CHAIN,
  installWriterChain,
  natRestore,
  natSave,
  prependWriterJumps,
  removeWriterObjects,
} from '../support/kube-proxy-jump.js';
import { CONFIG, LB_PATH, LB_V4, NODE_INFO, SERVICES, Scenario } from './scenario.js';

/** Rule lines of a chain with their `[packets:bytes]` counters. */
function countedRules(save: string, chain: string): Array<{ rule: string; packets: number }> {
  return save
    .split('\n')
    .map((l) => /^\[(\d+):\d+\] (-A (\S+).*)$/.exec(l))
    .filter((m): m is RegExpExecArray => m !== null && m[3] === chain)
    .map((m) => ({ rule: m[2]!, packets: Number(m[1]) }));
}

const withoutCounters = (save: string) => save.replace(/^\[\d+:\d+\] /gm, '');

const ruleSpecs = (save: string, chain: string) =>
  save.split('\n').filter((l) => l.startsWith(`-A ${chain} `) || l === `-A ${chain}`);

for (const variant of ['legacy', 'nft'] as const) {
  describe(`iptables-${variant}: our jump displaced from rule 1 between syncs`, function () {
    this.timeout(60_000);
    const scenario = new Scenario();
    const pod = () => scenario.network.pod.ns;
    const desired = buildDesiredState(SERVICES, NODE_INFO, CONFIG);

    before(async () => {
      await scenario.setUp();
      installWriterChain(variant, LB_V4);
    });

    after(async () => {
      try {
        await new Reconciler(new IptablesDriver(variant, { jumpCheckIntervalMs: 0 })).cleanup();
        removeWriterObjects(variant);
      } finally {
        await scenario.tearDown();
      }
    });

    afterEach(() => {
      // Each test starts with only our jump at rule 1 and the writer's chain not jumped to.
      removeWriterObjects(variant);
      installWriterChain(variant, LB_V4);
    });

    it('the writer blackholes the translation when nothing repairs it (the control)', async () => {
      const backend = new Reconciler(new IptablesDriver(variant, { jumpCheckIntervalMs: 0 }));
      await backend.sync(desired, { full: true });
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
      prependWriterJumps(variant);
      await sleep(2500);
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal(LB_PATH);
      expect(await probe(undefined, 'tcp', LB_V4, 80)).to.equal(LB_PATH);
      await backend.close();
    });

    it('moves our jump back to rule 1 within seconds, without a sync and without rewriting anything else', async () => {
      const backend = new Reconciler(new IptablesDriver(variant));
      try {
        await backend.sync(desired, { full: true });
        for (let i = 0; i < 3; i++) expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
        const before = natSave(variant, true);
        const ourRulesBefore = countedRules(before, 'IPVS_PREROUTING');
        expect(
          ourRulesBefore.some((r) => r.packets > 0),
          'our rules counted the probes',
        ).to.equal(true);

        prependWriterJumps(variant);
        const answers: string[] = [];
        let restored = false;
        for (let i = 0; i < 100 && !restored; i++) {
          const pod4 = await probe(pod(), 'tcp', LB_V4, 80, 500);
          const node4 = await probe(undefined, 'tcp', LB_V4, 80, 500);
          answers.push(`${pod4}/${node4}`);
          restored = pod4 === 'svc-a' && node4 === 'svc-a';
          if (!restored) await sleep(100);
        }
        expect(restored, `answers while displaced: ${answers.join(', ')}`).to.equal(true);
        expect((backend.driver as IptablesDriver).jumpRepairs).to.be.at.least(1);

        const after = natSave(variant, true);
        // Our jump is rule 1 again, the writer's stays right behind it; the rest is as it was.
        for (const [hook, ours] of [
          ['PREROUTING', 'IPVS_PREROUTING'],
          ['OUTPUT', 'IPVS_OUTPUT'],
        ] as const) {
          expect(ruleSpecs(natSave(variant), hook)).to.deep.equal([
            `-A ${hook} -j ${ours}`,
            `-A ${hook} -j ${WRITER_CHAIN}`,
          ]);
        }
        const chainsBefore = [...withoutCounters(before).matchAll(/^:(\S+)/gm)].map((m) => m[1]!);
        expect([...withoutCounters(after).matchAll(/^:(\S+)/gm)].map((m) => m[1]!)).to.deep.equal(chainsBefore);
        for (const chain of chainsBefore.filter((c) => c !== 'PREROUTING' && c !== 'OUTPUT')) {
          expect(ruleSpecs(withoutCounters(after), chain), chain).to.deep.equal(
            ruleSpecs(withoutCounters(before), chain),
          );
        }
        expect(ruleSpecs(natSave(variant), WRITER_CHAIN)).to.deep.equal([
          `-A ${WRITER_CHAIN} -d ${LB_V4}/32 -j ACCEPT`,
        ]);
        expect(ruleSpecs(natSave(variant), 'POSTROUTING')).to.deep.equal([
          '-A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE',
        ]);
        // Our chains were not rewritten: same rules, counters kept (a rewrite resets them).
        for (const chain of ['IPVS_PREROUTING', 'IPVS_OUTPUT']) {
          const was = countedRules(before, chain);
          const now = countedRules(after, chain);
          expect(now.map((r) => r.rule)).to.deep.equal(was.map((r) => r.rule));
          now.forEach((r, i) => expect(r.packets, r.rule).to.be.at.least(was[i]!.packets));
        }
      } finally {
        await backend.close();
      }
    });

    it('through the controller with a 60 s sync period: a probe loop sees the translation back within seconds', async () => {
      // As the composition root builds it, the conntrack clean-up subscribed.
      const backend = composeReconciler(new IptablesDriver(variant), { logger: pino({ enabled: false }) });
      let running: ControllerOnStandIn | undefined;
      try {
        running = await ControllerOnStandIn.start(backend, [wireLbService('svc-a', '10.96.0.10', LB_V4)]);
        const translated = async () =>
          (await probe(pod(), 'tcp', LB_V4, 80, 500)) === 'svc-a' &&
          (await probe(undefined, 'tcp', LB_V4, 80, 500)) === 'svc-a';
        let ok = false;
        for (let i = 0; i < 100 && !ok; i++) ok = await translated();
        expect(ok, 'translated after the first sync').to.equal(true);

        prependWriterJumps(variant);
        ok = false;
        for (let i = 0; i < 100 && !ok; i++) ok = await translated();
        expect(ok, 'translated again after the displacement').to.equal(true);
        expect((backend.driver as IptablesDriver).jumpRepairs).to.be.at.least(1);
      } finally {
        await running?.stop();
        await backend.close();
      }
    });

    it('leaves a writer that keeps a harmless jump above ours (a chain that only marks) alone, until it can take traffic', async () => {
      const harmless = 'CALI-PREROUTING';
      const backend = new Reconciler(new IptablesDriver(variant, { jumpCheckIntervalMs: 200 }));
      try {
        await backend.sync(desired, { full: true });
        natRestore(
          variant,
          [
            '*nat',
            `:${harmless} - [0:0]`,
            `-A ${harmless} -j MARK --or-mark 0x1000`,
            `-A ${harmless} -s 10.0.0.0/8 -j RETURN`,
            `-I PREROUTING 1 -j ${harmless}`,
            `-I OUTPUT 1 -j ${harmless}`,
            'COMMIT',
            '',
          ].join('\n'),
        );
        // Many rounds of the guard (every 0.2 s; iptables-nft: the generation moved once).
        await sleep(2500);
        expect((backend.driver as IptablesDriver).jumpRepairs).to.equal(0);
        expect(ruleSpecs(natSave(variant), 'PREROUTING')[0]).to.equal(`-A PREROUTING -j ${harmless}`);
        expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
        expect(await probe(undefined, 'tcp', LB_V4, 80)).to.equal('svc-a');
        // A full resync finds nothing to repair either.
        expect((await backend.sync(desired, { full: true })).repairedElements).to.equal(undefined);
        expect(ruleSpecs(natSave(variant), 'OUTPUT')[0]).to.equal(`-A OUTPUT -j ${harmless}`);

        // Now its chain ACCEPTs the load balancer IP: our jump goes back above it.
        natRestore(variant, ['*nat', `-A ${harmless} -d ${LB_V4}/32 -j ACCEPT`, 'COMMIT', ''].join('\n'));
        const driver = backend.driver as IptablesDriver;
        let first = '';
        for (let i = 0; i < 300 && (first !== '-A PREROUTING -j IPVS_PREROUTING' || driver.jumpRepairs === 0); i++) {
          await sleep(100);
          first = ruleSpecs(natSave(variant), 'PREROUTING')[0] ?? '';
        }
        expect(first).to.equal('-A PREROUTING -j IPVS_PREROUTING');
        expect((backend.driver as IptablesDriver).jumpRepairs).to.be.at.least(1);
        expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
      } finally {
        await backend.close();
        const lines = ['*nat'];
        for (const hook of ['PREROUTING', 'OUTPUT']) {
          if (ruleSpecs(natSave(variant), hook).includes(`-A ${hook} -j ${harmless}`))
            lines.push(`-D ${hook} -j ${harmless}`);
        }
        natRestore(variant, [...lines, `:${harmless} - [0:0]`, `-X ${harmless}`, 'COMMIT', ''].join('\n'));
      }
    });

    it('stops checking when the backend is closed', async () => {
      const backend = new Reconciler(new IptablesDriver(variant, { jumpCheckIntervalMs: 200 }));
      await backend.sync(desired, { full: true });
      await backend.close();
      prependWriterJumps(variant);
      await sleep(1500);
      expect(ruleSpecs(natSave(variant), 'PREROUTING')[0]).to.equal(`-A PREROUTING -j ${WRITER_CHAIN}`);
      expect((backend.driver as IptablesDriver).jumpRepairs).to.equal(0);
    });
  });
}
