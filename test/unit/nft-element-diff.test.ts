// What a whole write writes to a map, its key set and the source-range sets that already hold
// elements (element-diff.ts): the difference, never an element that stays. Whatever they hold,
// the changes must bring them to what is wanted, and touch nothing that is already right.

import { expect } from 'chai';
import {
  elementDifference,
  listedSetElements,
  mapDifference,
  sourceRangeDifference,
  sourceRangeLines,
} from '../../src/backends/nft/element-diff.js';
import { Transaction, type SourceRangeElement } from '../../src/backends/nft/objects.js';
import {
  KEY_SET_NAME,
  MAP_NAME,
  SOURCE_RANGED_KEY_SET,
  SOURCE_RANGE_SET,
  desiredTable,
  mapElement,
} from '../../src/backends/nft/render.js';
import { writeTable, writeTableButElements } from '../../src/backends/nft/transactions.js';
import type { Entry, FamilyState } from '../../src/model/types.js';
import { seededRandom } from '../support/fixtures.js';

const lines = (text: string) => (text === '' ? [] : text.split('\n'));
const keyOf = (line: string) => line.split(' ').slice(0, 3).join(' ');

/** `held` after removing then adding `diff`'s lines, by key. */
function applied(held: string[], removed: string[], added: string[]): string[] {
  const gone = new Set(removed);
  const after = held.filter((l) => !gone.has(keyOf(l)));
  for (const line of added) {
    if (after.some((l) => keyOf(l) === keyOf(line))) expect.fail(`${line} added over an element that stays`);
    after.push(line);
  }
  return after.sort();
}

describe('nft whole write: the difference with what a map holds', () => {
  it('removes the stale, replaces the changed, adds the missing, and leaves the rest', () => {
    const held = {
      map: [
        '192.0.2.1 tcp 80 10.96.0.1 default/a',
        '192.0.2.2 tcp 80 10.96.0.2 default/b',
        '192.0.2.3 udp 53 10.96.0.3 default/c',
        '203.0.113.9 17 53 10.1.1.2',
      ].join('\n'),
      keySet: ['192.0.2.1 tcp 80', '192.0.2.2 tcp 80', '198.51.100.1 tcp 1'].join('\n'),
    };
    const wanted = [
      '192.0.2.1 tcp 80 10.96.0.1 default/a',
      '192.0.2.2 tcp 80 10.96.0.9 default/b',
      '192.0.2.3 udp 53 10.96.0.3 default/renamed',
      '192.0.2.4 sctp 9 10.96.0.4 default/d e',
    ].join('\n');
    const diff = elementDifference(held, wanted);
    expect(lines(diff.removed)).to.deep.equal(['192.0.2.2 tcp 80', '192.0.2.3 udp 53', '203.0.113.9 17 53']);
    expect(lines(diff.added)).to.deep.equal([
      '192.0.2.2 tcp 80 10.96.0.9 default/b',
      '192.0.2.3 udp 53 10.96.0.3 default/renamed',
      '192.0.2.4 sctp 9 10.96.0.4 default/d e',
    ]);
    // The key set keeps 192.0.2.2 (only its value changed); 192.0.2.3 was missing from it.
    expect(lines(diff.keysRemoved)).to.deep.equal(['198.51.100.1 tcp 1']);
    expect(lines(diff.keysAdded)).to.deep.equal(['192.0.2.3 udp 53', '192.0.2.4 sctp 9']);
    expect(diff.counts).to.deep.equal({ removed: 3, added: 3, keysRemoved: 1, keysAdded: 2, kept: 1 });
  });

  it('writes nothing when the map and the key set hold what is wanted, and everything into an empty map', () => {
    const wanted = ['192.0.2.1 tcp 80 10.96.0.1 a/b', '192.0.2.2 udp 80 10.96.0.2'].join('\n');
    const same = elementDifference({ map: `${wanted}\n`, keySet: '192.0.2.2 udp 80\n192.0.2.1 tcp 80\n' }, wanted);
    expect([same.removed, same.added, same.keysRemoved, same.keysAdded]).to.deep.equal(['', '', '', '']);
    expect(same.counts.kept).to.equal(2);
    const empty = elementDifference({ map: '', keySet: '' }, wanted);
    expect(lines(empty.added)).to.deep.equal(lines(wanted));
    expect(lines(empty.keysAdded)).to.deep.equal(['192.0.2.1 tcp 80', '192.0.2.2 udp 80']);
    // Without a key set, no key changes.
    const noKeySet = elementDifference({ map: '' }, wanted);
    expect([noKeySet.keysRemoved, noKeySet.keysAdded]).to.deep.equal(['', '']);
  });

  it('replaces an element whose comment it gained or lost, and one printed otherwise than written', () => {
    const diff = elementDifference(
      { map: '192.0.2.1 tcp 80 10.96.0.1\n2001:db8:0:0::1 tcp 80 fd00::1 a/b' },
      '192.0.2.1 tcp 80 10.96.0.1 a/b\n2001:db8::1 tcp 80 fd00::1 a/b',
    );
    expect(diff.counts).to.include({ removed: 2, added: 2, kept: 0 });
  });

  it('brings any map and key set to what is wanted, touching no element that stays (random)', () => {
    const rnd = seededRandom(11);
    const line = (host: number, value: number) => `192.0.2.${host} tcp 80 10.96.0.${value} ns/s${value}`;
    for (let round = 0; round < 2000; round++) {
      const pick = () => [...new Set(Array.from({ length: Math.floor(rnd() * 15) }, () => Math.floor(rnd() * 25)))];
      const held = pick().map((h) => line(h, Math.floor(rnd() * 3)));
      const heldKeys = [
        ...new Set([...held.map(keyOf).filter(() => rnd() < 0.8), ...pick().map((h) => keyOf(line(h, 0)))]),
      ];
      const wanted = pick().map((h) => line(h, Math.floor(rnd() * 3)));
      const diff = elementDifference({ map: held.join('\n'), keySet: heldKeys.join('\n') }, wanted.join('\n'));
      expect(applied(held, lines(diff.removed), lines(diff.added))).to.deep.equal([...wanted].sort());
      const keys = applied(heldKeys, lines(diff.keysRemoved), lines(diff.keysAdded));
      expect(keys).to.deep.equal(wanted.map(keyOf).sort());
      // Nothing that is already right is removed.
      for (const removed of lines(diff.removed)) expect(wanted).not.to.include(held.find((l) => keyOf(l) === removed));
      for (const removed of lines(diff.keysRemoved)) expect(wanted.map(keyOf)).not.to.include(removed);
      expect(diff.counts.kept).to.equal(held.filter((l) => wanted.includes(l)).length);
    }
  });
});

describe('nft whole write: the source-range sets', () => {
  const key = ['192.0.2.1', 'tcp', 80];
  const source = (address: string, length: number): SourceRangeElement => ({ key, source: { address, length } });

  it('reads a listing of each set, whole addresses and prefixes', () => {
    const listing = JSON.stringify({
      nftables: [
        { metainfo: { version: '1.0.6' } },
        {
          set: {
            name: SOURCE_RANGE_SET,
            elem: [
              { concat: ['192.0.2.1', 'tcp', 80, { prefix: { addr: '10.0.0.0', len: 8 } }] },
              { concat: ['192.0.2.1', 'tcp', 80, '10.9.9.9'] },
              { elem: { val: { concat: ['2001:db8::1', 'udp', 53, '2001:db8::7'] }, comment: 'x' } },
            ],
          },
        },
      ],
    });
    expect(listedSetElements(listing, true)).to.deep.equal([
      source('10.0.0.0', 8),
      source('10.9.9.9', 32),
      { key: ['2001:db8::1', 'udp', 53], source: { address: '2001:db8::7', length: 128 } },
    ]);
    const keys = JSON.stringify({ nftables: [{ set: { name: SOURCE_RANGED_KEY_SET, elem: [{ concat: key }] } }] });
    expect(listedSetElements(keys, false)).to.deep.equal([{ key, value: '' }]);
    expect(listedSetElements(JSON.stringify({ nftables: [{ set: { name: 'x' } }] }), false)).to.deep.equal([]);
    // A range, or a key of another form: not read (the sets are then flushed and refilled).
    const range = { nftables: [{ set: { elem: [{ concat: [...key, { range: ['10.0.0.1', '10.0.0.5'] }] }] } }] };
    expect(() => listedSetElements(JSON.stringify(range), true)).to.throw(/unexpected set element/);
    expect(() => listedSetElements(JSON.stringify({ nftables: [] }), true)).to.throw(/no set/);
  });

  it('reads the lines of a netlink dump of each set; a range that is no prefix is not read', () => {
    expect(
      sourceRangeLines(
        '192.0.2.1 tcp 80\n192.0.2.9 132 1\n',
        '192.0.2.1 tcp 80 10.0.0.0/8\n192.0.2.1 tcp 80 10.9.9.9/32\n',
      ),
    ).to.deep.equal({
      keys: [
        { key, value: '' },
        { key: ['192.0.2.9', 132, 1], value: '' },
      ],
      sources: [source('10.0.0.0', 8), source('10.9.9.9', 32)],
    });
    expect(sourceRangeLines('', '')).to.deep.equal({ keys: [], sources: [] });
    expect(() => sourceRangeLines('', '192.0.2.1 tcp 80 10.0.0.1-10.0.0.5')).to.throw(/no prefix/);
  });

  it('adds and removes only the ranges and keys that differ', () => {
    const held = {
      keys: [
        { key, value: '' },
        { key: ['192.0.2.9', 'tcp', 1], value: '' },
      ],
      sources: [source('10.0.0.0', 8)],
    };
    const wanted = { keys: [{ key, value: '' }], sources: [source('10.0.0.0', 8), source('192.168.0.0', 16)] };
    const diff = sourceRangeDifference(held, wanted);
    expect(diff.keys).to.deep.equal({ removed: [{ key: ['192.0.2.9', 'tcp', 1], value: '' }], added: [] });
    expect(diff.sources).to.deep.equal({ removed: [], added: [source('192.168.0.0', 16)] });
  });

  it('writes the difference into the whole write instead of flushing the sets, when it is known', () => {
    const entry: Entry = {
      family: 'ipv4',
      externalIp: '192.0.2.1',
      protocol: 'TCP',
      port: 80,
      clusterIp: '10.96.0.1',
      service: 'default/a',
      sourceRanges: ['10.0.0.0/8', '192.168.0.0/16'],
    };
    const state: FamilyState = { entries: [entry], localPodMatch: { kind: 'cidrs', cidrs: [] }, sourceRanged: true };
    const t = desiredTable('ipv4', state, 0x4000, 'set');
    const onSets = (tx: Transaction) =>
      tx.operations.flatMap(({ verb, object: o }) => {
        const ranged = (name: string) => name === SOURCE_RANGE_SET || name === SOURCE_RANGED_KEY_SET;
        if (o.kind === 'element') return ranged(o.set) ? [`${verb} ${o.set} ${o.elements.length}`] : [];
        return o.kind === 'set' && verb !== 'add' && ranged(o.name) ? [`${verb} ${o.name}`] : [];
      });
    // Unknown: flushed and filled again, as before.
    expect(onSets(writeTable(new Transaction(), t))).to.deep.equal([
      `flush ${SOURCE_RANGED_KEY_SET}`,
      `flush ${SOURCE_RANGE_SET}`,
      `add ${SOURCE_RANGED_KEY_SET} 1`,
      `add ${SOURCE_RANGE_SET} 2`,
    ]);
    // Known: one range added, nothing flushed; whether the map is replaced or kept.
    const held = {
      keys: [{ key: ['192.0.2.1', 'tcp', 80], value: '' }],
      sources: [{ key: ['192.0.2.1', 'tcp', 80], source: { address: '10.0.0.0', length: 8 } }],
    };
    for (const write of [writeTable, writeTableButElements]) {
      expect(onSets(write(new Transaction(), t, { sourceRanges: held }))).to.deep.equal([`add ${SOURCE_RANGE_SET} 1`]);
    }
    const extra = { keys: held.keys, sources: [...held.sources, source('1.2.3.4', 32)] };
    expect(onSets(writeTable(new Transaction(), t, { sourceRanges: extra }))).to.deep.equal([
      `delete ${SOURCE_RANGE_SET} 1`,
      `add ${SOURCE_RANGE_SET} 1`,
    ]);
  });
});

describe('nft whole write in one JSON transaction: the map', () => {
  const entry = (host: number, cluster: number): Entry => ({
    family: 'ipv4',
    externalIp: `192.0.2.${host}`,
    protocol: 'TCP',
    port: 80,
    clusterIp: `10.96.0.${cluster}`,
    service: `default/s${host}`,
  });
  const entries = [entry(1, 1), entry(2, 2), entry(3, 3)];
  const state: FamilyState = { entries, localPodMatch: { kind: 'cidrs', cidrs: [] } };
  /** The commands on the map and the key set: verb, object and what elements. */
  const onMap = (tx: Transaction) =>
    tx.operations.flatMap(({ verb, object: o }) => {
      if (o.kind === 'element') {
        if (o.set !== MAP_NAME && o.set !== KEY_SET_NAME) return [];
        return [`${verb} ${o.set} ${o.elements.map((e) => ('key' in e ? e.key[0] : '')).join(',')}`];
      }
      return (o.kind === 'map' || o.kind === 'set') && (o.name === MAP_NAME || o.name === KEY_SET_NAME)
        ? [`${verb} ${o.name}`]
        : [];
    });

  it('is replaced with every element where what it holds is unknown, as before', () => {
    const t = desiredTable('ipv4', state, 0x4000, 'set');
    expect(onMap(writeTable(new Transaction(), t))).to.deep.equal([
      `add ${MAP_NAME}`,
      `add ${KEY_SET_NAME}`,
      `delete ${MAP_NAME}`,
      `delete ${KEY_SET_NAME}`,
      `add ${MAP_NAME}`,
      `add ${KEY_SET_NAME}`,
      `add ${KEY_SET_NAME} 192.0.2.1,192.0.2.2,192.0.2.3`,
      `add ${MAP_NAME} 192.0.2.1,192.0.2.2,192.0.2.3`,
    ]);
  });

  it('is kept, with its difference, where it is known: a changed value replaced, the key set untouched for it', () => {
    const held = {
      map: [
        '192.0.2.1 tcp 80 10.96.0.1 default/s1',
        '192.0.2.2 tcp 80 10.96.0.9 default/s2',
        '192.0.2.7 tcp 80 10.96.0.7',
      ].join('\n'),
      keySet: ['192.0.2.1 tcp 80', '192.0.2.2 tcp 80', '192.0.2.7 tcp 80'].join('\n'),
    };
    const diff = mapDifference(held, entries.map(mapElement))!;
    expect(diff.removed).to.deep.equal([
      { key: ['192.0.2.2', 'tcp', 80], value: '' },
      { key: ['192.0.2.7', 'tcp', 80], value: '' },
    ]);
    expect(diff.added).to.deep.equal([mapElement(entries[1]!), mapElement(entries[2]!)]);
    for (const lookup of ['set', 'map'] as const) {
      const t = desiredTable('ipv4', state, 0x4000, lookup);
      expect(onMap(writeTable(new Transaction(), t, { map: diff }))).to.deep.equal(
        lookup === 'set'
          ? [
              `add ${MAP_NAME}`,
              `add ${KEY_SET_NAME}`,
              `delete ${KEY_SET_NAME} 192.0.2.7`,
              `delete ${MAP_NAME} 192.0.2.2,192.0.2.7`,
              `add ${MAP_NAME} 192.0.2.2,192.0.2.3`,
              `add ${KEY_SET_NAME} 192.0.2.3`,
            ]
          : [`add ${MAP_NAME}`, `delete ${MAP_NAME} 192.0.2.2,192.0.2.7`, `add ${MAP_NAME} 192.0.2.2,192.0.2.3`],
      );
    }
    // A protocol held by number is deleted by number; an element a line cannot carry: unknown.
    expect(mapDifference({ map: '192.0.2.9 47 0 10.1.1.1' }, [])!.removed).to.deep.equal([
      { key: ['192.0.2.9', 47, 0], value: '' },
    ]);
    expect(mapDifference({ map: '' }, [{ ...mapElement(entries[0]!), comment: 'a\nb' }])).to.equal(undefined);
  });
});
