// What --dry-run prints is what a full sync programs: the nft text rendering, loaded into the
// kernel, gives exactly the table the JSON transaction gives, for every shape of the table,
// through both executors. Also: one family the kernel refuses does not block the other.
// Runs inside `unshare --net --mount` (test/run.mjs); refuses to run elsewhere.

import { Reconciler } from '../../src/reconciler/reconciler.js';
import { expect } from 'chai';
import { loadNftAddon } from '../../src/backends/nft/addon-executor.js';
import { NftCliExecutor, type NftExecutor } from '../../src/backends/nft/executor.js';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import {
  KEY_SET_NAME,
  MAP_NAME,
  NFT_FAMILY,
  TABLE_NAME,
  desiredTable,
  type KeyLookup,
} from '../../src/backends/nft/render.js';
import { deleteTables, writeTable } from '../../src/backends/nft/transactions.js';
import { Transaction } from '../../src/backends/nft/objects.js';
import { tableText } from '../../src/backends/nft/text.js';
import { NftDriver } from '../../src/backends/nft/nft-driver.js';
import type { DesiredState, Entry, Family, FamilyState, LocalPodMatch } from '../../src/model/types.js';
import { assertIsolatedNetns } from '../../testbed/node-network.js';
import { rejectionOf } from '../support/assertions.js';

const EXECUTORS: Array<{ kind: string; create: () => NftExecutor }> = [
  {
    kind: 'addon',
    create: () => {
      const load = loadNftAddon();
      if (!load.executor) throw new Error(load.reason);
      return load.executor;
    },
  },
  { kind: 'cli', create: () => new NftCliExecutor() },
];

function entries(family: Family, count: number): Entry[] {
  return Array.from({ length: count }, (_, i) => ({
    family,
    externalIp: family === 'ipv4' ? `198.18.${i >> 8}.${i & 255}` : `2001:db8::${i.toString(16)}`,
    protocol: (['TCP', 'UDP', 'SCTP'] as const)[i % 3]!,
    port: 80 + (i % 7),
    clusterIp: family === 'ipv4' ? `10.96.${i >> 8}.${i & 255}` : `fd00::${i.toString(16)}`,
    service: `ns-${i % 5}/svc-${i}`,
  }));
}

const MATCHES: Record<Family, LocalPodMatch[]> = {
  ipv4: [
    { kind: 'cidrs', cidrs: ['10.244.1.0/24', '10.245.0.0/16'] },
    { kind: 'interface', name: 'cni0' },
    { kind: 'interfacePrefix', prefix: 'veth' },
    { kind: 'none', reason: 'NodeCIDR mode: node n1 has no ipv4 podCIDR' },
  ],
  ipv6: [
    { kind: 'cidrs', cidrs: ['fd01::/64'] },
    { kind: 'none', reason: 'ClusterCIDR mode: no ipv6 --cluster-cidr' },
  ],
};

type Listed = Array<Record<string, Record<string, unknown>>>;

async function listed(executor: NftExecutor, family: Family): Promise<Listed> {
  const text = await executor.listTable(NFT_FAMILY[family], TABLE_NAME);
  if (!text) expect.fail('the table exists');
  return (JSON.parse(text) as { nftables: Listed }).nftables.filter((o) => !('metainfo' in o));
}

/**
 * The table without what differs between the two loads by design: handles and creation order,
 * and the comments of the set and the map, which libnftables 1.0.6 drops from JSON input.
 */
function comparable(objects: Listed): string[] {
  return objects
    .map((o) => {
      const [[kind, body]] = Object.entries(o) as [[string, Record<string, unknown>]];
      const { handle: _handle, ...rest } = body;
      if (kind === 'set' || kind === 'map') delete rest.comment;
      return JSON.stringify({ [kind]: rest });
    })
    .sort();
}

/** The dry-run text of one family as a transaction that replaces the table. */
function replacingText(family: Family, state: FamilyState, mark: number, lookup: KeyLookup = 'map'): string {
  const table = `${NFT_FAMILY[family]} ${TABLE_NAME}`;
  return `add table ${table}\ndelete table ${table}\n${tableText(desiredTable(family, state, mark, lookup))}`;
}

/** Loads nft text as one transaction (`nft -f`), as an operator would load the dry-run output. */
async function loadText(text: string): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'nft-text-'));
  try {
    await writeFile(join(dir, 'rules.nft'), text);
    await execa('nft', ['-f', join(dir, 'rules.nft')]);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

describe('nft full sync: dry-run text and JSON transaction', function () {
  this.timeout(60_000);
  before(() => assertIsolatedNetns());

  for (const { kind, create } of EXECUTORS) {
    describe(`through the ${kind} executor`, () => {
      let executor: NftExecutor;
      before(() => {
        executor = create();
      });
      afterEach(async () => {
        await executor.run(deleteTables(new Transaction(), ['ipv4', 'ipv6']));
      });

      for (const family of ['ipv4', 'ipv6'] as const) {
        it(`${family}, keys in a set beside the map (kernels that refuse the map's): the same table as the JSON rendering`, async () => {
          for (const count of [0, 1, 300]) {
            const state: FamilyState = { entries: entries(family, count), localPodMatch: MATCHES[family][0]! };
            await executor.run(writeTable(new Transaction(), desiredTable(family, state, 0x4000, 'set')));
            const fromJson = await listed(executor, family);
            await loadText(replacingText(family, { ...state, entries: entries(family, count + 1) }, 0x8, 'set'));
            await loadText(replacingText(family, state, 0x4000, 'set'));
            const fromText = await listed(executor, family);
            expect(comparable(fromText), `${count} entries`).to.deep.equal(comparable(fromJson));
            expect(fromText.filter((o) => o.set?.name === KEY_SET_NAME)).to.have.lengthOf(1);
          }
        });
        for (const match of MATCHES[family]) {
          it(`${family}, local pods by ${match.kind}: the same table as the JSON rendering`, async () => {
            for (const count of [0, 1, 300]) {
              const state: FamilyState = { entries: entries(family, count), localPodMatch: match };
              await executor.run(writeTable(new Transaction(), desiredTable(family, state, 0x4000)));
              const fromJson = await listed(executor, family);
              // Applied over another table: the text replaces the table, as every full sync does.
              await loadText(replacingText(family, { ...state, entries: entries(family, count + 1) }, 0x8));
              await loadText(replacingText(family, state, 0x4000));
              const fromText = await listed(executor, family);
              expect(comparable(fromText), `${count} entries`).to.deep.equal(comparable(fromJson));
              const comments = fromText.flatMap((o) => [o.set?.comment, o.map?.comment].filter((c) => c !== undefined));
              const declared = fromText.filter((o) => o.set ?? o.map);
              expect(declared.length, 'the map at least').to.be.greaterThan(0);
              expect(comments, 'every set and map keeps its comment').to.have.lengthOf(declared.length);
            }
          });
        }
      }

      it('Reconciler: one family the kernel refuses neither blocks the other nor goes unreported', async () => {
        const backend = new Reconciler(new NftDriver(executor));
        const desired = (ipv6Port: number): DesiredState => ({
          ipv4: { entries: entries('ipv4', 50), localPodMatch: MATCHES.ipv4[0]! },
          ipv6: { entries: [{ ...entries('ipv6', 1)[0]!, port: ipv6Port }], localPodMatch: MATCHES.ipv6[0]! },
          masqueradeMark: 0x4000,
          skips: [],
          conflicts: [],
        });
        const err = await rejectionOf(backend.sync(desired(70000), { full: true }));
        expect(err.message).to.match(/ip6: /);
        expect(err.message).to.not.match(/(^|; )ip: /);
        const ip4Map = (await listed(executor, 'ipv4')).find((o) => o.map?.name === MAP_NAME)?.map;
        expect(ip4Map?.elem, 'the IPv4 table is programmed').to.have.lengthOf(50);
        // The table may have been declared by a first step (the addon writes objects, then the
        // map's elements as a batch): nothing of the refused state is in its map.
        const ip6 = await executor.listTable('ip6', TABLE_NAME);
        const ip6Elements =
          ip6 === undefined
            ? []
            : (JSON.parse(ip6) as { nftables: Array<{ map?: { elem?: unknown[] } }> }).nftables.flatMap(
                (o) => o.map?.elem ?? [],
              );
        expect(ip6Elements, 'no IPv6 element is programmed').to.deep.equal([]);
        const result = await backend.sync(desired(443), { full: false });
        expect(result.mode, 'the family that failed is synced in full once it can be').to.equal('full');
        expect(await executor.listTable('ip6', TABLE_NAME))
          .to.be.a('string')
          .that.does.not.equal('');
      });
    });
  }
});
