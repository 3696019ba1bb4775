// The comparison of a table listing with the programmed elements, on the event loop and in a
// worker (the same code): exact matches drop out, everything else comes back for the backend.

import { expect } from 'chai';
import { FakeNftExecutor } from '../doubles/fake-nft-executor.js';
import { diffListing, expectedLines } from '../../src/backends/nft/listing-diff.js';
import { Transaction } from '../../src/backends/nft/objects.js';
import { MAP_NAME, OUTPUT_CHAIN, TABLE_NAME, desiredTable } from '../../src/backends/nft/render.js';
import { writeTable } from '../../src/backends/nft/transactions.js';
import type { Entry } from '../../src/model/types.js';

function entry(i: number, clusterIp = `10.96.0.${i}`): Entry {
  return {
    family: 'ipv4',
    externalIp: `192.0.2.${i}`,
    protocol: 'TCP',
    port: 80,
    clusterIp,
    service: `default/svc-${i}`,
  };
}

/** The listing of a table programmed with `entries`. */
async function listingOf(entries: Entry[]): Promise<string> {
  const fake = new FakeNftExecutor();
  const t = desiredTable('ipv4', { entries, localPodMatch: { kind: 'cidrs', cidrs: [] } }, 0x4000);
  await fake.run(writeTable(new Transaction(), t));
  return (await fake.listTable('ip', TABLE_NAME))!;
}

for (const [where, offThreadAbove] of [
  ['on the event loop', Infinity],
  ['in a worker', 0],
] as const) {
  describe(`listing diff ${where}`, () => {
    it('finds nothing when the listing holds exactly the expected elements', async () => {
      const entries = [entry(1), entry(2), entry(3)];
      const diff = await diffListing(await listingOf(entries), await expectedLines(entries), MAP_NAME, offThreadAbove);
      expect(diff.unmatched).to.deep.equal([]);
      expect(diff.residue).to.deep.equal([]);
      // The source-range check, then the translation.
      expect(diff.rules[OUTPUT_CHAIN]).to.have.length(2);
    });

    it('returns the missing, the changed and the extra elements', async () => {
      const listing = await listingOf([entry(1), entry(2, '10.96.9.9'), entry(4)]);
      const expected = [entry(1), entry(2), entry(3)];
      const diff = await diffListing(listing, await expectedLines(expected), MAP_NAME, offThreadAbove);
      expect(diff.unmatched).to.deep.equal([1, 2]);
      expect(diff.residue.map((pair) => JSON.stringify(pair))).to.have.members([
        JSON.stringify([
          { elem: { val: { concat: ['192.0.2.2', 'tcp', 80] }, comment: 'default/svc-2' } },
          '10.96.9.9',
        ]),
        JSON.stringify([
          { elem: { val: { concat: ['192.0.2.4', 'tcp', 80] }, comment: 'default/svc-4' } },
          '10.96.0.4',
        ]),
      ]);
    });

    it('rejects a map element it cannot read', async () => {
      const listing = JSON.stringify({ nftables: [{ map: { name: MAP_NAME, elem: [['192.0.2.1', 'tcp']] } }] });
      let error: Error | undefined;
      await diffListing(listing, '', MAP_NAME, offThreadAbove).catch((err: Error) => (error = err));
      expect(error?.message).to.match(/unexpected map element/);
    });
  });
}
