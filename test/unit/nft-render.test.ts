// The nft renderer: golden files for the JSON that is applied and the text --dry-run prints.

import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import { parseObjects } from '../../src/cli/objects-file.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import type { Entry } from '../../src/model/types.js';
import { renderDesiredStateText, desiredTable, mapElement } from '../../src/backends/nft/render.js';
import { deleteTables, mapChanges, replaceTable, writeTable } from '../../src/backends/nft/transactions.js';
import { JsonWriter, Transaction, type NftCommand } from '../../src/backends/nft/objects.js';
import type { Family, FamilyState } from '../../src/model/types.js';
import { diffByKey } from '../../src/model/entry-diff.js';
import { entryKey } from '../../src/model/types.js';
import { assertGolden } from '../support/golden.js';
import { CONFIG } from '../support/fixtures.js';

const objects = parseObjects(readFileSync('examples/services.yaml', 'utf8'), 'examples/services.yaml');
const desired = buildDesiredState(objects.services, objects.nodes[0], CONFIG);

const json = new JsonWriter();

function pretty(commands: NftCommand[]): string {
  return JSON.stringify({ nftables: commands }, null, 1) + '\n';
}

/** A whole write of one family as JSON commands (what a first sync applies). */
function renderFullSyncJson(family: Family, state: FamilyState, masqueradeMark: number): NftCommand[] {
  return json.commands(writeTable(new Transaction(), desiredTable(family, state, masqueradeMark)));
}

describe('nft renderer', () => {
  it('renders the example Services as nft text (golden)', () => {
    assertGolden('nft-example.nft', renderDesiredStateText(desired));
  });

  it('renders a full sync of each family as one JSON transaction (golden)', () => {
    assertGolden('nft-example-ipv4.json', pretty(renderFullSyncJson('ipv4', desired.ipv4, desired.masqueradeMark)));
    assertGolden('nft-example-ipv6.json', pretty(renderFullSyncJson('ipv6', desired.ipv6, desired.masqueradeMark)));
  });

  it("marks the node's traffic for masquerade, never a pod's, and translates only a destination local to the node", () => {
    for (const lookup of ['map', 'set'] as const) {
      const t = desiredTable('ipv4', desired.ipv4, desired.masqueradeMark, lookup);
      const kinds = (chain: string) =>
        t.rules
          .filter((r) => r.chain === chain)
          .map((r) => r.statements.map((x) => (x.kind === 'localAddress' ? `${x.field}Local` : x.kind)));
      // Each base chain first asks the source-range check map (a ranged entry's Service chain).
      const [check, ...pods] = kinds('prerouting-from-local-pods');
      expect(check).to.deep.equal(['verdictByMap']);
      expect(pods).to.have.length.above(0);
      for (const rule of pods) {
        expect(rule).to.deep.equal(['sourceInPrefix', 'destinationIn', 'daddrLocal', 'counter', 'dnatByMap']);
      }
      expect(kinds('output-from-node')).to.deep.equal([
        ['verdictByMap'],
        ['destinationIn', 'saddrLocal', 'daddrLocal', 'jump'],
      ]);
      expect(kinds('mark-for-masquerade-and-dnat')).to.deep.equal([['counter', 'orMark', 'dnatByMap']]);
      // Each source counted apart, in counters the table declares.
      const counted = t.rules.flatMap((r) =>
        r.statements.flatMap((x) => (x.kind === 'counter' ? [[r.chain, x.name]] : [])),
      );
      expect(new Set(counted.map(([chain, name]) => `${chain} ${name}`))).to.deep.equal(
        new Set([
          'prerouting-from-local-pods translated-from-pods',
          'mark-for-masquerade-and-dnat translated-from-node',
        ]),
      );
      expect(t.counters.map((c) => c.name)).to.deep.equal(['translated-from-pods', 'translated-from-node']);
    }
  });

  it('renders the interface modes as iifname matches and leaves out the pod set', () => {
    const prefix = buildDesiredState(objects.services, objects.nodes[0], {
      ...CONFIG,
      detectLocalMode: 'InterfaceNamePrefix',
      podInterfaceNamePrefix: 'veth',
    });
    const text = renderDesiredStateText(prefix);
    expect(text).to.match(
      /iifname "veth\*" ip daddr \. meta l4proto \. th dport @external-ip-to-cluster-ip fib daddr type local counter name "translated-from-pods" dnat ip to/,
    );
    expect(text).to.not.match(/local-pod-cidrs/);
    const commands = renderFullSyncJson('ipv4', prefix.ipv4, 0x4000);
    expect(JSON.stringify(commands)).to.match(/"right":"veth\*"/);
    // A pod set left by an earlier state goes; no rule names it.
    const rules = JSON.stringify(commands.filter((c) => (c.add as { rule?: unknown } | undefined)?.rule));
    expect(rules).to.not.match(/local-pod-cidrs/);
    expect(commands).to.deep.include({
      delete: { set: { family: 'ip', table: 'ipvs-node-controller', name: 'local-pod-cidrs' } },
    });
  });

  it('leaves out the prerouting chain, with the reason, when pods cannot be recognised', () => {
    const noNode = buildDesiredState(objects.services, undefined, CONFIG);
    const text = renderDesiredStateText(noNode);
    expect(text).to.match(/# no prerouting chain: NodeCIDR mode: the Node object was not found/);
    expect(text).to.not.match(/prerouting-from-local-pods/);
    const commands = renderFullSyncJson('ipv4', noNode.ipv4, 0x4000);
    expect(JSON.stringify(commands.filter((c) => (c.add as { rule?: unknown } | undefined)?.rule))).to.not.match(
      /prerouting/,
    );
    expect(commands).to.deep.include({
      delete: { chain: { family: 'ip', table: 'ipvs-node-controller', name: 'prerouting-from-local-pods' } },
    });
  });

  it('adds the rules before the map elements, in a rewrite and in a replacement', () => {
    // The kernel checks every element of a map when a rule reading data from it is added: the
    // map must still be empty then.
    const t = desiredTable('ipv4', desired.ipv4, desired.masqueradeMark);
    for (const tx of [writeTable(new Transaction(), t), replaceTable(new Transaction(), t)]) {
      const kinds = tx.operations.map((op) => `${op.verb} ${op.object.kind}`);
      const mapElements = tx.operations.findIndex((op) => op.object === t.mapElements);
      expect(mapElements).to.be.greaterThan(kinds.lastIndexOf('add rule'));
      expect(kinds.indexOf('add rule')).to.be.greaterThan(kinds.lastIndexOf('flush chain'));
    }
  });

  it('writes the mark of --masquerade-bit', () => {
    const d = buildDesiredState(objects.services, objects.nodes[0], { ...CONFIG, masqueradeBit: 0 });
    expect(renderDesiredStateText(d)).to.match(/meta mark set meta mark \| 0x00000001/);
    expect(JSON.stringify(renderFullSyncJson('ipv4', d.ipv4, d.masqueradeMark))).to.match(
      /"\|":\[\{"meta":\{"key":"mark"\}\},1\]/,
    );
  });

  it('renders partial changes as element deletions then additions', () => {
    const [first, second] = desired.ipv4.entries as [Entry, Entry];
    const changed: Entry = { ...second, clusterIp: '10.231.99.99' };
    const { removed, added } = diffByKey(
      desired.ipv4.entries,
      desired.ipv4.entries.filter((e) => e !== first && e !== second).concat(changed),
    );
    expect(removed.map(entryKey).sort()).to.deep.equal([entryKey(first), entryKey(second)].sort());
    expect(added).to.deep.equal([changed]);
    assertGolden(
      'nft-partial.json',
      pretty(json.commands(mapChanges(new Transaction(), 'ipv4', removed.map(mapElement), added.map(mapElement)))),
    );
  });

  it('deletes both tables on cleanup, without failing when they are absent', () => {
    expect(json.commands(deleteTables(new Transaction(), ['ipv4', 'ipv6']))).to.deep.equal([
      { add: { table: { family: 'ip', name: 'ipvs-node-controller' } } },
      { delete: { table: { family: 'ip', name: 'ipvs-node-controller' } } },
      { add: { table: { family: 'ip6', name: 'ipvs-node-controller' } } },
      { delete: { table: { family: 'ip6', name: 'ipvs-node-controller' } } },
    ]);
  });
});
