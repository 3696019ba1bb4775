// Every read back takes a listed address as the model writes it: the nft listing's comparison
// (on the event loop and in its worker), the nft command's listing of a set or map,
// ip6tables-save's rules and the eBPF map's bytes. nft and ip6tables-save print with inet_ntop,
// which writes `::1.2.3.4` where the model writes `::102:304` (model/ip.ts); the text below is
// theirs (the kernel tests read it from the tools themselves).

import { expect } from 'chai';
import { addressText } from '../../src/backends/ebpf/map-codec.js';
import { emptyNatTable, KUBE_MARK_MASQ, parseNatSave } from '../../src/backends/iptables/parse.js';
import { renderFamilyRestore } from '../../src/backends/iptables/render.js';
import { shapeDrift } from '../../src/backends/iptables/verify.js';
import { listedSetElements } from '../../src/backends/nft/element-diff.js';
import { diffListing, expectedLines, sourceRangeLines } from '../../src/backends/nft/listing-diff.js';
import {
  KEY_SET_NAME,
  MAP_NAME,
  OWN_SOURCE_SET,
  SOURCE_CHECK_MAP,
  sourceChainName,
} from '../../src/backends/nft/render.js';
import type { Entry, FamilyState } from '../../src/model/types.js';

/** Entries whose addresses inet_ntop prints in mixed notation, each as nft lists it. */
const entries: Array<Entry & { listed: [string, string] }> = [
  ['::102:304', '::a60:1', '::1.2.3.4', '::10.96.0.1', ['::102:300/120']],
  ['::1:0', 'fd00:96::1', '::0.1.0.0', 'fd00:96::1', undefined],
  ['::ffff:1', '::ffff', '::255.255.0.1', '::ffff', ['::a00:0/104', 'fd00:1::/64']],
  ['64:ff9b::102:304', '::c000:202', '64:ff9b::102:304', '::192.0.2.2', undefined],
].map(([externalIp, clusterIp, listedIp, listedValue, sourceRanges], i) => ({
  family: 'ipv6' as const,
  externalIp: externalIp as string,
  protocol: 'TCP' as const,
  port: 443,
  clusterIp: clusterIp as string,
  service: `v6/svc-${i}`,
  ...(sourceRanges ? { sourceRanges: sourceRanges as string[] } : {}),
  listed: [listedIp as string, listedValue as string],
}));

/** `nft -j list table ip6 ...` of the entries' map, key set, own-address set and check map. */
function listing(): string {
  const key = (e: (typeof entries)[number]) => ({ concat: [e.listed[0], 'tcp', e.port] });
  const ranged = entries.filter((e) => e.sourceRanges);
  return JSON.stringify({
    nftables: [
      {
        map: { name: MAP_NAME, elem: entries.map((e) => [{ elem: { val: key(e), comment: e.service } }, e.listed[1]]) },
      },
      { set: { name: KEY_SET_NAME, elem: entries.map(key) } },
      { set: { name: OWN_SOURCE_SET, elem: ranged.map((e) => ({ concat: [...key(e).concat, e.listed[0]] })) } },
      {
        map: {
          name: SOURCE_CHECK_MAP,
          elem: ranged.map((e) => [key(e), { jump: { target: sourceChainName(e.service) } }]),
        },
      },
    ],
  });
}

describe('read backs take listed addresses as the model writes them', () => {
  for (const [where, offThreadAbove] of [
    ['on the event loop', Infinity],
    ['in a worker', 0],
  ] as const) {
    it(`the nft listing's comparison ${where}: every element matches, nothing is residue`, async () => {
      const diff = await diffListing(listing(), await expectedLines(entries), MAP_NAME, offThreadAbove, KEY_SET_NAME);
      expect(diff.unmatched).to.deep.equal([]);
      expect(diff.residue).to.deep.equal([]);
      expect(diff.keyResidue).to.deep.equal([]);
      const want = sourceRangeLines(entries);
      expect({
        checks: [...diff.sourceRanges!.checks].sort(),
        own: [...diff.sourceRanges!.own].sort(),
      }).to.deep.equal(want);
    });
  }

  it("the nft command's listing of the own-address set and the check map", () => {
    const doc = JSON.parse(listing()) as { nftables: unknown[] };
    const one = (i: number) => JSON.stringify({ nftables: [doc.nftables[i]] });
    expect(listedSetElements(one(2), 'sourced').map((e) => e.key)).to.deep.equal([
      ['::102:304', 'tcp', 443, '::102:304'],
      ['::ffff:1', 'tcp', 443, '::ffff:1'],
    ]);
    expect(listedSetElements(one(3), 'verdicts')).to.deep.equal([
      { key: ['::102:304', 'tcp', 443], chain: sourceChainName('v6/svc-0') },
      { key: ['::ffff:1', 'tcp', 443], chain: sourceChainName('v6/svc-2') },
    ]);
  });

  it("ip6tables-save's rules of our chains: the table holds the state, and a whole write has nothing to change", async () => {
    const state: FamilyState = { entries, localPodMatch: { kind: 'cidrs', cidrs: ['fd01::/64'] } };
    const current = emptyNatTable();
    current.chains.add(KUBE_MARK_MASQ);
    // What -save prints after the whole write: every address as inet_ntop writes it.
    const ntop: Record<string, string> = {
      '::102:304': '::1.2.3.4',
      '::a60:1': '::10.96.0.1',
      '::1:0': '::0.1.0.0',
      '::ffff:1': '::255.255.0.1',
      '::c000:202': '::192.0.2.2',
      '::102:300': '::1.2.3.0',
      '::a00:0': '::10.0.0.0',
    };
    const saved = renderFamilyRestore('ipv6', state, 0x4000, current)
      .text.replace('*nat\n', `*nat\n:${KUBE_MARK_MASQ} - [0:0]\n`)
      .replace(/^-I (PREROUTING|OUTPUT) 1 /gm, '-A $1 ')
      .replace(
        /(-[ds] |--to-destination )([0-9a-f:]+)/g,
        (_, flag: string, address: string) => flag + (ntop[address] ?? address),
      );
    expect(saved).to.include('-d ::1.2.3.4/128');
    expect(saved).to.include('-s ::1.2.3.0/120');
    const view = parseNatSave(saved);
    const shape = { state: { ...state, entries: [] }, masqueradeMark: 0x4000 };
    expect(await shapeDrift('ipv6', view, entries, shape)).to.deep.equal({ drift: [], strays: [] });
    expect(renderFamilyRestore('ipv6', state, 0x4000, view).upToDate).to.equal(true);
  });

  it("ip6tables-save's other text is left as it is: quoted comments, and the rules of other chains", () => {
    const view = parseNatSave(
      [
        '*nat',
        ':PREROUTING ACCEPT [0:0]',
        ':IPVS_OUTPUT_4 - [0:0]',
        '-A PREROUTING -d ::1.2.3.4/128 -j ACCEPT',
        '-A IPVS_OUTPUT_4 -d ::1.2.3.4/128 -m comment --comment "to ::1.2.3.4" -j DNAT --to-destination [::0.1.0.1]:80',
        'COMMIT',
      ].join('\n'),
    );
    expect(view.rules.get('PREROUTING')).to.deep.equal(['-d ::1.2.3.4/128 -j ACCEPT']);
    expect(view.rules.get('IPVS_OUTPUT_4')).to.deep.equal([
      '-d ::102:304/128 -m comment --comment "to ::1.2.3.4" -j DNAT --to-destination [::1:1]:80',
    ]);
  });

  it("the eBPF map's bytes", () => {
    const bytes = (groups: number[]) => Buffer.from(groups.flatMap((g) => [g >> 8, g & 0xff]));
    expect(addressText('ipv6', bytes([0, 0, 0, 0, 0, 0, 0x102, 0x304]))).to.equal('::102:304');
    expect(addressText('ipv6', bytes([0, 0, 0, 0, 0, 0xffff, 0x102, 0x304]))).to.equal('::ffff:102:304');
    expect(addressText('ipv6', bytes([1, 0, 0, 1, 0, 0, 0, 1]))).to.equal('1:0:0:1::1');
  });
});
