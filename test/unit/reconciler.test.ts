// The reconciler on a fake driver, without root: what a verification repairs when a partial sync
// writes between its read and its repair.

import { expect } from 'chai';
import { buildDesiredState } from '../../src/model/desired-state.js';
import type { DesiredState, NodeInfo } from '../../src/model/types.js';
import { Reconciler } from '../../src/reconciler/reconciler.js';
import { FakeDriver } from '../doubles/fake-driver.js';
import { CONFIG, lbService } from '../support/fixtures.js';

const NODE: NodeInfo = { name: 'node-1', podCIDRs: ['10.244.1.0/24'] };

function desired(...numbers: number[]): DesiredState {
  return buildDesiredState(
    numbers.map((i) => lbService(i)),
    NODE,
    CONFIG,
  );
}

describe('Reconciler on a fake driver (no root)', () => {
  for (const readsAlongsideWrites of [false, true]) {
    it(`repairs a shape with what is programmed when the repair runs, not with what was read (${
      readsAlongsideWrites ? 'read alongside our writes' : 'read between our writes'
    })`, async () => {
      const driver = new FakeDriver('iptables', { readsAlongsideWrites });
      driver.writesLikeIptables = true;
      const reconciler = new Reconciler(driver);
      await reconciler.sync(desired(1, 2), { full: true });
      // Another writer changed our chains: the next full sync finds the shape changed.
      driver.kernel.get('ipv4')!.shape = 'changed by another writer';
      let partial: Promise<unknown> | undefined;
      driver.duringRead = () => {
        driver.duringRead = undefined;
        // A Service comes while the verification reads: its partial sync is asked for now.
        partial = reconciler.sync(desired(1, 2, 3), { full: false });
      };
      const full = await reconciler.sync(desired(1, 2), { full: true });
      const change = await partial;
      expect(full).to.include({ mode: 'full', repairedElements: 1 });
      expect(change).to.include({ mode: 'partial' });
      expect(driver.held('ipv4')).to.deep.equal([
        '192.0.2.1 TCP 80 -> 10.96.0.1',
        '192.0.2.2 TCP 80 -> 10.96.0.2',
        '192.0.2.3 TCP 80 -> 10.96.0.3',
      ]);
      // And the next full sync of the same state finds nothing to repair.
      const again = await reconciler.sync(desired(1, 2, 3), { full: true });
      expect(again.repairedElements ?? 0).to.equal(0);
    });
  }
});
