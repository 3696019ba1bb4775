// Every branch of a sync through the reconciler and the nft driver, without root: the driver
// programs a fake executor that keeps a model of the tables and fails where the kernel would
// (test/doubles/fake-nft-executor.ts).

import { expect } from 'chai';
import { NftTimeoutError, type NftCliExecutor } from '../../src/backends/nft/executor.js';
import { FakeNftExecutor, commandsOf } from '../doubles/fake-nft-executor.js';
import { NftDriver } from '../../src/backends/nft/nft-driver.js';
import { Transaction } from '../../src/backends/nft/objects.js';
import {
  KEY_SET_NAME,
  MAP_NAME,
  OUTPUT_CHAIN,
  OWN_SOURCE_SET,
  SOURCE_CHECK_MAP,
  TABLE_NAME,
  mapElements,
  tableObjects,
} from '../../src/backends/nft/render.js';
import { Reconciler } from '../../src/reconciler/reconciler.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import type { DesiredState, ModelConfig, ServiceInfo } from '../../src/model/types.js';
import { CONFIG } from '../support/fixtures.js';

const NODE = { name: 'node-1', podCIDRs: ['10.244.1.0/24', 'fd01::/64'] };

function service(i: number, clusterIp = `10.96.0.${i}`): ServiceInfo {
  return {
    namespace: 'default',
    name: `svc-${i}`,
    type: 'LoadBalancer',
    creationTimestamp: '2024-01-01T00:00:00Z',
    clusterIP: clusterIp,
    clusterIPs: [clusterIp, `fd00::${i}`],
    ports: [{ port: 80, protocol: 'TCP' }],
    ingress: [{ ip: `192.0.2.${i}` }, { ip: `2001:db8::${i}` }],
  };
}

const state = (services: ServiceInfo[], config: Partial<ModelConfig> = {}): DesiredState =>
  buildDesiredState(services, NODE, { ...CONFIG, ...config });

function setUp(): { fake: FakeNftExecutor; backend: Reconciler } {
  const fake = new FakeNftExecutor();
  return { fake, backend: new Reconciler(new NftDriver(fake)) };
}

/** Another writer's transaction text, as JSON commands. */
const text = (tx: Transaction) => JSON.stringify(commandsOf(tx));
const deleteElement = (tx: Transaction, ...key: Array<string | number>) =>
  tx.delete(mapElements('ipv4', [{ key, value: '' }]));

const elements = (fake: FakeNftExecutor, family: 'ip' | 'ip6' = 'ip') =>
  [...(fake.mapElements(family, TABLE_NAME, MAP_NAME)?.entries() ?? [])].map(([k, v]) => `${k} ${String(v)}`).sort();

describe('the reconciler and the nft driver on the fake executor', () => {
  it('a first sync writes both families in one transaction', async () => {
    const { fake, backend } = setUp();
    const result = await backend.sync(state([service(1), service(2)]), { full: true });
    expect(result).to.deep.equal({ mode: 'full', entries: { ipv4: 2, ipv6: 2 }, rejected: [] });
    expect(fake.transactions).to.have.length(1);
    expect(elements(fake)).to.deep.equal([
      '{"concat":["192.0.2.1","tcp",80]} 10.96.0.1',
      '{"concat":["192.0.2.2","tcp",80]} 10.96.0.2',
    ]);
    expect(elements(fake, 'ip6')).to.have.length(2);
  });

  it('a partial sync writes only the changed elements', async () => {
    const { fake, backend } = setUp();
    await backend.sync(state([service(1), service(2)]), { full: true });
    const result = await backend.sync(state([service(1), service(3)]), { full: false });
    expect(result.mode).to.equal('partial');
    expect(result.fallbackReason).to.equal(undefined);
    const last = fake.transactions.at(-1)!;
    expect(last.operations.map((op) => op.verb)).to.deep.equal(['delete', 'add']);
    expect(elements(fake)).to.deep.equal([
      '{"concat":["192.0.2.1","tcp",80]} 10.96.0.1',
      '{"concat":["192.0.2.3","tcp",80]} 10.96.0.3',
    ]);
    expect((await backend.sync(state([service(1), service(3)]), { full: false })).mode).to.equal('noop');
  });

  it('a whole write through an executor that reads its sets writes their difference: the map is kept', async () => {
    const { fake, backend } = setUp();
    fake.readsElements = true;
    await backend.sync(state([service(1), service(2)]), { full: true });
    // A restart: a new reconciler's first sync writes both families whole.
    const before = fake.transactions.length;
    const restarted = new Reconciler(new NftDriver(fake));
    expect((await restarted.sync(state([service(1), service(3)]), { full: true })).mode).to.equal('full');
    const written = fake.transactions.slice(before);
    expect(written).to.have.length(1);
    const mapCommands = written[0]!.operations.flatMap(({ verb, object: o }) => {
      if (o.kind === 'element') return o.set === MAP_NAME ? [`${verb} ${o.family} ${o.elements.length}`] : [];
      return o.kind === 'map' && o.name === MAP_NAME ? [`${verb} ${o.family} map`] : [];
    });
    // Declared (kept as it is), one element removed and one added per family; never replaced.
    expect(mapCommands).to.deep.equal([
      'add ip map',
      'delete ip 1',
      'add ip 1',
      'add ip6 map',
      'delete ip6 1',
      'add ip6 1',
    ]);
    expect(elements(fake)).to.deep.equal([
      '{"concat":["192.0.2.1","tcp",80]} 10.96.0.1',
      '{"concat":["192.0.2.3","tcp",80]} 10.96.0.3',
    ]);
  });

  it("a partial sync goes to the executor's element write, which the nft command makes one JSON transaction", async () => {
    const { fake, backend } = setUp();
    await backend.sync(state([service(1), service(2)]), { full: true });
    const reads = fake.setReads;
    const written: string[] = [];
    const applyElements = fake.applyElements.bind(fake);
    fake.applyElements = (family, changes, target) => {
      written.push(`${family} -${changes.removed.length} +${changes.added.length} ${target?.map}`);
      return applyElements(family, changes, target);
    };
    expect((await backend.sync(state([service(1), service(3)]), { full: false })).mode).to.equal('partial');
    expect(written).to.deep.equal([`ip -1 +1 ${MAP_NAME}`, `ip6 -1 +1 ${MAP_NAME}`]);
    expect(fake.setReads, 'nothing read before an element write').to.equal(reads);
  });

  it('a partial sync before any full one falls back to a full sync, and says why', async () => {
    const { backend } = setUp();
    const result = await backend.sync(state([service(1)]), { full: false });
    expect(result.mode).to.equal('full');
    expect(result.fallbackReason).to.equal('not-programmed');
  });

  it('a partial sync after someone deleted the table falls back to a full sync', async () => {
    const { fake, backend } = setUp();
    await backend.sync(state([service(1)]), { full: true });
    await fake.run(new Transaction().delete(tableObjects('ipv4').table));
    const result = await backend.sync(state([service(1), service(2)]), { full: false });
    expect(result.mode).to.equal('full');
    expect(result.fallbackReason).to.equal('partial-failed');
    expect(elements(fake)).to.have.length(2);
  });

  it('a change of local-pod detection rewrites the table without the pod set', async () => {
    const { fake, backend } = setUp();
    await backend.sync(state([service(1)]), { full: true });
    const result = await backend.sync(
      state([service(1)], { detectLocalMode: 'InterfaceNamePrefix', podInterfaceNamePrefix: 'veth' }),
      { full: false },
    );
    expect(result.fallbackReason).to.equal('table-shape-changed');
    const table = fake.tables.get(`ip ${TABLE_NAME}`)!;
    expect([...table.sets.keys()].sort()).to.deep.equal([MAP_NAME, SOURCE_CHECK_MAP, OWN_SOURCE_SET].sort());
    expect(elements(fake)).to.have.length(1);
  });

  it('one family the kernel refuses neither blocks the other nor goes unreported', async () => {
    const { fake, backend } = setUp();
    fake.refuse = (tx) =>
      text(tx).includes('"ip6"') ? 'Error: Could not process rule: Operation not supported' : undefined;
    let error: Error | undefined;
    await backend.sync(state([service(1)]), { full: true }).catch((err: Error) => (error = err));
    expect(error?.message).to.match(/^nft sync failed: ip6: Error: Could not process rule: Operation not supported$/);
    expect(elements(fake)).to.have.length(1);
    // The refused family is written in full at the next sync, once the kernel takes it.
    fake.refuse = undefined;
    const result = await backend.sync(state([service(1)]), { full: false });
    expect(result).to.include({ mode: 'full', fallbackReason: 'not-programmed' });
    expect(elements(fake, 'ip6')).to.have.length(1);
  });

  it('a failed apply is an error, and the next sync writes everything again', async () => {
    const { fake, backend } = setUp();
    await backend.sync(state([service(1)]), { full: true });
    fake.refuse = () => 'Error: Could not process rule: Cannot allocate memory';
    let error: Error | undefined;
    await backend.sync(state([service(1), service(2)]), { full: false }).catch((err: Error) => (error = err));
    expect(error?.message).to.match(/Cannot allocate memory/);
    fake.refuse = undefined;
    const result = await backend.sync(state([service(1), service(2)]), { full: false });
    expect(result).to.include({ mode: 'full', fallbackReason: 'not-programmed' });
    expect(elements(fake)).to.have.length(2);
  });

  it('a resync keeps the table, and repairs only the elements and rules someone changed', async () => {
    const { fake, backend } = setUp();
    const desired = state([service(1), service(2), service(3)]);
    await backend.sync(desired, { full: true });
    const before = elements(fake);
    await fake.run(
      deleteElement(new Transaction(), '192.0.2.1', 'tcp', 80)
        .add(mapElements('ipv4', [{ key: ['203.0.113.1', 'udp', 53], value: '10.1.1.1' }]))
        .flush(tableObjects('ipv4').output),
    );
    const documents = fake.transactions.length;
    const result = await backend.sync(desired, { full: true });
    expect(result.mode).to.equal('full');
    expect(result.repairedElements).to.equal(3);
    expect(elements(fake)).to.deep.equal(before);
    expect(fake.tables.get(`ip ${TABLE_NAME}`)!.chains.get(OUTPUT_CHAIN)!.rules).to.have.length(2);
    // Never a table deleted on the way.
    for (const tx of fake.transactions.slice(documents)) expect(text(tx)).not.to.match(/"delete":\{"table"/);
    // Nothing drifted since the repair, and nobody else wrote: the next resync writes nothing.
    const repaired = fake.transactions.length;
    const quiet = await backend.sync(desired, { full: true });
    expect(quiet.repairedElements).to.equal(undefined);
    expect(fake.transactions).to.have.length(repaired);
  });

  it('hands freed memory back after every sync that wrote or verified a table whole, never after a partial one', async () => {
    const { fake, backend } = setUp();
    await backend.sync(state([service(1)]), { full: true });
    await backend.sync(state([service(1), service(2)]), { full: false });
    expect(fake.memoryReleases).to.equal(1);
    await backend.sync(state([service(1), service(2)]), { full: true });
    expect(fake.memoryReleases).to.equal(2);
    // A partial sync that had to write the table whole (another mark) is a full one.
    await backend.sync(state([service(1), service(2)], { masqueradeBit: 15 }), { full: false });
    expect(fake.memoryReleases).to.equal(3);
  });

  describe('resyncs answered by the ruleset generation', () => {
    function counted(fake: FakeNftExecutor): { listings: () => number } {
      let listings = 0;
      const list = fake.listTable.bind(fake);
      fake.listTable = (family, name) => {
        listings++;
        return list(family, name);
      };
      return { listings: () => listings };
    }
    const foreignTable = (name: string) => new Transaction().add({ kind: 'table', family: 'ip', name });

    it('a resync of tables nobody else wrote to lists nothing and commits nothing', async () => {
      const { fake, backend } = setUp();
      const { listings } = counted(fake);
      const desired = state([service(1), service(2)]);
      await backend.sync(desired, { full: true });
      await backend.sync(state([service(1), service(3)]), { full: false });
      const documents = fake.transactions.length;
      const result = await backend.sync(state([service(1), service(3)]), { full: true });
      expect(result.mode).to.equal('full');
      expect(listings()).to.equal(0);
      expect(fake.transactions).to.have.length(documents);
      expect(backend.verificationsSkipped).to.equal(2);
    });

    it('a resync carries the element changes it finds, and still lists nothing', async () => {
      const { fake, backend } = setUp();
      const { listings } = counted(fake);
      await backend.sync(state([service(1)]), { full: true });
      await backend.sync(state([service(1), service(2)]), { full: true });
      expect(listings()).to.equal(0);
      expect(elements(fake)).to.have.length(2);
    });

    it('any commit of another writer, even to another table, makes the next resync list; then trust is back', async () => {
      const { fake, backend } = setUp();
      const { listings } = counted(fake);
      const desired = state([service(1), service(2)]);
      await backend.sync(desired, { full: true });
      await fake.run(foreignTable('someone-else'));
      await backend.sync(desired, { full: true });
      expect(listings()).to.equal(2);
      await backend.sync(desired, { full: true });
      expect(listings()).to.equal(2);
    });

    it('another writer between two partial syncs is noticed, though each partial commit was ours alone', async () => {
      const { fake, backend } = setUp();
      const { listings } = counted(fake);
      await backend.sync(state([service(1)]), { full: true });
      await fake.run(deleteElement(new Transaction(), '192.0.2.1', 'tcp', 80));
      await backend.sync(state([service(1), service(2)]), { full: false });
      const result = await backend.sync(state([service(1), service(2)]), { full: true });
      expect(listings()).to.equal(2);
      expect(result.repairedElements).to.equal(1);
      expect(elements(fake)).to.have.length(2);
    });

    it('an executor that cannot read generations (the nft command) lists at every resync', async () => {
      const { fake, backend } = setUp();
      fake.readsGenerations = false;
      const { listings } = counted(fake);
      const desired = state([service(1)]);
      await backend.sync(desired, { full: true });
      await backend.sync(desired, { full: true });
      await backend.sync(desired, { full: true });
      expect(listings()).to.equal(4);
      expect(backend.verificationsSkipped).to.equal(0);
    });

    it('after a failed transaction the table is written whole, which the next resyncs trust', async () => {
      const { fake, backend } = setUp();
      const { listings } = counted(fake);
      await backend.sync(state([service(1)]), { full: true });
      fake.refuse = () => 'Error: Could not process rule: No such file or directory';
      await backend.sync(state([service(1), service(2)]), { full: false }).catch(() => undefined);
      fake.refuse = undefined;
      const documents = fake.transactions.length;
      await backend.sync(state([service(1), service(2)]), { full: true });
      expect(fake.transactions.slice(documents).map(text).join('')).to.match(/"delete":\{"map"/);
      await backend.sync(state([service(1), service(2)]), { full: true });
      expect(listings()).to.equal(0);
      expect(elements(fake)).to.have.length(2);
    });
  });

  it('a base chain changed by someone else makes the resync replace the table', async () => {
    const { fake, backend } = setUp();
    const desired = state([service(1)]);
    await backend.sync(desired, { full: true });
    const table = fake.tables.get(`ip ${TABLE_NAME}`)!;
    table.chains.get(OUTPUT_CHAIN)!.base!.prio = 0;
    fake.committedElsewhere();
    const result = await backend.sync(desired, { full: true });
    expect(result.mode).to.equal('full');
    expect(text(fake.transactions.at(-1)!)).to.match(/"delete":\{"table"/);
    expect(fake.tables.get(`ip ${TABLE_NAME}`)!.chains.get(OUTPUT_CHAIN)!.base!.prio).to.equal(-110);
    expect(elements(fake)).to.have.length(1);
  });

  it('the probe checks a full sync of an empty state and commits nothing', async () => {
    const { fake, backend } = setUp();
    expect(await backend.driver.probe()).to.deep.equal({
      ok: true,
      detail:
        'nftables via cli, keys looked up in the map (this kernel looks a map up as a set); source ranges filtered',
      nftKeyLookup: 'map',
    });
    expect(fake.tables.size).to.equal(0);
  });

  it('the probe finds a kernel that refuses the source-range set, and the driver then filters no sources', async () => {
    const fake = new FakeNftExecutor();
    const driver = new NftDriver(fake);
    const backend = new Reconciler(driver);
    // What Debian's 6.12.117 answered to a lookup of a concatenated interval set (the layout of
    // versions before 0.5): a kernel that refuses what filters sources.
    fake.refuse = (tx) => (text(tx).includes(`"right":"@${OWN_SOURCE_SET}"`) ? 'Operation not supported' : undefined);
    const probe = await backend.driver.probe();
    expect(probe.ok).to.equal(true);
    expect(probe.detail).to.include('source ranges not filtered');
    expect(driver.capabilities.filtersSources).to.equal(false);
    expect(backend.capabilities.filtersSources, 'what the controller reads').to.equal(false);
    expect(fake.tables.size).to.equal(0);
  });

  describe('on a kernel that refuses a map looked up as a set (Linux 6.1 and older)', () => {
    /** What those kernels answer: a rule that looks the map up without its data is EINVAL. */
    function refuseMapAsSet(fake: FakeNftExecutor): void {
      fake.refuse = (tx) =>
        /"match":\{"op":"==","left":\{"concat":[^}]*\}[^@]*"right":"@external-ip-to-cluster-ip"/.test(text(tx))
          ? 'Error: Could not process rule: Invalid argument'
          : undefined;
    }

    it('the probe finds the key set, says why, and commits nothing', async () => {
      const { fake, backend } = setUp();
      refuseMapAsSet(fake);
      const probe = await backend.driver.probe();
      expect(probe).to.include({ ok: true, nftKeyLookup: 'set' });
      expect(probe.detail).to.match(
        /refuses a map looked up as a set \(Error: Could not process rule: Invalid argument\)/,
      );
      expect(fake.tables.size).to.equal(0);
    });

    it('every sync keeps the key set equal to the map keys, a change in one transaction', async () => {
      const { fake, backend } = setUp();
      refuseMapAsSet(fake);
      await backend.sync(state([service(1), service(2)]), { full: true });
      const keys = () => [...(fake.mapElements('ip', TABLE_NAME, KEY_SET_NAME)?.keys() ?? [])].sort();
      const mapKeys = () => [...(fake.mapElements('ip', TABLE_NAME, MAP_NAME)?.keys() ?? [])].sort();
      expect(keys()).to.have.length(2).and.deep.equal(mapKeys());
      const before = fake.transactions.length;
      const result = await backend.sync(state([service(1), service(3)]), { full: false });
      expect(result.mode).to.equal('partial');
      // One transaction per family, each with the map's and the key set's changes.
      const written = fake.transactions.slice(before).map(text);
      expect(written).to.have.length(2);
      for (const tx of written)
        expect(tx).to.include('"name":"external-ip-keys"').and.include('"name":"external-ip-to-cluster-ip"');
      expect(keys()).to.deep.equal(['{"concat":["192.0.2.1","tcp",80]}', '{"concat":["192.0.2.3","tcp",80]}']);
      expect(keys()).to.deep.equal(mapKeys());
    });

    it('a resync repairs a key someone removed from the set and one someone added to it', async () => {
      const { fake, backend } = setUp();
      refuseMapAsSet(fake);
      await backend.sync(state([service(1), service(2)]), { full: true });
      const keySet = (elements: Array<{ key: Array<string | number>; value: string }>) =>
        ({ kind: 'element', family: 'ip', table: TABLE_NAME, set: KEY_SET_NAME, keys: true, elements }) as const;
      await fake.run(
        new Transaction()
          .delete(keySet([{ key: ['192.0.2.2', 'tcp', 80], value: '' }]))
          .add(keySet([{ key: ['192.0.2.9', 'tcp', 80], value: '' }])),
      );
      const result = await backend.sync(state([service(1), service(2)]), { full: true });
      expect(result.repairedElements, 'repaired').to.equal(2);
      expect([...(fake.mapElements('ip', TABLE_NAME, KEY_SET_NAME)?.keys() ?? [])].sort()).to.deep.equal([
        '{"concat":["192.0.2.1","tcp",80]}',
        '{"concat":["192.0.2.2","tcp",80]}',
      ]);
    });
  });

  it('cleanup removes both tables', async () => {
    const { fake, backend } = setUp();
    await backend.sync(state([service(1)]), { full: true });
    await backend.cleanup();
    expect(fake.tables.size).to.equal(0);
    await backend.cleanup();
  });

  it('skips a verification whose listing cannot finish, ten times in a row at most, then reads between its writes with the same bound', async () => {
    const fake = new FakeNftExecutor();
    let listings = 0;
    let busy = true;
    const busyLister = {
      listTable: async (family: 'ip' | 'ip6', name: string) => {
        listings++;
        if (busy) throw new NftTimeoutError('nft -j list table did not finish within 1001 ms');
        return fake.listTable(family, name);
      },
    } as unknown as NftCliExecutor;
    const backend = new Reconciler(new NftDriver(fake, { lister: busyLister }));
    const desired = state([service(1), service(2)]);
    await backend.sync(desired, { full: true });
    await fake.run(deleteElement(new Transaction(), '192.0.2.1', 'tcp', 80));
    for (let i = 0; i < 10; i++) {
      expect((await backend.sync(desired, { full: true })).repairedElements, `resync ${i + 1}`).to.equal(undefined);
    }
    expect(listings).to.equal(20); // both families
    // The eleventh lists between the backend's own writes, through the lister too (the addon's
    // libnftables would start again for as long as the other writer commits): it cannot finish
    // either, and says so.
    const eleventh = await backend.sync(desired, { full: true });
    expect(eleventh).to.deep.include({ mode: 'full', unverified: ['ipv4', 'ipv6'] });
    expect(eleventh.repairedElements).to.equal(undefined);
    expect(listings).to.equal(22);
    // Once the listing can finish, the next verification repairs.
    busy = false;
    const next = await backend.sync(desired, { full: true });
    expect(next.repairedElements).to.equal(1);
    expect(next.unverified).to.equal(undefined);
    expect(elements(fake)).to.have.length(2);
  });
});
