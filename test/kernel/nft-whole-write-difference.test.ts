// A whole write over a table that already holds elements writes only the difference: the elements
// that stay are never deleted and added back (element-diff.ts: the kernels nodes run miss such an
// element's lookups while the transaction commits). The map and its key set through the addon's
// netlink dump and batch (what the batch carried is what the addon reports of what the kernel
// acknowledged; a batch with nothing to change commits nothing, which the ruleset generation
// shows), or through the nft command's listings and a JSON transaction (its element commands);
// the source-range sets through the JSON transaction (its element commands). What the
// kernel holds afterwards is listed by nft. (`nft monitor` 1.0.6 is no witness: it prints no
// element of a concatenated interval set, and loses others.) Packets: nft-whole-write-packets.
// Runs as root inside `unshare --net --mount` (test/run.mjs); refuses to run in the machine's own
// namespace.

import { execFileSync } from 'node:child_process';
import { expect } from 'chai';
import { execa } from 'execa';
import {
  NftAddonExecutor,
  loadNftAddon,
  type ElementBatchResult,
  type NftablesAddon,
} from '../../src/backends/nft/addon-executor.js';
import { NftCliExecutor, type NftExecutor } from '../../src/backends/nft/executor.js';
import { NftDriver } from '../../src/backends/nft/nft-driver.js';
import { Transaction } from '../../src/backends/nft/objects.js';
import {
  KEY_SET_NAME,
  MAP_NAME,
  OWN_SOURCE_SET,
  SOURCE_CHAIN_PREFIX,
  SOURCE_CHECK_MAP,
  sourceChainName,
  TABLE_NAME,
  type KeyLookup,
} from '../../src/backends/nft/render.js';
import { deleteTables } from '../../src/backends/nft/transactions.js';
import type { FamilyShape } from '../../src/driver/driver.js';
import { canonicalAddress } from '../../src/model/ip.js';
import type { DesiredState, Entry, Family, FamilyState } from '../../src/model/types.js';
import { assertIsolatedNetns, sh } from '../../testbed/node-network.js';
import { ipv6Entries } from '../support/fixtures.js';

function addon(): NftablesAddon {
  const load = loadNftAddon();
  if (!load.executor) throw new Error(load.reason);
  if (!load.executor.addon.readSets) throw new Error('the addon was built without libnftnl (readSets)');
  return load.executor.addon;
}

/** The addon's batches, recorded as they come back (the real addon, its results kept). */
function recording(real: NftablesAddon): { addon: NftablesAddon; batches: ElementBatchResult[] } {
  const batches: ElementBatchResult[] = [];
  const writeElements: NftablesAddon['writeElements'] = async (...args) => {
    const result = await real.writeElements!(...args);
    batches.push(result);
    return result;
  };
  return { addon: { ...real, writeElements }, batches };
}

/** The transactions `executor` runs from now on, kept as it runs them. */
function transactionsOf(executor: NftExecutor): Transaction[] {
  const sent: Transaction[] = [];
  const run = executor.run.bind(executor);
  executor.run = (tx) => {
    sent.push(tx);
    return run(tx);
  };
  return sent;
}

function familyState(entries: Entry[], podCidr: string): FamilyState {
  const state: FamilyState = { entries, localPodMatch: { kind: 'cidrs', cidrs: [podCidr] } };
  if (entries.some((e) => e.sourceRanges)) state.sourceRanged = true;
  return state;
}

/** `n` entries of 198.18.x.y:443/TCP, each to its ClusterIP. */
function entries(n: number): Entry[] {
  return Array.from({ length: n }, (_, i) => ({
    family: 'ipv4' as Family,
    externalIp: `198.18.${i >> 8}.${i & 255}`,
    protocol: 'TCP' as const,
    port: 443,
    clusterIp: `10.97.${i >> 8}.${i & 255}`,
    service: `filler/svc-${i}`,
  }));
}

function writeWhole(driver: NftDriver, ipv4: Entry[], ipv6: Entry[] = []) {
  const state = {
    ipv4: familyState(ipv4, '10.244.1.0/24'),
    ipv6: familyState(ipv6, 'fd01::/64'),
    masqueradeMark: 0x4000,
  } as DesiredState;
  return driver.apply(
    (['ipv4', 'ipv6'] as const).map((family) => ({
      kind: 'writeFamily' as const,
      family,
      state: state[family],
      masqueradeMark: 0x4000,
    })),
  );
}

type Elem = { elem?: { val: unknown; comment?: string } } | { concat: unknown[] };

/** The elements of one of our sets or maps as nft lists them, as sorted text. */
function listed(kind: 'map' | 'set', name: string, family: 'ip' | 'ip6' = 'ip'): string[] {
  const listing = execFileSync('nft', ['-j', 'list', kind, family, TABLE_NAME, name], { maxBuffer: 64 << 20 });
  const doc = JSON.parse(listing.toString()) as {
    nftables: Array<Record<string, { elem?: unknown[] }>>;
  };
  const elems = doc.nftables.find((o) => o[kind])?.[kind]?.elem ?? [];
  return elems
    .map((e) => {
      const [key, value] = kind === 'map' ? (e as [Elem, string]) : [e as Elem, undefined];
      const wrapped = 'elem' in key ? key.elem : undefined;
      const val = (wrapped ? wrapped.val : key) as { concat: unknown[] };
      const text = val.concat.map((p) => (typeof p === 'object' ? JSON.stringify(p) : String(p))).join(' ');
      return value === undefined ? text : `${text} ${value} ${wrapped?.comment ?? ''}`.trim();
    })
    .sort();
}

/** The WHATWG URL serializer's text of an IPv6 address: RFC 5952 without mixed notation. */
const urlHost = (address: string) => new URL(`http://[${address}]/`).hostname.slice(1, -1);

const mapText = (e: Entry) => `${e.externalIp} ${e.protocol.toLowerCase()} ${e.port} ${e.clusterIp} ${e.service}`;
const keyText = (e: Entry) => `${e.externalIp} ${e.protocol.toLowerCase()} ${e.port}`;

const dropTables = deleteTables(new Transaction(), ['ipv4', 'ipv6']);

/**
 * Whether this kernel takes the source-range set's lookup (the driver's probe): Debian's 6.12
 * refuses it (docs/operations.md, Kernels), and the controller then leaves ranged entries out.
 */
async function takesSourceRanges(): Promise<boolean> {
  const driver = new NftDriver(new NftAddonExecutor(addon()));
  const probe = await driver.probe();
  return probe.ok && driver.capabilities.filtersSources;
}

describe('nft whole writes write the difference', function () {
  this.timeout(120_000);
  before(() => assertIsolatedNetns());
  afterEach(async () => {
    await new NftCliExecutor().run(dropTables);
  });

  for (const lookup of ['map', 'set'] as KeyLookup[]) {
    it(`a restart over 10,000 entries with ${lookup === 'set' ? 'the key set' : 'the map looked up'}: 3 changed, 1 stale and 1 missing are the whole batch`, async function () {
      // 5.10 and 6.1 refuse a map looked up as a set: there the rules look keys up in the key set.
      const probed = await new NftDriver(new NftAddonExecutor(addon())).keyLookup();
      if (lookup === 'map' && probed.lookup === 'set') this.skip();
      const before = entries(10_000);
      await writeWhole(new NftDriver(new NftAddonExecutor(addon()), { lookup }), before);
      expect(listed('map', MAP_NAME)).to.have.length(10_000);
      // Someone left a stale element and removed one of ours; three Services changed ClusterIP.
      sh('nft', ['add', 'element', 'ip', TABLE_NAME, MAP_NAME, '{ 203.0.113.9 . udp . 53 : 10.1.1.2 }']);
      sh('nft', ['delete', 'element', 'ip', TABLE_NAME, MAP_NAME, '{ 198.18.0.7 . tcp . 443 }']);
      if (lookup === 'set') {
        sh('nft', ['add', 'element', 'ip', TABLE_NAME, KEY_SET_NAME, '{ 203.0.113.9 . udp . 53 }']);
        sh('nft', ['delete', 'element', 'ip', TABLE_NAME, KEY_SET_NAME, '{ 198.18.0.7 . tcp . 443 }']);
      }
      const after = before.map((e, i) => (i === 10 || i === 5000 || i === 9999 ? { ...e, clusterIp: '10.99.0.1' } : e));

      // A restart: a new driver over the table as it is.
      const { addon: spied, batches } = recording(addon());
      const executor = new NftAddonExecutor(spied);
      await writeWhole(new NftDriver(executor, { lookup }), after);

      expect(executor.lastMapWrite?.how).to.equal('difference');
      const [ipv4, ipv6] = batches;
      expect(batches).to.have.length(2);
      // The 3 changed values replaced, the stale element removed, the missing one added.
      expect({ removed: ipv4!.removed, added: ipv4!.added }).to.deep.equal({ removed: 4, added: 4 });
      // The key set keeps the keys whose value changed: only the stale key goes, the missing one comes.
      expect({ removed: ipv4!.keysRemoved, added: ipv4!.keysAdded }).to.deep.equal(
        lookup === 'set' ? { removed: 1, added: 1 } : { removed: 0, added: 0 },
      );
      expect(ipv6!.messages, 'the IPv6 map held what it must: nothing sent').to.equal(0);
      expect(listed('map', MAP_NAME)).to.deep.equal(after.map(mapText).sort());
      if (lookup === 'set') expect(listed('set', KEY_SET_NAME)).to.deep.equal(after.map(keyText).sort());

      // The same state again (another restart): the batches carry nothing and commit nothing,
      // so the ruleset moves by the objects' transaction alone.
      batches.length = 0;
      const generation = await executor.generation();
      await writeWhole(new NftDriver(executor, { lookup }), after);
      expect(batches.map((b) => b.messages)).to.deep.equal([0, 0]);
      expect(await executor.generation()).to.equal(generation! + 1);
      expect(listed('map', MAP_NAME)).to.deep.equal(after.map(mapText).sort());
    });
  }

  it('reads again when another writer commits between the read and the batch (the kernel refuses the stale difference)', async () => {
    const executor = new NftAddonExecutor(addon());
    await writeWhole(new NftDriver(executor, { lookup: 'set' }), entries(20));
    const real = addon();
    let reads = 0;
    const readSets: NftablesAddon['readSets'] = async (...args) => {
      const held = await real.readSets!(...args);
      // After the first read, another process adds an element of its own to our map.
      if (reads++ === 0) {
        await execa('nft', ['add', 'element', 'ip', TABLE_NAME, MAP_NAME, '{ 203.0.113.1 . tcp . 1 : 10.1.1.1 }']);
      }
      return held;
    };
    const racing = new NftAddonExecutor({ ...real, readSets });
    await writeWhole(new NftDriver(racing, { lookup: 'set' }), entries(21));
    expect(reads, 'IPv4 read twice (its first batch refused), IPv6 once').to.equal(3);
    expect(racing.lastMapWrite?.how).to.equal('difference');
    expect(listed('map', MAP_NAME)).to.deep.equal(entries(21).map(mapText).sort());
  });

  it('refills the map where the addon reads no elements, as before', async () => {
    const real = addon();
    const executor = new NftAddonExecutor({ ...real, readSets: undefined });
    await writeWhole(new NftDriver(executor, { lookup: 'set' }), entries(30));
    await writeWhole(new NftDriver(executor, { lookup: 'set' }), entries(31));
    expect(executor.lastMapWrite).to.deep.include({ how: 'refill' });
    expect(listed('map', MAP_NAME)).to.deep.equal(entries(31).map(mapText).sort());
    expect(listed('set', KEY_SET_NAME)).to.deep.equal(entries(31).map(keyText).sort());
  });

  it('reads no more elements than asked: a larger map is an error with its own code', async () => {
    const executor = new NftAddonExecutor(addon());
    await writeWhole(new NftDriver(executor, { lookup: 'set' }), entries(100));
    const sets = [
      { name: MAP_NAME, kind: 'map' as const },
      { name: KEY_SET_NAME, kind: 'keys' as const },
    ];
    const read = await addon().readSets!('ip', TABLE_NAME, sets, 100);
    expect(read.sets.map((lines) => lines?.split('\n').filter((l) => l).length)).to.deep.equal([100, 100]);
    expect(read.sets[0]!.split('\n')).to.include('198.18.0.9 tcp 443 10.97.0.9 filler/svc-9');
    const refused = await addon().readSets!('ip', TABLE_NAME, sets, 99).then(
      () => expect.fail('read'),
      (err: Error & { code?: string }) => err,
    );
    expect(refused.code).to.equal('ERR_TOO_MANY_ELEMENTS');
    expect(refused.message).to.match(/holds more than 99 elements/);
    const missing = await addon().readSets!('ip', 'no-such-table', [{ name: MAP_NAME, kind: 'map' }], 10);
    expect(missing.sets).to.deep.equal([null]);
  });

  it('in one JSON transaction (a Service with source ranges), the map gets its difference too, through either executor', async function () {
    if (!(await takesSourceRanges())) this.skip();
    const ranged: Entry = { ...entries(1)[0]!, sourceRanges: ['10.244.1.0/24'] };
    const before = [ranged, ...entries(300).slice(1)];
    const after = before.map((e, i) => (i === 7 ? { ...e, clusterIp: '10.99.0.7' } : e)).slice(0, 299);
    const mapCommands = async (executor: NftExecutor, state: Entry[]) => {
      const sent = transactionsOf(executor);
      await writeWhole(new NftDriver(executor, { lookup: 'set' }), state);
      return sent.flatMap((tx) =>
        tx.operations.flatMap(({ verb, object: o }) => {
          const ours = (name: string) => o.family === 'ip' && (name === MAP_NAME || name === KEY_SET_NAME);
          if (o.kind === 'element') return ours(o.set) ? [`${verb} ${o.set} ${o.elements.length}`] : [];
          return (o.kind === 'map' || o.kind === 'set') && ours(o.name) ? [`${verb} ${o.name}`] : [];
        }),
      );
    };
    await writeWhole(new NftDriver(new NftAddonExecutor(addon()), { lookup: 'set' }), before);
    // One value changed, one entry gone: the map loses 2 and gains 1, the key set loses 1.
    expect(await mapCommands(new NftAddonExecutor(addon()), after)).to.deep.equal([
      `add ${MAP_NAME}`,
      `add ${KEY_SET_NAME}`,
      `delete ${KEY_SET_NAME} 1`,
      `delete ${MAP_NAME} 2`,
      `add ${MAP_NAME} 1`,
    ]);
    expect(listed('map', MAP_NAME)).to.deep.equal(after.map(mapText).sort());
    expect(listed('set', KEY_SET_NAME)).to.deep.equal(after.map(keyText).sort());
    // The nft command lists them: the same difference, back (the value changed again, the entry
    // gone added back): the map loses 1 and gains 2, the key set gains 1.
    expect(await mapCommands(new NftCliExecutor(), before)).to.deep.equal([
      `add ${MAP_NAME}`,
      `add ${KEY_SET_NAME}`,
      `delete ${MAP_NAME} 1`,
      `add ${MAP_NAME} 2`,
      `add ${KEY_SET_NAME} 1`,
    ]);
    expect(listed('set', KEY_SET_NAME)).to.deep.equal(before.map(keyText).sort());
    expect(listed('map', MAP_NAME)).to.deep.equal(before.map(mapText).sort());
  });

  const executors: Array<[string, () => NftExecutor]> = [
    ['the addon', () => new NftAddonExecutor(addon())],
    ['the nft command', () => new NftCliExecutor()],
  ];
  /** The check map's elements as `address protocol port chain`, sorted. */
  const checks = () => {
    const listing = execFileSync('nft', ['-j', 'list', 'map', 'ip', TABLE_NAME, SOURCE_CHECK_MAP]).toString();
    const doc = JSON.parse(listing) as {
      nftables: Array<{ map?: { elem?: Array<[{ concat: unknown[] }, { jump: { target: string } }]> } }>;
    };
    const elems = doc.nftables.find((o) => o.map)?.map?.elem ?? [];
    return elems.map(([k, v]) => `${k.concat.join(' ')} ${v.jump.target}`).sort();
  };
  const ourChains = () =>
    (
      JSON.parse(execFileSync('nft', ['-j', 'list', 'chains', 'ip']).toString()) as {
        nftables: Array<{ chain?: { table: string; name: string } }>;
      }
    ).nftables
      .flatMap((o) =>
        o.chain && o.chain.table === TABLE_NAME && o.chain.name.startsWith(SOURCE_CHAIN_PREFIX) ? [o.chain.name] : [],
      )
      .sort();
  for (const [name, executorOf] of executors) {
    it(`source ranges through ${name}: a range edited rewrites its Service's chain alone; a chain nothing wants is removed`, async function () {
      if (!(await takesSourceRanges())) this.skip();
      // One Service with 20 ports, its ranges given; another ranged Service beside it.
      const svc = (ranges: string[] | undefined): Entry[] =>
        Array.from({ length: 20 }, (_, p) => ({
          family: 'ipv4' as Family,
          externalIp: '198.18.9.1',
          protocol: 'TCP' as const,
          port: 1000 + p,
          clusterIp: '10.97.9.1',
          service: 'tenant/ranged',
          ...(ranges ? { sourceRanges: ranges } : {}),
        }));
      const others = [...entries(5).slice(1), { ...entries(6)[5]!, sourceRanges: ['10.0.0.1/32'] }];
      const write = async (first: Entry[]) => {
        const executor = executorOf();
        const sent = transactionsOf(executor);
        await writeWhole(new NftDriver(executor, { lookup: 'set' }), [...others, ...first]);
        // The commands on the source-range objects: verb, object, and elements counted.
        return sent.flatMap((tx) =>
          tx.operations.flatMap(({ verb, object: o }) => {
            const ranged = (n: string) => n === SOURCE_CHECK_MAP || n === OWN_SOURCE_SET;
            if (o.kind === 'element') return ranged(o.set) ? [`${verb} ${o.set} ${o.elements.length}`] : [];
            if ((o.kind === 'set' || o.kind === 'map') && verb !== 'add' && ranged(o.name))
              return [`${verb} ${o.name}`];
            if (o.kind === 'chain' && o.name === sourceChainName('tenant/ranged') && verb !== 'add')
              return [`${verb} chain`];
            if (o.kind === 'rule' && o.chain === sourceChainName('tenant/ranged')) return ['rule'];
            return [];
          }),
        );
      };
      const chain = sourceChainName('tenant/ranged');
      await write(svc(['10.244.1.0/24']));
      expect(checks().filter((c) => c.endsWith(chain))).to.have.length(20);
      expect(ourChains()).to.deep.equal([chain, sourceChainName(others[4]!.service)].sort());
      // A restart with a range added: the Service's chain written again (its three rules), no element.
      expect(await write(svc(['10.244.1.0/24', '192.168.50.0/24']))).to.deep.equal([
        'flush chain',
        'rule',
        'rule',
        'rule',
      ]);
      const rules = execFileSync('nft', ['list', 'chain', 'ip', TABLE_NAME, chain]).toString();
      expect(rules).to.match(/ip saddr \{ 10\.244\.1\.0\/24, 192\.168\.50\.0\/24 \} return/);
      // The Service no longer ranged: its 20 check and own-address elements go, and its chain.
      expect(await write(svc(undefined))).to.deep.equal([
        'flush chain',
        `delete ${SOURCE_CHECK_MAP} 20`,
        `delete ${OWN_SOURCE_SET} 20`,
        'delete chain',
      ]);
      expect(ourChains()).to.deep.equal([sourceChainName(others[4]!.service)]);
      expect(checks()).to.have.length(1);
    });
  }

  it('a partial write of one range edited rewrites the Service chain alone, and its last ranged entry removes the chain', async function () {
    if (!(await takesSourceRanges())) this.skip();
    const svc = (ranges: string[]): Entry[] =>
      Array.from({ length: 50 }, (_, p) => ({
        family: 'ipv4' as Family,
        externalIp: '198.18.9.1',
        protocol: 'TCP' as const,
        port: 2000 + p,
        clusterIp: '10.97.9.1',
        service: 'tenant/edited',
        sourceRanges: ranges,
      }));
    // What the desired state says of its ranged entries per Service, as the reconciler hands it on.
    const rangedOf = (entries: Entry[]) => new Map([['tenant/edited', entries.length]]);
    const executor = new NftAddonExecutor(addon());
    const driver = new NftDriver(executor, { lookup: 'set' });
    const before = svc(['10.244.1.0/24', '172.16.0.0/12']);
    await writeWhole(driver, before);
    const sent = transactionsOf(executor);
    const after = svc(['10.244.1.0/24', '192.168.0.0/16']);
    await driver.apply([
      { kind: 'elements', family: 'ipv4', remove: before, add: after, rangedByService: rangedOf(after) },
    ]);
    const verbs = sent.flatMap((tx) => tx.operations.map(({ verb, object: o }) => `${verb} ${o.kind}`));
    // The chain declared, emptied and given its three rules: no element of the map, the check
    // map or the own-address set is written.
    expect(verbs).to.deep.equal(['add chain', 'flush chain', 'add rule', 'add rule', 'add rule']);
    const chain = sourceChainName('tenant/edited');
    expect(execFileSync('nft', ['list', 'chain', 'ip', TABLE_NAME, chain]).toString()).to.include(
      'ip saddr { 10.244.1.0/24, 192.168.0.0/16 } return',
    );
    // Every ranged entry removed: the elements, then the chain.
    sent.length = 0;
    await driver.apply([{ kind: 'elements', family: 'ipv4', remove: after, add: [], rangedByService: undefined }]);
    expect(ourChains()).to.deep.equal([]);
    expect(checks()).to.deep.equal([]);
  });

  it('reads the check map and the own-address set through the addon as the controller writes them', async function () {
    if (!(await takesSourceRanges())) this.skip();
    const ranged: Entry = { ...entries(1)[0]!, sourceRanges: ['10.244.1.0/24', '10.0.0.1/32'] };
    await writeWhole(new NftDriver(new NftAddonExecutor(addon()), { lookup: 'set' }), [ranged]);
    const read = await addon().readSets!(
      'ip',
      TABLE_NAME,
      [
        { name: SOURCE_CHECK_MAP, kind: 'verdicts' },
        { name: OWN_SOURCE_SET, kind: 'sourced' },
      ],
      10,
    );
    expect(read.sets[0]).to.equal(`198.18.0.0 tcp 443 jump ${sourceChainName(ranged.service)}\n`);
    expect(read.sets[1]).to.equal('198.18.0.0 tcp 443 198.18.0.0\n');
  });
  /**
   * IPv6 addresses that nft and inet_ntop print in mixed notation (`::1.2.3.4`, `::0.1.0.0`,
   * `::255.255.0.1`, `::10.96.0.1`) where the model writes `::102:304`, `::1:0`, `::ffff:1`,
   * `::a60:1`; beside them forms inet_ntop prints as the model does (`64:ff9b::102:304`,
   * `::ffff`, the first of two equal zero runs compressed).
   */
  const mixedV6: Entry[] = ipv6Entries([
    ['::102:304', 'TCP', 443, 'fd00:96::1'],
    ['::1:0', 'TCP', 443, '::a60:1'],
    ['::ffff:1', 'UDP', 53, '::a60:2'],
    ['64:ff9b::102:304', 'TCP', 80, '::ffff'],
    ['2001:db8::1:0:0:1', 'SCTP', 9000, '::c000:202'],
    ['::c000:201', 'TCP', 8443, '::c000:202'],
  ]);
  const v6Shape = (sourceRanged: boolean): FamilyShape => {
    const state: FamilyState = { entries: [], localPodMatch: { kind: 'cidrs', cidrs: ['fd01::/64'] } };
    if (sourceRanged) state.sourceRanged = true;
    return { state, masqueradeMark: 0x4000 };
  };

  it("the addon's dump writes every IPv6 address as the model does: 3,000 random ones, ::/96 and ::ffff:0:0/96 among them", async () => {
    // xorshift32: the same addresses on every run; many zero runs, a third of them in mixed notation.
    let x = 0x1d6;
    const next = (n: number) => {
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      return (x >>> 0) % n;
    };
    const texts = new Set<string>(
      ['::1', '::ffff:0:0', '::1.2.3.4', '::ffff:1.2.3.4', '1::', '::1:0', '1:0:0:1:0:0:1:1'].map(canonicalAddress),
    );
    while (texts.size < 3_000) {
      const groups = Array.from({ length: 8 }, () => (next(3) === 0 ? 0 : next(3) === 0 ? next(16) : next(65_536)));
      if (next(3) === 0) groups.fill(0, 0, 6);
      else if (next(6) === 0) groups.fill(0, 0, 5).fill(0xffff, 5, 6);
      texts.add(canonicalAddress(groups.map((g) => g.toString(16)).join(':')));
    }
    const addresses = [...texts];
    const table = 'address-text';
    const elements = addresses.map((a, i) => `${a} . tcp . ${i + 1} : ${addresses[addresses.length - 1 - i]}`);
    sh(
      'nft',
      ['-f', '-'],
      `table ip6 ${table} {\n  map m { type ipv6_addr . inet_proto . inet_service : ipv6_addr; }\n}\nadd element ip6 ${table} m { ${elements.join(', ')} }\n`,
    );
    try {
      const read = await addon().readSets!('ip6', table, [{ name: 'm', kind: 'map' }], 10_000);
      const lines = read.sets[0]!.split('\n').filter((l) => l !== '');
      expect(lines).to.have.length(addresses.length);
      const wrong = lines.filter((line) => {
        const [key, , port, value] = line.split(' ');
        const i = Number(port) - 1;
        return key !== addresses[i] || value !== addresses[addresses.length - 1 - i] || key !== urlHost(key!);
      });
      expect(wrong.slice(0, 10)).to.deep.equal([]);
      // nft itself prints a third of them otherwise.
      const nftText = sh('nft', ['list', 'map', 'ip6', table, 'm']);
      expect((nftText.match(/::[0-9a-f]*:?\d+\.\d+\.\d+\.\d+/g) ?? []).length).to.be.above(1_000);
    } finally {
      sh('nft', ['delete', 'table', 'ip6', table]);
    }
  });

  for (const lookup of ['map', 'set'] as KeyLookup[]) {
    it(`IPv6 addresses nft prints in mixed notation (::1.2.3.4) stay through a second whole write with ${lookup === 'set' ? 'the key set' : 'the map looked up'}: nothing sent`, async function () {
      const probed = await new NftDriver(new NftAddonExecutor(addon())).keyLookup();
      if (lookup === 'map' && probed.lookup === 'set') this.skip();
      await writeWhole(new NftDriver(new NftAddonExecutor(addon()), { lookup }), entries(3), mixedV6);
      // The kernel's own tool prints them otherwise than the model: the case is real.
      expect(listed('map', MAP_NAME, 'ip6')).to.include('::1.2.3.4 tcp 443 fd00:96::1 v6/svc-0');
      expect(listed('map', MAP_NAME, 'ip6')).to.include('::0.1.0.0 tcp 443 ::10.96.0.1 v6/svc-1');

      // A restart: the same state again, read back through the addon's dump.
      const { addon: spied, batches } = recording(addon());
      const executor = new NftAddonExecutor(spied);
      const generation = await executor.generation();
      await writeWhole(new NftDriver(executor, { lookup }), entries(3), mixedV6);
      expect(executor.lastMapWrite).to.deep.include({ how: 'difference', kept: mixedV6.length });
      const sent = batches.map(({ messages, removed, added, keysRemoved, keysAdded }) => ({
        messages,
        removed,
        added,
        keysRemoved,
        keysAdded,
      }));
      const none = { messages: 0, removed: 0, added: 0, keysRemoved: 0, keysAdded: 0 };
      expect(sent, 'no element deleted and added back, in either family').to.deep.equal([none, none]);
      expect(await executor.generation()).to.equal(generation! + 1);
      // The dump reads each element as the model writes it.
      const read = await addon().readSets!('ip6', TABLE_NAME, [{ name: MAP_NAME, kind: 'map' }], 100);
      expect(
        read.sets[0]!.split('\n')
          .filter((l) => l !== '')
          .sort(),
      ).to.deep.equal(mixedV6.map(mapText).sort());
    });
  }

  it('a verification of IPv6 entries in mixed notation finds nothing to repair, listed alongside our writes or between them', async () => {
    const driver = new NftDriver(new NftAddonExecutor(addon()), { lookup: 'set' });
    await writeWhole(driver, [], mixedV6);
    for (const how of ['alongside-writes', 'between-writes'] as const) {
      const read = await driver.readBack('ipv6', mixedV6, v6Shape(false), how);
      expect(read, how).to.deep.include({ missing: [], foreign: [], shapeDrift: [] });
    }
  });

  for (const [name, executorOf] of executors) {
    it(`source ranges of IPv6 addresses in mixed notation through ${name}: a second whole write sends none of their elements, and a verification finds nothing to repair`, async function () {
      if (!(await takesSourceRanges())) this.skip();
      const ranged = [
        { ...mixedV6[0]!, sourceRanges: ['::102:300/120', '::a00:0/104', 'fd00:1::/64'] },
        { ...mixedV6[1]!, sourceRanges: ['::c000:200/120'] },
        ...mixedV6.slice(2),
      ];
      const ours = new Set(ranged.map((e) => sourceChainName(e.service)));
      const write = async () => {
        const executor = executorOf();
        const sent = transactionsOf(executor);
        const driver = new NftDriver(executor, { lookup: 'set' });
        await writeWhole(driver, [], ranged);
        // The commands on the source-range objects: their elements, and the Services' chains.
        const commands = sent.flatMap((tx) =>
          tx.operations.flatMap(({ verb, object: o }) => {
            const rangedSet = (n: string) => n === SOURCE_CHECK_MAP || n === OWN_SOURCE_SET;
            if (o.kind === 'element') return rangedSet(o.set) ? [`${verb} ${o.set} ${JSON.stringify(o.elements)}`] : [];
            if ((o.kind === 'set' || o.kind === 'map') && verb !== 'add' && rangedSet(o.name))
              return [`${verb} ${o.name}`];
            if (o.kind === 'chain' && ours.has(o.name) && verb !== 'add') return [`${verb} chain ${o.name}`];
            if (o.kind === 'rule' && ours.has(o.chain)) return [`rule ${o.chain}`];
            return [];
          }),
        );
        return { driver, commands };
      };
      const first = await write();
      // nft prints them otherwise than the model: the case is real.
      expect(listed('set', OWN_SOURCE_SET, 'ip6')).to.include('::1.2.3.4 tcp 443 ::1.2.3.4');
      const rules = execFileSync('nft', ['list', 'chain', 'ip6', TABLE_NAME, sourceChainName('v6/svc-0')]).toString();
      expect(rules).to.include('::1.2.3.0/120');
      expect(first.commands.filter((c) => c.startsWith('add '))).to.not.deep.equal([]);
      const { driver, commands } = await write();
      // A whole write writes each Service's chain again (its rules), whatever its addresses.
      expect(
        commands.filter((c) => !c.startsWith('rule ') && !c.startsWith('flush chain ')),
        'the check map and the own-address set held what they must',
      ).to.deep.equal([]);
      const read = await driver.readBack('ipv6', ranged, v6Shape(true), 'between-writes');
      expect(read).to.deep.include({ missing: [], foreign: [], shapeDrift: [] });
    });
  }
});
