// entryDiff (the model's one difference) finds a partial sync's element changes by walking the programmed entries and the
// new ones side by side; whatever the input, applying its changes must give the new entries.

import { expect } from 'chai';
import { diffByKey, entryDiff } from '../../src/model/entry-diff.js';
import { entryKey, type Entry } from '../../src/model/types.js';
import { seededRandom } from '../support/fixtures.js';

function entry(host: number, cluster: number): Entry {
  return {
    family: 'ipv4',
    externalIp: `192.0.2.${host}`,
    protocol: 'TCP',
    port: 80,
    clusterIp: `10.96.0.${cluster}`,
    service: `default/s${cluster}`,
  };
}

const byHost = (a: Entry, b: Entry) => Number(a.externalIp.split('.')[3]) - Number(b.externalIp.split('.')[3]);
const contents = (entries: Entry[]) => entries.map((e) => `${entryKey(e)} ${e.clusterIp} ${e.service}`).sort();

describe('the entry difference: entryDiff', () => {
  it('turns the programmed entries into the new ones, and agrees with the diff by key', () => {
    const rnd = seededRandom(7);
    let walked = 0;
    for (let round = 0; round < 5000; round++) {
      const hosts = [...new Set(Array.from({ length: Math.floor(rnd() * 12) }, () => Math.floor(rnd() * 20)))];
      const programmed = hosts.map((h) => entry(h, Math.floor(rnd() * 3))).sort(byHost);
      // Most rounds as the model does it (same objects, sorted); some copied, changed or unordered.
      let next = programmed.filter(() => rnd() > 0.2);
      for (let k = 0; k < 3; k++) {
        const h = Math.floor(rnd() * 20);
        if (rnd() < 0.5 && !next.some((e) => e.externalIp === `192.0.2.${h}`))
          next.push(entry(h, Math.floor(rnd() * 3)));
      }
      next = next.map((e) => (rnd() < 0.1 ? { ...e } : rnd() < 0.1 ? { ...e, clusterIp: '10.96.0.99' } : e));
      if (rnd() < 0.8) next.sort(byHost);
      else next.reverse();

      const changes = entryDiff({ entries: programmed, objects: new Set(programmed) }, { entries: next });
      if (!changes.renewed) walked++;
      const kernel = new Map(programmed.map((e) => [entryKey(e), e]));
      for (const e of changes.removed)
        expect(kernel.delete(entryKey(e)), `round ${round}: removes an absent element`).to.equal(true);
      for (const e of changes.added) {
        expect(kernel.has(entryKey(e)), `round ${round}: adds a present element`).to.equal(false);
        kernel.set(entryKey(e), e);
      }
      expect(contents([...kernel.values()]), `round ${round}`).to.deep.equal(contents(next));

      const byKey = diffByKey(programmed, next);
      expect(contents(changes.removed), `round ${round}: removed`).to.deep.equal(contents(byKey.removed));
      expect(contents(changes.added), `round ${round}: added`).to.deep.equal(contents(byKey.added));
      for (const [old, current] of changes.replaced) {
        expect(entryKey(old)).to.equal(entryKey(current));
        expect(old).to.not.equal(current);
      }
    }
    expect(walked, 'most rounds are found by walking').to.be.above(2500);
  });

  it('finds nothing to write when the same entries come back as new objects', () => {
    const programmed = [entry(1, 1), entry(2, 2)];
    const changes = entryDiff(
      { entries: programmed, objects: new Set(programmed) },
      { entries: programmed.map((e) => ({ ...e })) },
    );
    expect([changes.removed, changes.added]).to.deep.equal([[], []]);
    expect(changes.replaced).to.have.lengthOf(2);
  });
});
