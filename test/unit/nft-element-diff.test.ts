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
import { Transaction } from '../../src/backends/nft/objects.js';
import {
  KEY_SET_NAME,
  MAP_NAME,
  OWN_SOURCE_SET,
  SOURCE_CHECK_MAP,
  sourceChainName,
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

describe('nft whole write: the source-range check map and own-address set', () => {
  const key = ['192.0.2.1', 'tcp', 80];
  const chain = sourceChainName('default/a');

  it('reads a listing of the check map and of the own-address set', () => {
    const checks = JSON.stringify({
      nftables: [
        { metainfo: { version: '1.0.6' } },
        {
          map: {
            name: SOURCE_CHECK_MAP,
            elem: [
              [{ concat: key }, { jump: { target: chain } }],
              [{ concat: ['2001:db8::1', 'udp', 53] }, { jump: { target: 'x' } }],
            ],
          },
        },
      ],
    });
    expect(listedSetElements(checks, 'verdicts')).to.deep.equal([
      { key, chain },
      { key: ['2001:db8::1', 'udp', 53], chain: 'x' },
    ]);
    const own = JSON.stringify({
      nftables: [{ set: { name: OWN_SOURCE_SET, elem: [{ concat: [...key, '192.0.2.1'] }] } }],
    });
    expect(listedSetElements(own, 'sourced')).to.deep.equal([{ key: [...key, '192.0.2.1'], value: '' }]);
    expect(listedSetElements(JSON.stringify({ nftables: [{ set: { name: 'x' } }] }), 'keys')).to.deep.equal([]);
    // A verdict that is no jump, or a key of another form: not read (then flushed and refilled).
    const accept = { nftables: [{ map: { elem: [[{ concat: key }, { accept: null }]] } }] };
    expect(() => listedSetElements(JSON.stringify(accept), 'verdicts')).to.throw(/unexpected set element/);
    expect(() => listedSetElements(own, 'keys')).to.throw(/unexpected set element/);
    expect(() => listedSetElements(JSON.stringify({ nftables: [] }), 'sourced')).to.throw(/no set/);
  });

  it('reads the lines of a netlink dump of each; a verdict other than a jump is not read', () => {
    expect(
      sourceRangeLines(`192.0.2.1 tcp 80 jump ${chain}\n192.0.2.9 132 1 jump x\n`, '192.0.2.1 tcp 80 192.0.2.1\n'),
    ).to.deep.equal({
      checks: [
        { key, chain },
        { key: ['192.0.2.9', 132, 1], chain: 'x' },
      ],
      own: [{ key: [...key, '192.0.2.1'], value: '' }],
    });
    expect(sourceRangeLines('', '')).to.deep.equal({ checks: [], own: [] });
    expect(() => sourceRangeLines('192.0.2.1 tcp 80 accept', '')).to.throw(/unexpected check element/);
  });

  it('adds and removes only the elements that differ', () => {
    const held = {
      checks: [
        { key, chain },
        { key: ['192.0.2.9', 'tcp', 1], chain },
      ],
      own: [{ key: [...key, '192.0.2.1'], value: '' }],
    };
    const wanted = { checks: [{ key, chain: 'other' }], own: held.own };
    const diff = sourceRangeDifference(held, wanted);
    expect(diff.checks).to.deep.equal({ removed: held.checks, added: [{ key, chain: 'other' }] });
    expect(diff.own).to.deep.equal({ removed: [], added: [] });
  });

  it('writes the difference into the whole write instead of flushing, when it is known', () => {
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
        const ranged = (name: string) => name === SOURCE_CHECK_MAP || name === OWN_SOURCE_SET;
        if (o.kind === 'element') return ranged(o.set) ? [`${verb} ${o.set} ${o.elements.length}`] : [];
        return (o.kind === 'set' || o.kind === 'map') && verb !== 'add' && ranged(o.name) ? [`${verb} ${o.name}`] : [];
      });
    // Unknown: flushed and filled again.
    expect(onSets(writeTable(new Transaction(), t))).to.have.members([
      `flush ${OWN_SOURCE_SET}`,
      `flush ${SOURCE_CHECK_MAP}`,
      `add ${SOURCE_CHECK_MAP} 1`,
      `add ${OWN_SOURCE_SET} 1`,
    ]);
    // Known and right: nothing written to them, whether the map is replaced or kept.
    const held = { checks: [{ key, chain }], own: [{ key: [...key, '192.0.2.1'], value: '' }] };
    for (const write of [writeTable, writeTableButElements]) {
      expect(onSets(write(new Transaction(), t, { sourceRanges: held }))).to.deep.equal([]);
    }
    const extra = { checks: [...held.checks, { key: ['192.0.2.2', 'tcp', 80], chain }], own: held.own };
    expect(onSets(writeTable(new Transaction(), t, { sourceRanges: extra }))).to.deep.equal([
      `delete ${SOURCE_CHECK_MAP} 1`,
    ]);
  });

  it('removes the source-range chains of an earlier state that nothing wants, once no element jumps to them', () => {
    const state: FamilyState = { entries: [], localPodMatch: { kind: 'cidrs', cidrs: [] } };
    const t = desiredTable('ipv4', state, 0x4000, 'set');
    const stale = sourceChainName('gone/svc');
    const tx = writeTable(new Transaction(), t, { sourceChains: [stale] });
    const verbs = tx.operations
      .filter(
        ({ object: o }) =>
          (o.kind === 'chain' && o.name === stale) || (o.kind === 'map' && o.name === SOURCE_CHECK_MAP),
      )
      .map(({ verb, object: o }) => `${verb} ${o.kind}`);
    // Emptied of its rules and of the elements that jump to it (the map flushed), then deleted.
    expect(verbs.indexOf('flush map')).to.be.lessThan(verbs.lastIndexOf('delete chain'));
    expect(verbs).to.include('flush chain');
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
