// Partial syncs find their changes by identity: from the model's change hints, or by walking the
// programmed entries. Through random changes of Services, the kernel map must always hold exactly
// the desired entries. Runs inside `unshare --net --mount` (test/run.mjs); refuses elsewhere.

import { Reconciler } from '../../src/reconciler/reconciler.js';
import { expect } from 'chai';
import { loadNftAddon } from '../../src/backends/nft/addon-executor.js';
import { NftDriver } from '../../src/backends/nft/nft-driver.js';
import { MAP_NAME, NFT_FAMILY, TABLE_NAME } from '../../src/backends/nft/render.js';
import { DesiredStateModel } from '../../src/model/desired-state.js';
import type { DesiredState, Family, NodeInfo } from '../../src/model/types.js';
import { assertIsolatedNetns } from '../../testbed/node-network.js';
import { CONFIG, churnServiceMaker, churnServices, seededRandom } from '../support/fixtures.js';

const NODE: NodeInfo = { name: 'n1', podCIDRs: ['10.244.1.0/24', 'fd01::/64'] };

type Listed = {
  nftables: Array<{ map?: { name: string; elem?: Array<[{ elem: { val: { concat: unknown[] } } }, string]> } }>;
};

/** The map's elements as `ip proto port clusterIp`, sorted. */
async function kernelElements(backend: Reconciler, family: Family): Promise<string[]> {
  const text = await (backend.driver as NftDriver).executor.listTable(NFT_FAMILY[family], TABLE_NAME);
  if (!text) expect.fail(`the ${family} table exists`);
  const map = (JSON.parse(text) as Listed).nftables.find((o) => o.map?.name === MAP_NAME)?.map;
  return (map?.elem ?? []).map(([key, value]) => `${key.elem.val.concat.join(' ')} ${value}`).sort();
}

function desiredElements(d: DesiredState, family: Family): string[] {
  return d[family].entries.map((e) => `${e.externalIp} ${e.protocol.toLowerCase()} ${e.port} ${e.clusterIp}`).sort();
}

describe('nft partial syncs driven by the model', function () {
  this.timeout(120_000);
  before(() => assertIsolatedNetns());

  it('keep the kernel map equal to the desired entries through random changes', async () => {
    const load = loadNftAddon();
    if (!load.executor) throw new Error(load.reason);
    const backend = new Reconciler(new NftDriver(load.executor));
    const rnd = seededRandom(5);
    const makeService = churnServiceMaker(rnd, { clusterV4: '10.96', clusterV6: 'fd00::', ingressV6: '2001:db8::' });
    const model = new DesiredStateModel(CONFIG);
    let services = Array.from({ length: 200 }, makeService);
    try {
      let partial = 0;
      for (let step = 0; step < 60; step++) {
        const desired = model.update(services, NODE);
        const result = await backend.sync(desired, { full: step === 0 });
        if (result.mode === 'partial') partial++;
        for (const family of ['ipv4', 'ipv6'] as const) {
          expect(await kernelElements(backend, family), `step ${step}, ${family}`).to.deep.equal(
            desiredElements(desired, family),
          );
        }
        services = churnServices(services, step, rnd, makeService);
      }
      expect(partial, `most syncs were partial (${partial})`).to.be.above(40);
    } finally {
      await backend.cleanup();
    }
  });
});
