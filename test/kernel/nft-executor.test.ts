// Both nft executors (in-process libnftables addon and the nft CLI) against the real kernel.
// Runs as root inside a network namespace of its own (test/run.mjs wraps mocha in
// `unshare --net --mount`); it refuses to run in the machine's own namespace.

import { Reconciler } from '../../src/reconciler/reconciler.js';
import { spawn } from 'node:child_process';
import { readlinkSync } from 'node:fs';
import { readdir, readFile } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import { expect } from 'chai';
import { execa } from 'execa';
import {
  NftAddonExecutor,
  defaultAddonPath,
  loadNftAddon,
  type NftablesAddon,
} from '../../src/backends/nft/addon-executor.js';
import {
  LISTED_ELEMENT_BYTES,
  MAX_LISTED_ELEMENTS,
  MAX_LISTING_BYTES,
  NftCliExecutor,
  NftError,
  NftTimeoutError,
  type NftExecutor,
} from '../../src/backends/nft/executor.js';
import { expectedLines, listAndDiff } from '../../src/backends/nft/listing-diff.js';
import { NftDriver } from '../../src/backends/nft/nft-driver.js';
import { KEY_SET_NAME, MAP_NAME, TABLE_NAME, mapElement } from '../../src/backends/nft/render.js';
import { Transaction, type ElementObject, type NftFamily, type TableObject } from '../../src/backends/nft/objects.js';
import type { DesiredState, Entry, Family } from '../../src/model/types.js';
import { assertIsolatedNetns } from '../../testbed/node-network.js';
import { rejectionOf } from '../support/assertions.js';

const TEST_TABLE = 'nft-executor-test';
const TEST_MAP = 'address-port-to-address';

function addonExecutor(): NftExecutor {
  const load = loadNftAddon();
  if (!load.executor) throw new Error(load.reason);
  return load.executor;
}

const EXECUTORS: Array<{ kind: 'addon' | 'cli'; create: () => NftExecutor }> = [
  { kind: 'addon', create: addonExecutor },
  { kind: 'cli', create: () => new NftCliExecutor() },
];

/** 10.a.b.c for element i, so that every element has its own key. */
function elementAddress(i: number): string {
  return `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
}

function addElements(indexes: number[]): ElementObject {
  const elements = indexes.map((i) => ({ key: [elementAddress(i), 80], value: '192.0.2.1' }));
  return { kind: 'element', family: 'ip', table: TEST_TABLE, set: TEST_MAP, map: true, elements };
}

function addElementsDocument(indexes: number[]): Transaction {
  return new Transaction().add(addElements(indexes));
}

const testTable: TableObject = { kind: 'table', family: 'ip', name: TEST_TABLE };

function testTableDocument(elementCount: number): Transaction {
  const tx = new Transaction().add(testTable, {
    kind: 'map',
    family: 'ip',
    table: TEST_TABLE,
    name: TEST_MAP,
    type: ['ipv4_addr', 'inet_service'],
    data: 'ipv4_addr',
  });
  if (elementCount > 0) tx.add(addElements(Array.from({ length: elementCount }, (_, i) => i)));
  return tx;
}

const deleteTestTable = new Transaction().add(testTable).delete(testTable);

type ListedObject = Record<string, { name?: string; elem?: unknown[] } | undefined>;

/** The elements of one map in an `nft -j list table` listing, as `key : value` text, sorted. */
function mapElements(listing: string, mapName: string): string[] {
  const objects = (JSON.parse(listing) as { nftables: ListedObject[] }).nftables;
  const map = objects.map((o) => o.map).find((m) => m?.name === mapName);
  if (!map) expect.fail(`map ${mapName} is not in the listing`);
  const keyText = (key: unknown): string => {
    const k = key as { elem?: { val: unknown }; concat?: unknown[] };
    if (k.elem) return keyText(k.elem.val);
    if (k.concat) return k.concat.join(' . ');
    return String(key);
  };
  return (map.elem ?? [])
    .map((e) => {
      const [key, value] = e as [unknown, unknown];
      return `${keyText(key)} : ${String(value)}`;
    })
    .sort();
}

function entry(
  family: Family,
  externalIp: string,
  protocol: Entry['protocol'],
  port: number,
  clusterIp: string,
): Entry {
  return { family, externalIp, protocol, port, clusterIp, service: `default/svc-${port}` };
}

function desiredState(ipv4: Entry[], ipv6: Entry[]): DesiredState {
  return {
    ipv4: { entries: ipv4, localPodMatch: { kind: 'cidrs', cidrs: ['10.244.1.0/24'] } },
    ipv6: { entries: ipv6, localPodMatch: { kind: 'cidrs', cidrs: ['fd00:10:244:1::/64'] } },
    masqueradeMark: 0x4000,
    skips: [],
    conflicts: [],
  };
}

function expectedElements(entries: Entry[]): string[] {
  return entries.map((e) => `${e.externalIp} . ${e.protocol.toLowerCase()} . ${e.port} : ${e.clusterIp}`).sort();
}

async function kernelElements(executor: NftExecutor, family: 'ip' | 'ip6'): Promise<string[]> {
  const listing = await executor.listTable(family, TABLE_NAME);
  if (listing === undefined) expect.fail(`table ${family} ${TABLE_NAME} does not exist`);
  return mapElements(listing, MAP_NAME);
}

before(assertIsolatedNetns);

for (const { kind, create } of EXECUTORS) {
  describe(`nft executor (${kind}) on the kernel`, function () {
    this.timeout(60_000);
    let executor: NftExecutor;

    before(() => {
      executor = create();
      expect(executor.kind).to.equal(kind);
    });

    afterEach(async () => {
      await executor.run(deleteTestTable);
      await new Reconciler(new NftDriver(executor)).cleanup();
    });

    it('runs a transaction and lists it back', async () => {
      await executor.run(testTableDocument(3));
      const listing = await executor.listTable('ip', TEST_TABLE);
      if (listing === undefined) expect.fail('expected listing !== undefined');
      expect(mapElements(listing, TEST_MAP)).to.deep.equal([
        '10.0.0.0 . 80 : 192.0.2.1',
        '10.0.0.1 . 80 : 192.0.2.1',
        '10.0.0.2 . 80 : 192.0.2.1',
      ]);
    });

    it('lists a table that does not exist as undefined', async () => {
      expect(await executor.listTable('ip', TEST_TABLE)).to.equal(undefined);
      expect(await executor.listTable('ip6', TEST_TABLE)).to.equal(undefined);
    });

    it("rejects a bad table family with nft's message", async () => {
      const bad = new Transaction().add({ ...testTable, family: 'bogus' as NftFamily });
      const err = await rejectionOf(executor.run(bad), NftError);
      expect(err.message).to.match(/Error: Unknown family 'bogus'/);
    });

    it('rolls back the whole transaction when one command fails', async () => {
      const partlyBad = new Transaction().add(testTable, {
        kind: 'element',
        family: 'ip',
        table: TEST_TABLE,
        set: 'no-such-map',
        elements: [{ address: '10.0.0.1', length: 32 }],
      });
      expect((await rejectionOf(executor.run(partlyBad))).message).to.match(/No such file or directory/);
      expect(await executor.listTable('ip', TEST_TABLE)).to.equal(undefined);
    });

    it('check mode validates without committing', async () => {
      await executor.check(testTableDocument(3));
      expect(await executor.listTable('ip', TEST_TABLE)).to.equal(undefined);
      // Nothing checked is taken as existing afterwards, in check mode or for real.
      const intoCheckedMap = addElementsDocument([1]);
      expect((await rejectionOf(executor.check(intoCheckedMap))).message).to.match(/No such file or directory/);
      expect((await rejectionOf(executor.run(intoCheckedMap))).message).to.match(/No such file or directory/);
      expect(await executor.listTable('ip', TEST_TABLE)).to.equal(undefined);
    });

    it('serves concurrent transactions and listings', async () => {
      await executor.run(testTableDocument(0));
      const settled = await Promise.all([
        ...Array.from({ length: 20 }, (_, i) => executor.run(addElementsDocument([i]))),
        executor.listTable('ip', TEST_TABLE),
      ]);
      expect(typeof settled[20]).to.equal('string');
      const listing = await executor.listTable('ip', TEST_TABLE);
      if (listing === undefined) expect.fail('expected listing !== undefined');
      expect(mapElements(listing, TEST_MAP)).to.have.lengthOf(20);
    });

    it('keeps the event loop running during a 50,000-element transaction', async () => {
      const document = testTableDocument(50_000);
      let ticks = 0;
      const timer = setInterval(() => ticks++, 1);
      try {
        await executor.run(document);
      } finally {
        clearInterval(timer);
      }
      expect(ticks, 'no timer fired while the transaction ran').to.be.above(0);
      const listing = await executor.listTable('ip', TEST_TABLE);
      if (listing === undefined) expect.fail('expected listing !== undefined');
      expect(mapElements(listing, TEST_MAP)).to.have.lengthOf(50_000);
    });

    it('Reconciler: full sync, then a partial sync of the changed elements', async () => {
      const backend = new Reconciler(new NftDriver(executor));
      const web4 = entry('ipv4', '192.0.2.10', 'TCP', 80, '10.96.0.10');
      const dns4 = entry('ipv4', '192.0.2.11', 'UDP', 53, '10.96.0.11');
      const web6 = entry('ipv6', '2001:db8::10', 'TCP', 443, 'fd00:96::10');
      const full = await backend.sync(desiredState([web4, dns4], [web6]), { full: true });
      expect(full.mode).to.equal('full');
      expect(await kernelElements(executor, 'ip')).to.deep.equal(expectedElements([web4, dns4]));
      expect(await kernelElements(executor, 'ip6')).to.deep.equal(expectedElements([web6]));

      // One removed, one moved to another ClusterIP, one added; ipv6 unchanged.
      const dns4Moved = { ...dns4, clusterIp: '10.96.0.99' };
      const sctp4 = entry('ipv4', '192.0.2.12', 'SCTP', 3868, '10.96.0.12');
      const partial = await backend.sync(desiredState([dns4Moved, sctp4], [web6]), { full: false });
      expect(partial.mode).to.equal('partial');
      expect(await kernelElements(executor, 'ip')).to.deep.equal(expectedElements([dns4Moved, sctp4]));
      expect(await kernelElements(executor, 'ip6')).to.deep.equal(expectedElements([web6]));
    });

    it('reads a map and its key set as the lines of the netlink dump, a missing set as undefined', async () => {
      const ip6 = [
        entry('ipv6', '2001:db8::30', 'TCP', 443, 'fd00:96::31'),
        // nft and inet_ntop print this one `::1.2.3.4`: read as the model writes it.
        entry('ipv6', '::102:304', 'UDP', 53, 'fd00:96::30'),
        { ...entry('ipv6', '2001:db8::31', 'SCTP', 3868, 'fd00:96::32'), service: 'tenant-a/diameter' },
      ];
      await new Reconciler(new NftDriver(executor, { lookup: 'set' })).sync(desiredState([], ip6), { full: true });
      const sets = [
        { name: MAP_NAME, kind: 'map' as const },
        { name: KEY_SET_NAME, kind: 'keys' as const },
        { name: 'no-such-set', kind: 'keys' as const },
      ];
      const read = await executor.readSets('ip6', TABLE_NAME, sets);
      // One element a line (the dump ends each with a newline).
      const lines = (text: string | undefined) =>
        text
          ?.split('\n')
          .filter((l) => l !== '')
          .sort();
      expect(lines(read.sets[0])).to.deep.equal([
        '2001:db8::30 tcp 443 fd00:96::31 default/svc-443',
        '2001:db8::31 sctp 3868 fd00:96::32 tenant-a/diameter',
        '::102:304 udp 53 fd00:96::30 default/svc-53',
      ]);
      expect(lines(read.sets[1])).to.deep.equal(['2001:db8::30 tcp 443', '2001:db8::31 sctp 3868', '::102:304 udp 53']);
      expect(read.sets[2]).to.equal(undefined);
      // The addon's dump reads the same lines.
      const dumped = await addonExecutor().readSets('ip6', TABLE_NAME, sets);
      expect(dumped.sets.map(lines)).to.deep.equal(read.sets.map(lines));
      // A generation where the executor reads one: the addon, not the nft command.
      expect(read.generation === undefined).to.equal(kind === 'cli');
      expect((await executor.readSets('ip', 'no-such-table', [sets[0]!])).sets).to.deep.equal([undefined]);
    });

    it('replaceElements writes the difference with what the map and its key set hold: an element that stays is not written', async () => {
      const [kept, moved, gone, added] = [30, 31, 32, 33].map((i) =>
        entry('ipv4', `192.0.2.${i}`, 'TCP', 80, `10.96.0.${i}`),
      ) as [Entry, Entry, Entry, Entry];
      await new Reconciler(new NftDriver(executor, { lookup: 'set' })).sync(desiredState([kept, moved, gone], []), {
        full: true,
      });
      const wanted = [kept, { ...moved, clusterIp: '10.96.0.99' }, added];
      // What is written to the map and its key set: `verb set count`.
      const written: string[] = [];
      const run = executor.run.bind(executor);
      executor.run = (tx) => {
        for (const { verb, object: o } of tx.operations) {
          if (o.kind === 'element') written.push(`${verb} ${o.set} ${o.elements.length}`);
          if ((o.kind === 'map' || o.kind === 'set') && verb !== 'add') written.push(`${verb} ${o.name}`);
        }
        return run(tx);
      };
      try {
        const target = { table: TABLE_NAME, map: MAP_NAME, keySet: KEY_SET_NAME };
        await executor.replaceElements('ip', wanted.map(mapElement), target);
      } finally {
        executor.run = run;
      }
      if (executor instanceof NftAddonExecutor) {
        // A netlink batch: nothing went through run.
        expect(written).to.deep.equal([]);
        expect(executor.lastMapWrite).to.include({ how: 'difference', kept: 1 });
        expect(executor.lastElementBatch).to.include({ removed: 2, added: 2, keysRemoved: 1, keysAdded: 1 });
      } else {
        expect(written).to.deep.equal([
          `delete ${KEY_SET_NAME} 1`,
          `delete ${MAP_NAME} 2`,
          `add ${MAP_NAME} 2`,
          `add ${KEY_SET_NAME} 1`,
        ]);
      }
      expect(await kernelElements(executor, 'ip')).to.deep.equal(expectedElements(wanted));
      const keys = await executor.readSets('ip', TABLE_NAME, [{ name: KEY_SET_NAME, kind: 'keys' }]);
      expect(
        keys.sets[0]
          ?.split('\n')
          .filter((l) => l !== '')
          .sort(),
      ).to.deep.equal(wanted.map((e) => `${e.externalIp} tcp 80`).sort());
    });

    it('Reconciler: a partial sync after someone deleted the table falls back to a full sync', async () => {
      const backend = new Reconciler(new NftDriver(executor));
      const web4 = entry('ipv4', '192.0.2.20', 'TCP', 80, '10.96.0.20');
      const web6 = entry('ipv6', '2001:db8::20', 'TCP', 80, 'fd00:96::20');
      await backend.sync(desiredState([web4], [web6]), { full: true });

      await execa('nft', ['delete', 'table', 'ip', TABLE_NAME]);
      expect(await executor.listTable('ip', TABLE_NAME)).to.equal(undefined);

      const api4 = entry('ipv4', '192.0.2.21', 'TCP', 8080, '10.96.0.21');
      const result = await backend.sync(desiredState([web4, api4], [web6]), { full: false });
      expect(result.mode).to.equal('full');
      expect(await kernelElements(executor, 'ip')).to.deep.equal(expectedElements([web4, api4]));
      expect(await kernelElements(executor, 'ip6')).to.deep.equal(expectedElements([web6]));
    });
  });
}

describe('the nftables addon and the ruleset generation (kernel)', () => {
  before(function () {
    assertIsolatedNetns();
  });
  afterEach(async () => {
    await execa('nft', ['delete', 'table', 'ip', TEST_TABLE]).catch(() => undefined);
  });

  it('reports the generation around each commit; another writer moves it, a listing or check does not', async () => {
    const executor = addonExecutor();
    const first = await executor.run(testTableDocument(3));
    const g = first && first.generations;
    expect(g, 'generations of a commit').to.not.equal(undefined);
    expect(g!.after).to.equal(g!.before + 1);
    expect(await executor.generation!()).to.equal(g!.after);
    await executor.listTable('ip', TEST_TABLE);
    await executor.check(addElementsDocument([7]));
    expect(await executor.generation!(), 'after a listing and a check').to.equal(g!.after);
    await execa('nft', ['add', 'table', 'ip', 'another-writer']);
    await execa('nft', ['delete', 'table', 'ip', 'another-writer']);
    expect(await executor.generation!(), 'after two commits of another process').to.equal(g!.after + 2);
    const next = await executor.run(addElementsDocument([8]));
    expect(next && next.generations).to.deep.equal({ before: g!.after + 2, after: g!.after + 3 });
  });

  it('takes the generation from the kernel only: an answer forged by another netlink socket is ignored', async () => {
    // A process of its own: its addon's socket has read one generation (sequence 1) when the
    // forged answer to the next request (sequence 2) is queued on it, ahead of the kernel's.
    const child = spawn(
      process.execPath,
      [
        '-e',
        `const addon = require(${JSON.stringify(defaultAddonPath())});
         const lines = require('node:readline').createInterface({ input: process.stdin });
         addon.generation().then((g) => {
           console.log(g);
           lines.once('line', () => addon.generation().then((h) => { console.log(h); process.exit(0); }));
         });`,
      ],
      { stdio: ['pipe', 'pipe', 'inherit'] },
    );
    const out = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
    try {
      const real = Number((await out.next()).value);
      expect(real).to.be.at.least(0);
      // The port of the child's own NETLINK_NETFILTER socket, from /proc/net/netlink by inode: not
      // one it inherited from this process (libmnl opens libnftables' socket without CLOEXEC).
      const socketInodes = async (pid: number) =>
        (await readdir(`/proc/${pid}/fd`))
          .map((fd) => {
            try {
              return readlinkSync(`/proc/${pid}/fd/${fd}`, { encoding: 'utf8' });
            } catch {
              return '';
            }
          })
          .flatMap((target) => /^socket:\[(\d+)\]$/.exec(target)?.[1] ?? []);
      const inherited = new Set(await socketInodes(process.pid));
      const inodes = new Set((await socketInodes(child.pid!)).filter((inode) => !inherited.has(inode)));
      const ports = (await readFile('/proc/net/netlink', 'utf8'))
        .split('\n')
        .map((line) => line.trim().split(/\s+/))
        .filter((f) => f[1] === '12' && inodes.has(f[9] ?? ''))
        .map((f) => Number(f[2]));
      expect(ports, 'the addon socket of the child').to.have.length(1);
      // NFT_MSG_NEWGEN (subsystem 10, message 15), sequence 2, NFTA_GEN_ID = 0x7a7a7a7a.
      const forge = [
        'import socket, struct',
        'attr = struct.pack("=HH", 8, 1) + struct.pack("!I", 0x7a7a7a7a)',
        'body = struct.pack("=BBH", 0, 0, 0) + attr',
        'msg = struct.pack("=IHHII", 16 + len(body), (10 << 8) | 15, 0, 2, 0) + body',
        's = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)',
        `s.sendto(msg, (${ports[0]}, 0))`,
      ].join('\n');
      await execa('python3', ['-c', forge]);
      child.stdin!.write('next\n');
      const second = Number((await out.next()).value);
      expect(second, 'the forged generation').to.not.equal(0x7a7a7a7a);
      expect(second, "the kernel's, unchanged").to.equal(real);
    } finally {
      child.kill();
    }
  });

  it('Reconciler: a resync after another process changed our map lists and repairs; one with no other writer lists nothing', async () => {
    const executor = addonExecutor();
    let listings = 0;
    const backend = new Reconciler(
      new NftDriver(executor, {
        lister: {
          listTable: (family, name) => {
            listings++;
            return new NftCliExecutor().listTable(family, name);
          },
        },
      }),
    );
    const web4 = entry('ipv4', '192.0.2.10', 'TCP', 80, '10.96.0.10');
    const api4 = entry('ipv4', '192.0.2.21', 'TCP', 8080, '10.96.0.21');
    const state = desiredState([web4, api4], []);
    try {
      await backend.sync(state, { full: true });
      await backend.sync(state, { full: true });
      expect(listings, 'nobody else wrote').to.equal(0);
      await execa('nft', ['delete', 'element', 'ip', TABLE_NAME, MAP_NAME, '{ 192.0.2.21 . tcp . 8080 }']);
      const repaired = await backend.sync(state, { full: true });
      expect(listings, 'another process wrote').to.equal(2);
      expect(repaired.repairedElements).to.equal(1);
      expect(await kernelElements(executor, 'ip')).to.deep.equal(expectedElements([web4, api4]));
      await backend.sync(state, { full: true });
      expect(listings, 'the repair left the map exact').to.equal(2);
    } finally {
      await backend.cleanup();
    }
  });
});

describe('the listing bound, on the kernel', function () {
  this.timeout(60_000);
  const cli = new NftCliExecutor();
  const widest = (i: number): Entry => ({
    family: 'ipv6',
    externalIp: `2001:db8:ffff:ffff:ffff:ffff:${(0x1000 + (i >> 12)).toString(16)}:${(0x1000 + (i & 0xfff)).toString(16)}`,
    protocol: 'SCTP',
    port: 65535,
    clusterIp: `fd00:96:ffff:ffff:ffff:ffff:ffff:${(0x1000 + (i & 0xfff)).toString(16)}`,
    // The longest a Service's namespace/name can be: two DNS labels of 63 characters.
    service: `${'n'.repeat(63)}/${'s'.repeat(63)}`,
  });
  const entries = Array.from({ length: 2000 }, (_, i) => widest(i));
  let backend: Reconciler;
  let listingBytes: number;
  /** What nft prints: the listing and its newline. */
  const printed = () => listingBytes + 1;

  before(async () => {
    // Our own table, as the backend writes it, with 2,000 of the widest elements nft can print.
    backend = new Reconciler(new NftDriver(cli));
    await backend.sync(desiredState([], entries), { full: true });
    listingBytes = Buffer.byteLength((await cli.listTable('ip6', TABLE_NAME))!);
    expect(listingBytes).to.be.above(256 << 10);
  });
  after(() => backend.cleanup());

  it(`covers ${MAX_LISTED_ELEMENTS} of the widest elements, at the bytes nft prints per element`, async () => {
    await backend.sync(desiredState([], []), { full: true });
    const empty = Buffer.byteLength((await cli.listTable('ip6', TABLE_NAME))!);
    await backend.sync(desiredState([], entries), { full: true });
    const perElement = (listingBytes - empty) / entries.length;
    expect(perElement, 'bytes per listed element').to.be.at.most(LISTED_ELEMENT_BYTES);
    expect(perElement).to.be.above(LISTED_ELEMENT_BYTES * 0.9);
    expect(MAX_LISTING_BYTES).to.be.at.least(MAX_LISTED_ELEMENTS * perElement * 1.2 + empty);
    // A table the controller can program is read whole by every path.
    expect(await cli.listTable('ip6', TABLE_NAME)).to.have.length(listingBytes);
    expect(await addonExecutor().listTable('ip6', TABLE_NAME)).to.have.length(listingBytes);
  });

  const tooLarge =
    /^nft -j list table ip6 ipvs-node-controller: the listing is larger than 256 KiB, more than this controller programs \(300,000 elements\); it was not read$/;

  it('the nft command: a longer listing is an error, not read', async () => {
    const error = await new NftCliExecutor('nft', 256 << 10).listTable('ip6', TABLE_NAME).catch((err: unknown) => err);
    expect(error).to.be.instanceOf(NftError);
    expect((error as Error).message).to.match(tooLarge);
    expect(await new NftCliExecutor('nft', printed()).listTable('ip6', TABLE_NAME)).to.have.length(listingBytes);
  });

  it("the nft command's readSets: a longer listing of a set or a slower one is an error, not read", async () => {
    const sets = [{ name: MAP_NAME, kind: 'map' as const }];
    const error = await new NftCliExecutor('nft', 64 << 10)
      .readSets('ip6', TABLE_NAME, sets)
      .catch((err: unknown) => err);
    expect(error).to.be.instanceOf(NftError);
    expect((error as Error).message).to.equal(
      `nft -j list map ip6 ${TABLE_NAME} ${MAP_NAME}: the listing is larger than 64 KiB; it was not read`,
    );
    const slow = await new NftCliExecutor('nft', MAX_LISTING_BYTES, 1)
      .readSets('ip6', TABLE_NAME, sets)
      .catch((err: unknown) => err);
    expect(slow).to.be.instanceOf(NftTimeoutError);
    const read = await new NftCliExecutor('nft', printed()).readSets('ip6', TABLE_NAME, sets);
    expect(read.sets[0]?.split('\n')).to.have.length(entries.length);
  });

  it('the nft command from the comparing worker: a longer listing is an error, not read', async () => {
    const expected = await expectedLines(entries);
    const error = await listAndDiff('nft', 'ip6', TABLE_NAME, expected, MAP_NAME, 10_000, 256 << 10).catch(
      (err: unknown) => err,
    );
    expect(error).to.be.instanceOf(NftError);
    expect((error as Error).message).to.match(tooLarge);
    const diff = await listAndDiff('nft', 'ip6', TABLE_NAME, expected, MAP_NAME, 10_000, printed());
    expect(diff?.unmatched).to.deep.equal([]);
    expect(diff?.residue).to.deep.equal([]);
  });

  it('the addon: a longer listing is an error, and no string is made of it', async () => {
    const addon = (addonExecutor() as unknown as { addon: NftablesAddon }).addon;
    const error = await new NftAddonExecutor(addon, 256 << 10)
      .listTable('ip6', TABLE_NAME)
      .catch((err: unknown) => err);
    expect(error).to.be.instanceOf(NftError);
    expect((error as Error).message).to.match(tooLarge);
    const raw = await addon.list('ip6', TABLE_NAME, 256 << 10).catch((err: unknown) => err);
    expect(raw).to.include({ code: 'ERR_LISTING_TOO_LARGE' });
    expect(await new NftAddonExecutor(addon, printed()).listTable('ip6', TABLE_NAME)).to.have.length(listingBytes);
    expect(() => addon.list('ip6', TABLE_NAME, 0)).to.throw(RangeError, 'maxBytes must be at least 1');
  });
});
