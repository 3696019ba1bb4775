// Map element changes written as one netlink batch (the addon's writeElements, built with
// libnftnl) against the real kernel: what the kernel holds after them is what the JSON path
// writes, packets follow them, the ruleset generation is read around the commit, and a refusal
// comes back as an Error with the kernel's reason and leaves nothing written. Runs as root inside
// `unshare --net --mount` (test/run.mjs); refuses to run in the machine's own namespace.

import { Reconciler } from '../../src/reconciler/reconciler.js';
import { expect } from 'chai';
import { execa } from 'execa';
import { loadNftAddon, type NftAddonExecutor } from '../../src/backends/nft/addon-executor.js';
import { NftError } from '../../src/backends/nft/executor.js';
import { NftDriver } from '../../src/backends/nft/nft-driver.js';
import type { MapElement, NftFamily } from '../../src/backends/nft/objects.js';
import { Transaction } from '../../src/backends/nft/objects.js';
import { MAP_NAME, NFT_FAMILY, TABLE_NAME } from '../../src/backends/nft/render.js';
import { deleteTables } from '../../src/backends/nft/transactions.js';
import type { DesiredState, Entry, Family } from '../../src/model/types.js';
import { NamedServer, NodeNetwork, assertIsolatedNetns, probe } from '../../testbed/node-network.js';
import { rejectionOf } from '../support/assertions.js';

function addonExecutor(): NftAddonExecutor {
  const load = loadNftAddon();
  if (!load.executor) throw new Error(load.reason);
  if (!load.executor.writesElementBatches) throw new Error('the addon was built without libnftnl (writeElements)');
  return load.executor;
}

function entry(family: Family, externalIp: string, port: number, clusterIp: string, service: string): Entry {
  return { family, externalIp, protocol: 'TCP', port, clusterIp, service };
}

function state(ipv4: Entry[], ipv6: Entry[] = []): DesiredState {
  const pods = { kind: 'cidrs', cidrs: [] } as const;
  return {
    ipv4: { entries: ipv4, localPodMatch: pods },
    ipv6: { entries: ipv6, localPodMatch: pods },
    masqueradeMark: 0x4000,
  } as unknown as DesiredState;
}

type Listed = { nftables: Array<{ map?: { name: string; size?: number; elem?: unknown[] } }> };

/** The map of our table as `nft -j list table` shows it (elements sorted by their JSON). */
async function listedMap(family: NftFamily): Promise<{ size?: number; elem: string[] }> {
  const { stdout } = await execa('nft', ['-j', 'list', 'table', family, TABLE_NAME]);
  const map = (JSON.parse(stdout) as Listed).nftables.find((o) => o.map?.name === MAP_NAME)?.map;
  if (!map) expect.fail(`no map in ${family} ${TABLE_NAME}`);
  return { size: map.size, elem: (map.elem ?? []).map((e) => JSON.stringify(e)).sort() };
}

const dropTables = deleteTables(new Transaction(), ['ipv4', 'ipv6']);

describe('nft map elements as a netlink batch (libnftnl)', function () {
  this.timeout(60_000);
  before(() => assertIsolatedNetns());
  afterEach(async () => {
    await addonExecutor().run(dropTables);
  });

  it('writes what the JSON path writes, in both families, comments and protocols included', async () => {
    const executor = addonExecutor();
    const backend = new Reconciler(new NftDriver(executor));
    await backend.sync(state([]), { full: true });
    const elements: Record<NftFamily, MapElement[]> = {
      ip: [
        { key: ['198.51.100.7', 'tcp', 443], value: '10.96.0.10', comment: 'default/web' },
        { key: ['198.51.100.7', 'udp', 53], value: '10.96.0.11', comment: 'kube-system/dns' },
        { key: ['198.51.100.8', 'sctp', 65535], value: '10.96.0.12', comment: `${'n'.repeat(63)}/${'s'.repeat(63)}` },
        { key: ['198.51.100.9', 'tcp', 1], value: '10.96.0.13' },
      ],
      ip6: [
        { key: ['2001:db8::7', 'tcp', 443], value: 'fd00::10', comment: 'default/web' },
        { key: ['2001:db8:ffff:ffff:ffff:ffff:ffff:ffff', 'udp', 53], value: 'fd00::11', comment: 'a/b' },
      ],
    };
    for (const family of ['ip', 'ip6'] as const) {
      await executor.applyElements(family, { removed: [], added: elements[family] });
      expect(executor.lastElementBatch?.messages).to.equal(1);
      const batch = await listedMap(family);
      expect(batch.elem).to.have.length(elements[family].length);
      // The same elements through libnftables' JSON: the listing must be the same.
      const target = { family, table: TABLE_NAME };
      await executor.run(
        new Transaction()
          .flush({ kind: 'map', ...target, name: MAP_NAME, type: [], data: '' })
          .add({ kind: 'element', ...target, set: MAP_NAME, map: true, elements: elements[family] }),
      );
      expect(await listedMap(family)).to.deep.equal(batch);
      // Removals and additions in one transaction: one removed, one added back with a new value.
      const [first, second] = elements[family];
      await executor.applyElements(family, {
        removed: [first!, second!],
        added: [{ ...second!, value: family === 'ip' ? '10.96.0.99' : 'fd00::99' }],
      });
      const after = await listedMap(family);
      expect(after.elem).to.have.length(elements[family].length - 1);
      expect(after.elem.join()).to.include(family === 'ip' ? '"10.96.0.99"' : '"fd00::99"');
      expect(after.elem.join()).not.to.include(JSON.stringify(first!.key));
    }
  });

  it('writes many elements in several messages of one transaction', async () => {
    const executor = addonExecutor();
    await new Reconciler(new NftDriver(executor)).sync(state([]), { full: true });
    const added: MapElement[] = Array.from({ length: 1000 }, (_, i) => ({
      key: [`10.1.${i >> 8}.${i & 255}`, 'tcp', 80],
      value: '10.96.0.1',
      comment: `namespace-${i}/service-${i}`,
    }));
    const commit = await executor.applyElements('ip', { removed: [], added });
    expect(executor.lastElementBatch!.messages).to.be.above(1);
    expect(commit.generations!.after).to.equal(commit.generations!.before + 1);
    expect((await listedMap('ip')).elem).to.have.length(1000);
    await executor.applyElements('ip', { removed: added.slice(0, 600), added: [] });
    expect((await listedMap('ip')).elem).to.have.length(400);
  });

  it('reads the ruleset generation around the commit: one step for ours, more when another writer committed', async () => {
    const executor = addonExecutor();
    await new Reconciler(new NftDriver(executor)).sync(state([]), { full: true });
    const element: MapElement = { key: ['198.51.100.20', 'tcp', 80], value: '10.96.0.20', comment: 'a/b' };
    const before = await executor.generation();
    const commit = await executor.applyElements('ip', { removed: [], added: [element] });
    expect(commit.generations).to.deep.equal({ before, after: before! + 1 });
    // Another writer between two of ours: the next commit starts where that one left.
    await execa('nft', ['add', 'table', 'ip', 'someone-else']);
    const next = await executor.applyElements('ip', { removed: [element], added: [] });
    expect(next.generations!.before).to.equal(before! + 2);
    expect(next.generations!.after).to.equal(before! + 3);
    await execa('nft', ['delete', 'table', 'ip', 'someone-else']);
  });

  it("comes back as an Error with the kernel's reason and writes nothing when the kernel refuses", async () => {
    const executor = addonExecutor();
    await new Reconciler(new NftDriver(executor)).sync(state([]), { full: true });
    const good: MapElement = { key: ['198.51.100.30', 'tcp', 80], value: '10.96.0.30', comment: 'a/b' };
    // A map that does not exist.
    const missing = await rejectionOf(
      executor.applyElements('ip', { removed: [], added: [good] }, { table: TABLE_NAME, map: 'no-such-map' }),
    );
    expect(missing).to.be.instanceOf(NftError);
    expect(missing.message).to.match(/no-such-map: No such file or directory/);
    // Valid additions after a removal the kernel refuses (no such element): none is committed.
    const generation = await executor.generation();
    const refused = await rejectionOf(
      executor.applyElements('ip', {
        removed: [{ key: ['198.51.100.31', 'tcp', 80], value: '' }],
        added: [good, { ...good, key: ['198.51.100.32', 'tcp', 80] }],
      }),
    );
    expect(refused).to.be.instanceOf(NftError);
    expect(refused.message).to.match(/Could not delete elements of map ip .*: No such file or directory/);
    expect((await listedMap('ip')).elem).to.deep.equal([]);
    expect(await executor.generation()).to.equal(generation);
    // The same element added again with another value: refused as the JSON path is.
    await executor.applyElements('ip', { removed: [], added: [good] });
    const changed = await rejectionOf(
      executor.applyElements('ip', { removed: [], added: [{ ...good, value: '10.96.0.99' }] }),
    );
    expect(changed.message).to.match(/File exists/);
    expect((await listedMap('ip')).elem.join()).to.include('10.96.0.30');
  });

  it('moves packets: a partial sync through the batch sends a new LB IP to its ClusterIP', async () => {
    const network = new NodeNetwork();
    network.setUp();
    network.bindAddress('10.96.0.40');
    const server = await NamedServer.start('10.96.0.40', 8080, 'cluster-ip');
    try {
      const executor = addonExecutor();
      const backend = new Reconciler(new NftDriver(executor));
      const first = entry('ipv4', '198.51.100.40', 8080, '10.96.0.40', 'default/first');
      const second = entry('ipv4', '198.51.100.41', 8080, '10.96.0.40', 'default/second');
      await backend.sync(state([first]), { full: true });
      // The LB IPs are bound on kube-ipvs0, as kube-proxy binds them, and nothing listens on them:
      // only our DNAT brings a connection from the node to the server.
      network.bindAddress('198.51.100.40');
      network.bindAddress('198.51.100.41');
      expect(await probe(undefined, 'tcp', '198.51.100.40', 8080)).to.equal('cluster-ip');
      expect(await probe(undefined, 'tcp', '198.51.100.41', 8080)).not.to.equal('cluster-ip');
      executor.lastElementBatch = undefined;
      const result = await backend.sync(state([first, second]), { full: false });
      expect(result.mode).to.equal('partial');
      expect(executor.lastElementBatch, 'the change went as a netlink batch').not.to.equal(undefined);
      expect(await probe(undefined, 'tcp', '198.51.100.41', 8080)).to.equal('cluster-ip');
      await backend.sync(state([second]), { full: false });
      expect(await probe(undefined, 'tcp', '198.51.100.40', 8080)).not.to.equal('cluster-ip');
      expect((await listedMap(NFT_FAMILY.ipv4)).size).to.equal(1024);
    } finally {
      await server.stop();
      network.tearDown();
    }
  });

  it('writes a family whole as objects, then the map brought to its entries by one batch: elements of others go, one step when nobody else wrote', async () => {
    const executor = addonExecutor();
    const driver = new NftDriver(executor);
    const web = entry('ipv4', '198.51.100.30', 80, '10.96.0.30', 'default/web');
    const api = entry('ipv4', '198.51.100.31', 8080, '10.96.0.31', 'default/api');
    const whole = (ipv4: Entry[]) =>
      (['ipv4', 'ipv6'] as const).map((family) => ({
        kind: 'writeFamily' as const,
        family,
        state: state(ipv4)[family],
        masqueradeMark: 0x4000,
      }));
    await driver.apply(whole([web]));
    await execa('nft', ['add', 'element', 'ip', TABLE_NAME, MAP_NAME, '{ 198.51.100.99 . tcp . 1 : 10.96.0.99 }']);
    const before = await executor.generation();
    const applied = await driver.apply(whole([web, api]));
    // The last batch, the IPv6 map's: it holds what it must (nothing), so nothing is sent.
    expect(executor.lastMapWrite?.how).to.equal('difference');
    expect(executor.lastElementBatch?.messages, 'the last batch: the IPv6 map, nothing to change').to.equal(0);
    const map = await listedMap('ip');
    expect(map.elem.map((e) => (JSON.parse(e) as unknown[])[1])).to.have.members(['10.96.0.30', '10.96.0.31']);
    const after = await executor.generation();
    expect(after, 'the objects, then the IPv4 map (the empty IPv6 map commits nothing)').to.equal(before! + 2);
    expect(applied.generations).to.deep.equal({ before: after! - 1, after });
  });

  it('replaces the map with a larger one in the full write when the entries outgrow its size', async () => {
    const executor = addonExecutor();
    const backend = new Reconciler(new NftDriver(executor));
    const entries = (n: number) =>
      Array.from({ length: n }, (_, i) => entry('ipv4', `10.2.${i >> 8}.${i & 255}`, 80, '10.96.0.1', `default/s${i}`));
    await backend.sync(state(entries(10)), { full: true });
    expect((await listedMap('ip')).size).to.equal(1024);
    expect((await backend.sync(state(entries(1024)), { full: false })).mode).to.equal('partial');
    const grown = await backend.sync(state(entries(1025)), { full: false });
    expect(grown.mode).to.equal('full');
    expect(grown.fallbackReason).to.equal('table-shape-changed');
    const map = await listedMap('ip');
    expect(map.size).to.equal(4096);
    expect(map.elem).to.have.length(1025);
  });
});
