// The model's sorted entries (src/model/sorted-entries.ts): kept in chunks that a hand-out shares
// until the next change to them. Every hand-out must read as the sorted entries of its moment,
// whatever came after it, and its changes must lead from the hand-out before. Pure.

import { expect } from 'chai';
import { SortedEntries, compareKeys, type EntryHandOut } from '../../src/model/sorted-entries.js';
import type { Entry } from '../../src/model/types.js';
import { seededRandom } from '../../bench/stats.js';
import { webEntry } from '../support/fixtures.js';

const key = (n: number) => n.toString(16).padStart(6, '0');
const entryOf = (n: number, version: number): Entry =>
  webEntry({ port: 1 + (n % 60_000), clusterIp: `10.96.${version & 255}.${n & 255}`, service: `ns/s-${n}` });

describe('sorted entries in shared chunks', () => {
  it('every hand-out keeps the entries of its moment through thousands of sets, deletes and merges; its changes lead from the one before', () => {
    // bench's generator (mulberry32): the fixtures' one repeats within a few hundred keys of 12,000.
    const random = seededRandom(37);
    const sorted = new SortedEntries();
    const truth = new Map<string, Entry>();
    const handOuts: Array<{ snapshot: EntryHandOut; expected: Entry[] }> = [];
    const expectedNow = () => [...truth.entries()].sort((a, b) => compareKeys(a[0], b[0])).map(([, e]) => e);
    let previous: Entry[] = [];
    for (let step = 0; step < 160; step++) {
      const bulk = step % 40 === 0;
      if (bulk) {
        // Thousands at once, through the one-pass merge: chunks are rebuilt.
        const sets: Array<{ sortKey: string; entry: Entry }> = [];
        const deletes: string[] = [];
        const seen = new Set<string>();
        for (let i = 0; i < 2500; i++) {
          const n = Math.floor(random() * 12_000);
          const k = key(n);
          if (seen.has(k)) continue;
          seen.add(k);
          if (random() < 0.2) {
            deletes.push(k);
            truth.delete(k);
          } else {
            const e = entryOf(n, step);
            sets.push({ sortKey: k, entry: e });
            truth.set(k, e);
          }
        }
        sorted.merge(sets, deletes);
      } else if (step % 40 === 20) {
        // 700 keys one at a time between two neighbours: the chunk that holds them splits, again and again.
        const at = key(Math.floor(random() * 12_000));
        for (let i = 0; i < 700; i++) {
          const k = `${at}~${String(i).padStart(3, '0')}`;
          const e = entryOf(i, step);
          sorted.set(k, e);
          truth.set(k, e);
        }
      } else {
        // A few at a time: inserts in the middle split chunks, deletes empty them.
        for (let i = 0; i < 1 + Math.floor(random() * 40); i++) {
          const n = Math.floor(random() * 12_000);
          const k = key(n);
          if (random() < 0.35) {
            sorted.delete(k);
            truth.delete(k);
          } else {
            const e = entryOf(n, step);
            sorted.set(k, e);
            truth.set(k, e);
          }
        }
      }
      const { snapshot, changes } = sorted.publish();
      const expected = expectedNow();
      expect(snapshot.length, `step ${step}`).to.equal(expected.length);
      if (step > 0) {
        expect(changes?.since, `step ${step}`).to.equal(handOuts.at(-1)!.snapshot);
        const held = new Set(previous);
        for (const e of changes!.removed) expect(held.delete(e), `step ${step}: removes what was there`).to.equal(true);
        for (const e of changes!.added) held.add(e);
        expect(held.size, `step ${step}`).to.equal(expected.length);
        for (const e of expected) expect(held.has(e), `step ${step}`).to.equal(true);
      }
      handOuts.push({ snapshot, expected });
      previous = expected;
      // Read some now, others only later: either way they read as at their moment.
      if (random() < 0.3) expect(snapshot.entries()).to.deep.equal(expected);
    }
    expect(handOuts.at(-1)!.expected.length).to.be.above(3000);
    for (const [i, { snapshot, expected }] of handOuts.entries()) {
      const read = snapshot.entries();
      expect(read.length, `hand-out ${i}`).to.equal(expected.length);
      expect(
        read.every((e, j) => e === expected[j]),
        `hand-out ${i}`,
      ).to.equal(true);
      expect(snapshot.entries(), 'the same array every time').to.equal(read);
    }
    // Nothing changed since the last: the same hand-out, with no change.
    const again = sorted.publish();
    expect(again.snapshot).to.equal(handOuts.at(-1)!.snapshot);
    expect(again.changes).to.deep.include({ removed: [], added: [] });
  });
});
