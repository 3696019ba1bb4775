// Partial syncs find their changes by identity: from the model's change hints, or by walking the
// programmed entries. Through random changes of Services, the kernel map must always hold exactly
// the desired entries. Runs inside `unshare --net --mount` (test/run.mjs); refuses elsewhere.

import { Reconciler } from '../../src/reconciler/reconciler.js';
import { expect } from 'chai';
import { loadNftAddon } from '../../src/backends/nft/addon-executor.js';
import { NftDriver } from '../../src/backends/nft/nft-driver.js';
import { KEY_SET_NAME, MAP_NAME, NFT_FAMILY, TABLE_NAME, type KeyLookup } from '../../src/backends/nft/render.js';
import type { DesiredState, Family, NodeInfo } from '../../src/model/types.js';
import { assertIsolatedNetns } from '../../testbed/node-network.js';
import { churnedSyncs } from '../support/fixtures.js';

const NODE: NodeInfo = { name: 'n1', podCIDRs: ['10.244.1.0/24', 'fd01::/64'] };

type Listed = {
  nftables: Array<{
    map?: { name: string; elem?: Array<[{ elem: { val: { concat: unknown[] } } }, string]> };
    set?: { name: string; elem?: Array<{ concat: unknown[] }> };
  }>;
};

/** The map's elements as `ip proto port clusterIp`, sorted; the key set's keys as `ip proto port`. */
async function kernelElements(backend: Reconciler, family: Family): Promise<{ map: string[]; keys?: string[] }> {
  const text = await (backend.driver as NftDriver).executor.listTable(NFT_FAMILY[family], TABLE_NAME);
  if (!text) expect.fail(`the ${family} table exists`);
  const items = (JSON.parse(text) as Listed).nftables;
  const map = items.find((o) => o.map?.name === MAP_NAME)?.map;
  const keySet = items.find((o) => o.set?.name === KEY_SET_NAME)?.set;
  return {
    map: (map?.elem ?? []).map(([key, value]) => `${key.elem.val.concat.join(' ')} ${value}`).sort(),
    ...(keySet ? { keys: (keySet.elem ?? []).map((key) => key.concat.join(' ')).sort() } : {}),
  };
}

function desiredElements(d: DesiredState, family: Family): string[] {
  return d[family].entries.map((e) => `${e.externalIp} ${e.protocol.toLowerCase()} ${e.port} ${e.clusterIp}`).sort();
}

describe('nft partial syncs driven by the model', function () {
  this.timeout(120_000);
  before(() => assertIsolatedNetns());

  for (const lookup of ['map', 'set'] as const satisfies readonly KeyLookup[]) {
    it(`keep the kernel map (and the key set) equal to the desired entries through random changes: keys in the ${lookup}`, async () => {
      const load = loadNftAddon();
      if (!load.executor) throw new Error(load.reason);
      const backend = new Reconciler(new NftDriver(load.executor, { lookup }));
      const addresses = { clusterV4: '10.96', clusterV6: 'fd00::', ingressV6: '2001:db8::' };
      try {
        const partial = await churnedSyncs(
          (d, o) => backend.sync(d, o),
          NODE,
          5,
          addresses,
          async (desired, step) => {
            for (const family of ['ipv4', 'ipv6'] as const) {
              const want = desiredElements(desired, family);
              const keys = want.map((line) => line.split(' ').slice(0, 3).join(' ')).sort();
              expect(await kernelElements(backend, family), `step ${step}, ${family}`).to.deep.equal(
                lookup === 'set' ? { map: want, keys } : { map: want },
              );
            }
          },
        );
        expect(partial, `most syncs were partial (${partial})`).to.be.above(40);
      } finally {
        await backend.cleanup();
      }
    });
  }
});
