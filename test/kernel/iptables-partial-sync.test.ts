// The iptables backend writes nothing for a partial sync whose state is the one it wrote last,
// also right after a change (the model's `changes` differ then), and logs each entry it leaves
// out once per change of them. Both variants, on the kernel.

import { Reconciler } from '../../src/reconciler/reconciler.js';
import { expect } from 'chai';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import { DesiredStateModel } from '../../src/model/desired-state.js';
import { assertIsolatedNetns, sh } from '../../testbed/node-network.js';
import { CONFIG, NODE_INFO, SERVICES } from './scenario.js';
import { linesLogger } from '../support/log-lines.js';

for (const variant of ['legacy', 'nft'] as const) {
  describe(`iptables-${variant}: partial syncs and rejected entries`, function () {
    this.timeout(30_000);
    const logLines: string[] = [];
    const logger = linesLogger(logLines);
    let backend: Reconciler;

    before(() => {
      assertIsolatedNetns();
      backend = new Reconciler(new IptablesDriver(variant, { logger, jumpCheckIntervalMs: 0 }));
    });
    after(async () => {
      await backend.cleanup();
    });

    it('a partial sync after a change writes nothing when the state comes again', async () => {
      const model = new DesiredStateModel(CONFIG);
      expect((await backend.sync(model.update(SERVICES.slice(1), NODE_INFO), { full: true })).mode).to.equal('full');
      const changed = model.update(SERVICES, NODE_INFO);
      expect((await backend.sync(changed, { full: false })).mode).to.equal('full');
      const before = sh(`iptables-${variant}-save`, ['-t', 'nat', '-c']);
      const again = model.update(SERVICES, NODE_INFO);
      expect(again.ipv4.changes?.since).to.equal(changed.ipv4.entries);
      expect((await backend.sync(again, { full: false })).mode).to.equal('noop');
      expect(sh(`iptables-${variant}-save`, ['-t', 'nat', '-c']).replace(/^#.*$/gm, '')).to.equal(
        before.replace(/^#.*$/gm, ''),
      );
    });

    it('logs what it leaves out once, not at every sync, and reports it in the result', async () => {
      // The model takes an interface name as given; the renderer refuses what iptables would misread.
      const config = { ...CONFIG, detectLocalMode: 'BridgeInterface' as const, podBridgeInterface: 'cni"0' };
      const model = new DesiredStateModel(config);
      logLines.length = 0;
      const first = await backend.sync(model.update(SERVICES, NODE_INFO), { full: true });
      expect((backend.driver as IptablesDriver).rejected.map((r) => `${r.family} ${r.item}`)).to.deep.equal([
        'ipv4 pod bridge interface',
        'ipv6 pod bridge interface',
      ]);
      expect(first.entries.ipv4).to.be.greaterThan(0);
      await backend.sync(model.update(SERVICES, NODE_INFO), { full: true });
      await backend.sync(model.update(SERVICES, NODE_INFO), { full: false });
      const logged = logLines.filter(
        (l) => l.includes('"item":"pod bridge interface"') && l.includes('"msg":"Left out of the iptables rules"'),
      );
      expect(logged).to.have.length(2);
      expect(logged[0]).to.include('read literally');
    });
  });
}
