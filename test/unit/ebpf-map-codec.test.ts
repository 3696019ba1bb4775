import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

import {
  ENTRY_MAP_CAPACITY,
  KEY_SIZE,
  VALUE_SIZE,
  addressBytes,
  decodeElements,
  dumpChanges,
  elementWrites,
  encodeKeys,
  encodeValues,
  type MapChanges,
  type MapEntry,
} from '../../src/backends/ebpf/map-codec.js';
import { diffByKey } from '../../src/model/entry-diff.js';
import { entryKey, type Entry } from '../../src/model/types.js';
import { webEntry } from '../support/fixtures.js';

/** The map element an entry becomes. */
function toMapEntry(e: Entry): MapEntry {
  return {
    family: e.family,
    externalIp: e.externalIp,
    protocol: e.protocol,
    port: e.port,
    clusterIp: e.clusterIp,
    clusterPort: e.port,
  };
}

/**
 * The reference the fast paths (dumpChanges on bytes, elementWrites from the model's changes)
 * are checked against: decode the map, compare by key, upsert what is missing or differs,
 * delete only keys no longer wanted (an upsert overwrites in place).
 */
function mapChanges(current: Iterable<MapEntry>, desired: readonly Entry[]): MapChanges {
  const { removed, added } = diffByKey(
    current,
    desired,
    (old, e) => old.clusterIp === e.clusterIp && old.clusterPort === e.port,
  );
  const upserted = new Set(added.map(entryKey));
  return { upserts: added, deletes: removed.filter((e) => !upserted.has(entryKey(e))) };
}

function entry(over: Partial<Entry> = {}): Entry {
  return webEntry({ port: 443, ...over });
}

const V6: Entry = entry({
  family: 'ipv6',
  externalIp: '2001:db8::10',
  protocol: 'UDP',
  port: 53,
  clusterIp: 'fd00:96::a',
});

describe('ebpf map codec', () => {
  it('writes an IPv4 key and value in network byte order', () => {
    expect(encodeKeys('ipv4', [entry()]).toString('hex')).to.equal('c000020a' + '01bb' + '06' + '00');
    expect(encodeValues('ipv4', [entry()]).toString('hex')).to.equal('0a60000a' + '01bb' + '0000');
  });

  it('writes an IPv6 key and value in network byte order', () => {
    expect(encodeKeys('ipv6', [V6]).toString('hex')).to.equal(
      '20010db8000000000000000000000010' + '0035' + '11' + '00',
    );
    expect(encodeValues('ipv6', [V6]).toString('hex')).to.equal('fd00009600000000000000000000000a' + '0035' + '0000');
  });

  it('packs several elements back to back at the map sizes', () => {
    const entries = [entry(), entry({ protocol: 'UDP' }), entry({ protocol: 'SCTP', port: 9 })];
    expect(encodeKeys('ipv4', entries).length).to.equal(3 * KEY_SIZE.ipv4);
    expect(encodeValues('ipv4', entries).length).to.equal(3 * VALUE_SIZE.ipv4);
    expect(encodeKeys('ipv4', entries).readUInt8(2 * KEY_SIZE.ipv4 + 6)).to.equal(132);
  });

  it('reads back what it writes, with canonical addresses', () => {
    const v4 = [entry(), entry({ externalIp: '198.51.100.255', protocol: 'SCTP', port: 65535, clusterIp: '10.0.0.1' })];
    expect(decodeElements('ipv4', encodeKeys('ipv4', v4), encodeValues('ipv4', v4))).to.deep.equal(v4.map(toMapEntry));
    const v6 = [V6, entry({ family: 'ipv6', externalIp: '2001:db8:0:0:1::', clusterIp: '::1', port: 1 })];
    const decoded = decodeElements('ipv6', encodeKeys('ipv6', v6), encodeValues('ipv6', v6));
    expect(decoded.map((e) => [e.externalIp, e.clusterIp, e.protocol, e.port, e.clusterPort])).to.deep.equal([
      ['2001:db8::10', 'fd00:96::a', 'UDP', 53, 53],
      ['2001:db8:0:0:1::', '::1', 'TCP', 1, 1],
    ]);
  });

  it('keeps the number of a protocol it does not know, so the element can still be deleted', () => {
    const keys = encodeKeys('ipv4', [entry()]);
    keys.writeUInt8(99, 6);
    const [el] = decodeElements('ipv4', keys, encodeValues('ipv4', [entry()]));
    expect(el!.protocol).to.equal(99);
    expect(encodeKeys('ipv4', [el!]).toString('hex')).to.equal(keys.toString('hex'));
  });

  it('refuses an address of the other family and a malformed dump', () => {
    expect(() => addressBytes('ipv4', '2001:db8::1')).to.throw(/not an ipv4 address/);
    expect(() => encodeKeys('ipv6', [entry()])).to.throw(/not an ipv6 address/);
    expect(() => decodeElements('ipv4', Buffer.alloc(9), Buffer.alloc(8))).to.throw(/malformed ipv4 map dump/);
    expect(() => decodeElements('ipv4', Buffer.alloc(16), Buffer.alloc(8))).to.throw(/malformed/);
  });

  it('reference changes: adds missing, rewrites changed, deletes extra, leaves equal alone', () => {
    const keep = entry();
    const change = entry({ protocol: 'UDP' });
    const add = entry({ port: 80 });
    const current: MapEntry[] = [
      toMapEntry(keep),
      { ...toMapEntry(change), clusterIp: '10.96.0.99' },
      toMapEntry(entry({ port: 22 })),
      { ...toMapEntry(entry({ port: 23 })), protocol: 99 },
    ];
    const { upserts, deletes } = mapChanges(current, [keep, change, add]);
    expect(upserts).to.deep.equal([change, add]);
    expect(deletes.map((d) => `${d.protocol}/${d.port}`)).to.deep.equal(['TCP/22', '99/23']);
  });

  it('reference changes: nothing to do when the map already holds the desired entries', () => {
    const desired = [entry(), V6];
    expect(mapChanges(desired.map(toMapEntry), desired)).to.deep.equal({ upserts: [], deletes: [] });
  });

  it('element writes: an added key is upserted, a removed key deleted', () => {
    const gone = entry({ port: 22 });
    const fresh = entry({ port: 80 });
    expect(elementWrites({ removed: [gone], added: [fresh] })).to.deep.equal({ upserts: [fresh], deletes: [gone] });
  });

  it('element writes: a key removed and added with another ClusterIP is overwritten, never deleted', () => {
    const old = entry();
    const changed = entry({ clusterIp: '10.96.0.99' });
    expect(elementWrites({ removed: [old], added: [changed] })).to.deep.equal({ upserts: [changed], deletes: [] });
    // In either order: deleting after the upsert would remove the new element.
    expect(elementWrites({ removed: [old, entry({ port: 1 })], added: [entry({ port: 2 }), changed] })).to.deep.equal({
      upserts: [entry({ port: 2 }), changed],
      deletes: [entry({ port: 1 })],
    });
  });

  it('element writes: a key that only changed Service writes nothing (no element holds the name)', () => {
    const renamed = entry({ service: 'default/other' });
    expect(elementWrites({ removed: [entry()], added: [renamed] })).to.deep.equal({ upserts: [], deletes: [] });
    expect(elementWrites({ removed: [], added: [] })).to.deep.equal({ upserts: [], deletes: [] });
  });

  it('element writes agree with comparing the whole map, for random changes', () => {
    let seed = 7;
    const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
    const pick = (): Entry =>
      entry({
        port: 1 + Math.floor(rnd() * 40),
        protocol: rnd() < 0.5 ? 'TCP' : 'UDP',
        clusterIp: `10.96.0.${Math.floor(rnd() * 3)}`,
        service: `default/s${Math.floor(rnd() * 3)}`,
      });
    const byKey = (list: Entry[]) => [...new Map(list.map((e) => [`${e.protocol} ${e.port}`, e])).values()];
    for (let round = 0; round < 200; round++) {
      const before = byKey(Array.from({ length: 30 }, pick));
      const after = byKey([...before.filter(() => rnd() < 0.7), ...Array.from({ length: 10 }, pick)]);
      const removed = before.filter((e) => !after.includes(e));
      const added = after.filter((e) => !before.includes(e));
      const sort = (w: { upserts: Entry[]; deletes: Array<Pick<MapEntry, 'protocol' | 'port'>> }) => ({
        upserts: w.upserts.map((e) => `${e.protocol} ${e.port} ${e.clusterIp}`).sort(),
        deletes: w.deletes.map((e) => `${e.protocol} ${e.port}`).sort(),
      });
      expect(sort(elementWrites({ removed, added })), `round ${round}`).to.deep.equal(
        sort(mapChanges(before.map(toMapEntry), after)),
      );
    }
  });

  it('dump changes: agree with comparing decoded elements, for random maps', () => {
    let seed = 3;
    const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
    for (const family of ['ipv4', 'ipv6'] as const) {
      const pick = (): Entry =>
        family === 'ipv4'
          ? entry({ port: 1 + Math.floor(rnd() * 40), clusterIp: `10.96.0.${Math.floor(rnd() * 3)}` })
          : { ...V6, port: 1 + Math.floor(rnd() * 40), clusterIp: `fd00:96::${Math.floor(rnd() * 3)}` };
      const byKey = (list: Entry[]) => [...new Map(list.map((e) => [e.port, e])).values()];
      for (let round = 0; round < 100; round++) {
        const held = byKey(Array.from({ length: 25 }, pick));
        const desired = byKey(Array.from({ length: 25 }, pick));
        const { upserts, deleteKeys } = dumpChanges(
          family,
          { keys: encodeKeys(family, held), values: encodeValues(family, held) },
          desired,
        );
        const expected = mapChanges(held.map(toMapEntry), desired);
        expect(upserts, `${family} round ${round}`).to.have.members(expected.upserts);
        const deleted = decodeElements(
          family,
          deleteKeys,
          Buffer.alloc((deleteKeys.length / KEY_SIZE[family]) * VALUE_SIZE[family]),
        );
        expect(deleted.map((e) => e.port).sort(), `${family} round ${round}`).to.deep.equal(
          expected.deletes.map((e) => e.port).sort(),
        );
      }
    }
  });

  it('dump changes: a dumped key that differs from ours only in padding is deleted as dumped, ours written', () => {
    const ours = entry();
    const keys = encodeKeys('ipv4', [ours]);
    keys.writeUInt8(1, 7);
    const { upserts, deleteKeys } = dumpChanges('ipv4', { keys, values: encodeValues('ipv4', [ours]) }, [ours]);
    expect(upserts).to.deep.equal([ours]);
    expect(deleteKeys.toString('hex')).to.equal(keys.toString('hex'));
  });

  it('dump changes: nothing to write for a map that holds the entries, and a malformed dump is refused', () => {
    const held = [entry(), entry({ protocol: 'UDP' }), entry({ port: 80, clusterIp: '10.96.0.11' })];
    const dump = { keys: encodeKeys('ipv4', held), values: encodeValues('ipv4', held) };
    const { upserts, deleteKeys } = dumpChanges('ipv4', dump, [...held].reverse());
    expect(upserts).to.deep.equal([]);
    expect(deleteKeys.length).to.equal(0);
    expect(() => dumpChanges('ipv4', { keys: Buffer.alloc(8), values: Buffer.alloc(16) }, held)).to.throw(
      /malformed ipv4 map dump/,
    );
  });

  it('map capacity matches the BPF source', () => {
    const source = readFileSync(
      fileURLToPath(new URL('../../../bpf/ipvs_node_controller.bpf.c', import.meta.url)),
      'utf8',
    );
    expect(source).to.match(new RegExp(`#define MAX_ENTRIES ${ENTRY_MAP_CAPACITY}\\b`));
  });
});
