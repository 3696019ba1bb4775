// loadBalancerSourceRanges in the iptables backend (docs/semantics.md, "Source ranges"; docs/iptables.md,
// "Source ranges"): a Service's ranges are written once, in its source-range chains, whatever its
// number of entries; its entries' bucket rules go there. Rendering, partial writes and the read
// back, pure or against the stand-in nat table (test/doubles/fake-iptables.ts); the kernel test
// (test/kernel/source-ranges.test.ts) sends the packets.
// UPDATE_GOLDEN=1 rewrites the golden files from the current renderer (review the diff).

import { expect } from 'chai';
import { Reconciler } from '../../src/reconciler/reconciler.js';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import {
  OUTPUT_CHAIN,
  PREROUTING_CHAIN,
  isOurChain,
  isServiceChain,
  parseBucketChain,
  serviceChain,
} from '../../src/backends/iptables/layout.js';
import { KUBE_MARK_MASQ, emptyNatTable, parseNatSave, type NatTableView } from '../../src/backends/iptables/parse.js';
import { WholeWriteNeeded, planPartialWrite, annexPartialWrite } from '../../src/backends/iptables/partial-write.js';
import { IptablesAnnex } from '../../src/backends/iptables/annex.js';
import { compareState, renderChainRules, renderFamilyRestore } from '../../src/backends/iptables/render.js';
import { renderCleanupRestore } from '../../src/backends/iptables/nat-view.js';
import type { DesiredState, Entry, Family, FamilyState, LocalPodMatch } from '../../src/model/types.js';
import { FakeIptables } from '../doubles/fake-iptables.js';
import { assertGolden } from '../support/golden.js';
import { webEntry } from '../support/fixtures.js';

type Fields = Partial<Entry>;

const entry = webEntry;

const PODS: LocalPodMatch = { kind: 'cidrs', cidrs: ['10.244.1.0/24'] };
const RANGES = ['10.0.0.0/8', '192.0.2.0/24', '203.0.113.0/24'];
const WEB_PRE = serviceChain(PREROUTING_CHAIN, 'default/web');
const WEB_OUT = serviceChain(OUTPUT_CHAIN, 'default/web');

/** 64 ranges, one of them 0.0.0.0/1 holding the LoadBalancer IP, as the model gives them (sorted). */
const WIDE = ['0.0.0.0/1', ...Array.from({ length: 63 }, (_, i) => `200.0.${i}.0/24`)].sort();

/** `ports` entries of default/web on 100.64.0.10 with `ranges`. */
function ported(ports: number, ranges: readonly string[], over: Fields = {}): Entry[] {
  return Array.from({ length: ports }, (_, i) =>
    entry({ externalIp: '100.64.0.10', port: 1000 + i, sourceRanges: ranges, sourcesFromNode: true, ...over }),
  );
}

/** The nat table after a whole write of `state` into an empty one (its jumps appended). */
function written(family: Family, state: FamilyState): NatTableView {
  const text = renderFamilyRestore(family, state, 0x4000, emptyNatTable())
    .text.replace(/^-I (PREROUTING|OUTPUT) 1 /gm, '-A $1 ')
    .replace(/ --or-mark (0x[0-9a-f]+)$/gm, ' --set-xmark $1/$1');
  return parseNatSave(text);
}

const pause = () => Promise.resolve();

describe('iptables source ranges: the rules', () => {
  it("writes a Service's ranges once: one rule per entry and hook, whatever the number of ranges", () => {
    const state: FamilyState = { entries: ported(1000, WIDE), localPodMatch: PODS };
    const r = renderFamilyRestore('ipv4', state, 0x4000, emptyNatTable());
    expect(r.rejected).to.deep.equal([]);
    const lines = r.text.split('\n');
    const count = (prefix: string) => lines.filter((l) => l.startsWith(prefix)).length;
    expect(count('-A IPVS_PREROUTING_10 ')).to.equal(1000);
    expect(count('-A IPVS_OUTPUT_10 ')).to.equal(1000);
    // Prerouting: the one range that meets the pod CIDR (0.0.0.0/1). Output: a mark and a DNAT
    // rule per range. The LoadBalancer IP is inside 0.0.0.0/1 and sourcesFromNode is set: that
    // range translates it, no rule of its own.
    expect(count(`-A ${WEB_PRE} `)).to.equal(1);
    expect(count(`-A ${WEB_OUT} `)).to.equal(128);
    // main wrote 191,010 lines (95 ranges, split around the address, x 1,000 entries x 2 rules).
    expect(lines.length).to.be.below(2200);
    for (const l of lines.filter((x) => x.startsWith('-A IPVS_OUTPUT_10 '))) expect(l).to.match(/ -g IPVS_OUT_SR_/);
  });

  it('names each Service its chains within the 28 characters iptables takes, known as ours by name', () => {
    const names = ['default/web', 'default/web2', `${'n'.repeat(63)}/${'s'.repeat(63)}`].flatMap((s) => [
      serviceChain(PREROUTING_CHAIN, s),
      serviceChain(OUTPUT_CHAIN, s),
    ]);
    expect(new Set(names).size).to.equal(6);
    for (const name of names) {
      expect(name.length, name).to.be.at.most(28);
      expect(name).to.match(/^IPVS_(PRE|OUT)_SR_[A-Z2-7]{16}$/);
      expect(isOurChain(name)).to.equal(true);
      expect(isServiceChain(name)).to.equal(true);
      expect(parseBucketChain(name)).to.equal(undefined);
    }
    // The same Service, the same name, every time (a restart finds its chains by name).
    expect(serviceChain(OUTPUT_CHAIN, 'default/web')).to.equal('IPVS_OUT_SR_QKZ232OQBTIWIKSN');
    expect(isServiceChain('IPVS_OUT_SR_qkz232oqbtiwiksn')).to.equal(false);
    expect(isOurChain('IPVS_OUT_SR_')).to.equal(false);
  });

  it('the address itself as the source: a RETURN where a range holds it, a translation with sourcesFromNode where none does', () => {
    // 192.0.2.10 is inside 192.0.2.0/24, 198.51.100.7 in no range.
    const rules = (fromNode: boolean) =>
      renderChainRules(
        'ipv4',
        {
          entries: [
            entry({ sourceRanges: RANGES, ...(fromNode ? { sourcesFromNode: true } : {}) }),
            entry({ externalIp: '198.51.100.7', sourceRanges: RANGES, ...(fromNode ? { sourcesFromNode: true } : {}) }),
          ],
          localPodMatch: { kind: 'none', reason: 'x' },
        },
        0x4000,
        false,
      ).chains.get(WEB_OUT)!;
    const comment = '-m comment --comment "default/web"';
    const translate = (head: string) => [
      `${head} ${comment} -j MARK --or-mark 0x4000`,
      `${head} ${comment} -j DNAT --to-destination 10.96.0.10`,
    ];
    const ranges = RANGES.flatMap((r) => translate(`-s ${r}`));
    // Without sourcesFromNode the node's own connection from 192.0.2.10 is not translated, though
    // 192.0.2.0/24 holds it: its RETURN comes before that range.
    expect(rules(false)).to.deep.equal([`-s 192.0.2.10/32 -d 192.0.2.10/32 ${comment} -j RETURN`, ...ranges]);
    // With it, 198.51.100.7 (in no range) is translated from itself; 192.0.2.10 by its range.
    expect(rules(true)).to.deep.equal([...translate('-s 198.51.100.7/32 -d 198.51.100.7/32'), ...ranges]);
  });

  it('prerouting: the pod match in the bucket, the range in the chain; a range no pod CIDR meets has no rule', () => {
    const state = (localPodMatch: LocalPodMatch): FamilyState => ({
      entries: [entry({ sourceRanges: ['10.244.0.0/16', '10.244.2.0/24', '203.0.113.0/24'] })],
      localPodMatch,
    });
    const two = renderChainRules(
      'ipv4',
      state({ kind: 'cidrs', cidrs: ['10.244.1.0/24', '10.244.2.0/24'] }),
      0x4000,
      false,
    );
    expect(two.chains.get('IPVS_PREROUTING_10')!.map((r) => r.replace(/ -p tcp .* -g /, ' -g '))).to.deep.equal([
      `-s 10.244.1.0/24 -d 192.0.2.10/32 -g ${WEB_PRE}`,
      `-s 10.244.2.0/24 -d 192.0.2.10/32 -g ${WEB_PRE}`,
    ]);
    expect(two.chains.get(WEB_PRE)!.map((r) => r.replace(/ -m comment .*/, ''))).to.deep.equal([
      '-s 10.244.0.0/16',
      '-s 10.244.2.0/24',
    ]);
    // An interface match says nothing of the source: every range.
    const byInterface = renderChainRules('ipv4', state({ kind: 'interface', name: 'cni0' }), 0x4000, false);
    expect(byInterface.chains.get(WEB_PRE)).to.have.length(3);
    // No local pod match: no prerouting chains at all.
    const none = renderChainRules('ipv4', state({ kind: 'none', reason: 'x' }), 0x4000, false);
    expect(none.chains.has(WEB_PRE)).to.equal(false);
    expect(none.chains.get(WEB_OUT)).to.have.length(6);
  });

  it('leaves out the entries of a Service that do not share its ranges, ClusterIP or sourcesFromNode, and all of one whose ranges are not valid', () => {
    const state: FamilyState = {
      entries: [
        entry({ port: 80, sourceRanges: RANGES }),
        entry({ port: 81, sourceRanges: RANGES.slice(1) }),
        entry({ port: 82, sourceRanges: RANGES, clusterIp: '10.96.0.11' }),
        entry({ port: 83, sourceRanges: RANGES, sourcesFromNode: true }),
        entry({ port: 84, sourceRanges: [...RANGES] }),
        entry({ service: 'default/bad', externalIp: '192.0.2.20', sourceRanges: ['10.0.0.1/8'] }),
        entry({ service: 'default/bad', externalIp: '192.0.2.20', port: 443, sourceRanges: ['10.0.0.1/8'] }),
        entry({ service: 'default/open', externalIp: '192.0.2.30' }),
      ],
      localPodMatch: PODS,
    };
    const r = renderChainRules('ipv4', state, 0x4000, false);
    expect(r.programmed).to.equal(3);
    expect(r.leftOut.map((e) => `${e.service} ${e.port}`).sort()).to.deep.equal([
      'default/bad 443',
      'default/bad 80',
      'default/web 81',
      'default/web 82',
      'default/web 83',
    ]);
    expect(r.rejected.find((x) => x.item === 'default/web 192.0.2.10 tcp/81')!.reason).to.match(
      /differ from those of default\/web 192\.0\.2\.10 tcp\/80/,
    );
    expect(r.rejected.find((x) => x.item === 'default/bad 192.0.2.20 tcp/80')!.reason).to.match(/not a canonical/);
    expect([...r.services.keys()]).to.deep.equal(['default/web']);
    expect(r.chains.has(serviceChain(OUTPUT_CHAIN, 'default/bad'))).to.equal(false);
  });

  it('renders Services with source ranges in both families (golden)', () => {
    const v4: FamilyState = {
      entries: [
        entry({ sourceRanges: RANGES }),
        entry({ port: 443, sourceRanges: RANGES }),
        entry({ externalIp: '198.51.100.7', sourceRanges: RANGES }),
        entry({ service: 'default/open', externalIp: '192.0.2.11', clusterIp: '10.96.0.11' }),
        entry({
          service: 'default/from-node',
          externalIp: '192.0.2.12',
          clusterIp: '10.96.0.12',
          protocol: 'UDP',
          port: 53,
          sourceRanges: ['10.244.1.0/24', '203.0.113.0/24'],
          sourcesFromNode: true,
        }),
      ],
      localPodMatch: PODS,
    };
    const v6: FamilyState = {
      entries: [
        entry({
          family: 'ipv6',
          externalIp: '2001:db8::10',
          clusterIp: 'fd00::10',
          sourceRanges: ['2001:db8::/64', 'fd01::/64'],
        }),
      ],
      localPodMatch: { kind: 'cidrs', cidrs: ['fd01::/64'] },
    };
    const withMasq = emptyNatTable();
    withMasq.chains.add(KUBE_MARK_MASQ);
    const text = [
      renderFamilyRestore('ipv4', v4, 0x4000, withMasq).text,
      renderFamilyRestore('ipv6', v6, 0x4000, emptyNatTable()).text,
    ].join('\n');
    assertGolden('iptables-source-ranges.txt', text);
  });
});

describe('iptables source ranges: the read back and the whole write', () => {
  const state: FamilyState = {
    entries: [entry({ sourceRanges: RANGES }), entry({ port: 443, sourceRanges: RANGES })],
    localPodMatch: PODS,
  };

  it("compares a Service's chains in their order, and names the chains of ours nothing wants", async () => {
    const view = written('ipv4', state);
    expect(await compareState(view, 'ipv4', state, 0x4000, pause)).to.deep.equal({ held: true, strays: [] });
    // The RETURN of the address itself after the range that holds it translates it: not held.
    const out = view.rules.get(WEB_OUT)!;
    expect(out[0]).to.match(/-j RETURN$/);
    view.rules.set(WEB_OUT, [...out.slice(1, 5), out[0]!, ...out.slice(5)]);
    expect((await compareState(view, 'ipv4', state, 0x4000, pause)).held).to.equal(false);
    const fewer = written('ipv4', state);
    fewer.rules.get(WEB_PRE)!.pop();
    expect((await compareState(fewer, 'ipv4', state, 0x4000, pause)).held).to.equal(false);
    const other = written('ipv4', state);
    other.rules.set(
      WEB_OUT,
      other.rules.get(WEB_OUT)!.map((r) => r.replace('10.96.0.10', '10.96.0.99')),
    );
    expect((await compareState(other, 'ipv4', state, 0x4000, pause)).held).to.equal(false);
    // A Service whose ranges went (its entries translated from every source): its chains are strays.
    const open: FamilyState = { ...state, entries: state.entries.map((e) => entry({ port: e.port })) };
    const before = written('ipv4', state);
    expect(await compareState(before, 'ipv4', open, 0x4000, pause)).to.deep.equal({
      held: false,
      strays: [WEB_PRE, WEB_OUT],
    });
    const removal = renderFamilyRestore('ipv4', open, 0x4000, before).text;
    expect(removal, 'the whole write removes them').to.include(`:${WEB_OUT} - [0:0]\n`);
    expect(removal).to.include(`-X ${WEB_PRE}\n-X ${WEB_OUT}\nCOMMIT`);
    // A stray another writer's rule jumps to cannot be deleted: left, with what it jumps to.
    const referenced = written('ipv4', state);
    referenced.chains.add('OTHER');
    referenced.rules.set('OTHER', [`-j ${WEB_OUT}`]);
    expect((await compareState(referenced, 'ipv4', open, 0x4000, pause)).strays).to.deep.equal([WEB_PRE]);
    const r = renderFamilyRestore('ipv4', open, 0x4000, referenced);
    expect(r.text).to.include(`-X ${WEB_PRE}\n`);
    expect(r.text).to.not.include(WEB_OUT);
  });

  it('a cleanup removes the source-range chains with the rest', () => {
    const cleanup = renderCleanupRestore(written('ipv4', state))!;
    expect(cleanup).to.include(`:${WEB_OUT} - [0:0]\n`);
    expect(cleanup).to.include(`-X ${WEB_OUT}\n`);
    expect(cleanup).to.include(`-X ${WEB_PRE}\n`);
  });
});

describe('iptables source ranges: partial writes', () => {
  /** The record of a whole write of `entries`. */
  function recordOf(entries: Entry[], localPodMatch: LocalPodMatch = PODS): IptablesAnnex {
    const layout = renderChainRules('ipv4', { entries, localPodMatch }, 0x4000, false);
    return IptablesAnnex.of(layout, { localPodMatch, masqueradeMark: 0x4000, useKubeMarkMasq: false });
  }

  it("an edit of one range rewrites the Service's chains only: O(ranges), not ranges x ports (golden)", () => {
    const before = ported(1000, WIDE);
    const edited = WIDE.map((r) => (r === '200.0.7.0/24' ? '198.18.0.0/15' : r)).sort();
    const after = ported(1000, edited);
    const record = recordOf(before);
    const write = planPartialWrite('ipv4', record, before, after, 4);
    const lines = write.text!.split('\n');
    // Declared (so flushed) and written whole: the chains of the Service, nothing else.
    expect(lines.filter((l) => l.startsWith(':'))).to.deep.equal([`:${WEB_PRE} - [0:0]`, `:${WEB_OUT} - [0:0]`]);
    expect(lines.filter((l) => l.startsWith('-A ')).every((l) => isServiceChain(l.split(' ')[1]!))).to.equal(true);
    expect(write.deletes).to.equal(0);
    expect(write.rewritten).to.equal(0);
    expect(write.serviceChains).to.equal(2);
    expect(lines.length).to.be.below(140);
    expect(write.text).to.include(`-A ${WEB_OUT} -s 198.18.0.0/15 `);
    expect(write.text).to.not.include('200.0.7.0/24');
    // Three ranges, two ports, two addresses, one range edited: what is written, whole.
    const small = (ranges: string[]) => [
      entry({ sourceRanges: ranges }),
      entry({ port: 443, sourceRanges: ranges }),
      entry({ externalIp: '198.51.100.7', sourceRanges: ranges }),
    ];
    const smallEdit = planPartialWrite(
      'ipv4',
      recordOf(small(RANGES)),
      small(RANGES),
      small([...RANGES.slice(0, 2), '203.0.113.128/25']),
      4,
    );
    assertGolden('iptables-partial-range-edit.txt', smallEdit.text!);
    // Recorded: the next edit builds on it, and what is recorded is what a whole write records.
    annexPartialWrite(record, write);
    expect(record.services.get('default/web')!.shared.sourceRanges).to.deep.equal(edited);
    expect(planPartialWrite('ipv4', record, after, after, 4).text).to.equal(undefined);
  });

  it("a port more or less changes its bucket's rules only; an address more rewrites the chains (its own-address rule)", () => {
    const before = [entry({ sourceRanges: RANGES }), entry({ port: 443, sourceRanges: RANGES })];
    const record = recordOf(before);
    const port = planPartialWrite('ipv4', record, [], [entry({ port: 8080, sourceRanges: RANGES })], 4);
    expect(port.text!.split('\n').filter((l) => l.startsWith('-') || l.startsWith(':'))).to.deep.equal([
      `-A IPVS_PREROUTING_10 -s 10.244.1.0/24 -d 192.0.2.10/32 -p tcp -m comment --comment "default/web" -m addrtype --dst-type LOCAL -m tcp --dport 8080 -g ${WEB_PRE}`,
      `-A IPVS_OUTPUT_10 -d 192.0.2.10/32 -p tcp -m comment --comment "default/web" -m addrtype --src-type LOCAL --dst-type LOCAL -m tcp --dport 8080 -g ${WEB_OUT}`,
    ]);
    const gone = planPartialWrite('ipv4', record, [before[1]!], [], 4);
    expect(gone.text).to.not.match(/^(:|-A |-X )IPVS_(PRE|OUT)_SR_/m);
    expect(gone.deletes).to.equal(2);
    // 192.0.2.99 is in 192.0.2.0/24: its own RETURN joins the chain, which is written again.
    const address = planPartialWrite(
      'ipv4',
      record,
      [],
      [entry({ externalIp: '192.0.2.99', sourceRanges: RANGES })],
      4,
    );
    expect(address.text).to.include(`:${WEB_OUT} - [0:0]\n`);
    expect(address.text).to.include(
      `-A ${WEB_OUT} -s 192.0.2.99/32 -d 192.0.2.99/32 -m comment --comment "default/web" -j RETURN\n`,
    );
    expect(address.text).to.include(
      `-A ${WEB_OUT} -s 192.0.2.10/32 -d 192.0.2.10/32 -m comment --comment "default/web" -j RETURN\n`,
    );
  });

  it("a Service's chains go with its last entry with ranges, and come with its first", () => {
    const ranged = [entry({ sourceRanges: RANGES }), entry({ port: 443, sourceRanges: RANGES })];
    const open = ranged.map((e) => entry({ port: e.port }));
    const record = recordOf(ranged);
    // The ranges removed: the entries translate every source, the chains go after the gotos to them.
    const write = planPartialWrite('ipv4', record, ranged, open, 4);
    const lines = write.text!.split('\n');
    expect(lines.filter((l) => l.startsWith('-X '))).to.deep.equal([`-X ${WEB_PRE}`, `-X ${WEB_OUT}`]);
    expect(lines.filter((l) => l.startsWith('-D ')).every((l) => / -g IPVS_(PRE|OUT)_SR_/.test(l))).to.equal(true);
    expect(lines.filter((l) => l.startsWith('-D '))).to.have.length(4);
    annexPartialWrite(record, write);
    expect(record.services.size).to.equal(0);
    // And back: declared before the rules that go to them.
    const back = planPartialWrite('ipv4', record, open, ranged, 4).text!;
    expect(back.indexOf(`:${WEB_OUT} - [0:0]`)).to.be.below(back.indexOf(`-g ${WEB_OUT}`));
    // The last entry of a bucket and of the Service: the bucket chain and the Service's chains go.
    const alone = recordOf([ranged[0]!]);
    const last = planPartialWrite('ipv4', alone, [ranged[0]!], [], 4).text!;
    expect(last.split('\n').filter((l) => l.startsWith('-X '))).to.deep.equal([
      '-X IPVS_PREROUTING_10',
      '-X IPVS_OUTPUT_10',
      `-X ${WEB_PRE}`,
      `-X ${WEB_OUT}`,
    ]);
  });

  it('entries of a Service that do not share its ranges are not written in part: the family is written whole', () => {
    const ranged = [entry({ sourceRanges: RANGES }), entry({ port: 443, sourceRanges: RANGES })];
    const record = recordOf(ranged);
    expect(() =>
      planPartialWrite('ipv4', record, [], [entry({ port: 8080, sourceRanges: RANGES.slice(1) })], 4),
    ).to.throw(WholeWriteNeeded);
    expect(() =>
      planPartialWrite(
        'ipv4',
        record,
        [],
        [entry({ service: 'default/x', externalIp: '192.0.2.1', sourceRanges: ['10.0.0.1/8'] })],
        4,
      ),
    ).to.throw(WholeWriteNeeded, /not a canonical/);
    // Every entry with its new ranges at once is an edit.
    expect(() =>
      planPartialWrite(
        'ipv4',
        record,
        ranged,
        ranged.map((e) => entry({ port: e.port, sourceRanges: ['10.0.0.0/8'] })),
        4,
      ),
    ).to.not.throw();
  });
});

/** A desired state of IPv4 entries (none for IPv6). */
function desired(entries: Entry[]): DesiredState {
  return {
    ipv4: { entries, localPodMatch: PODS, ...(entries.some((e) => e.sourceRanges) ? { sourceRanged: true } : {}) },
    ipv6: { entries: [], localPodMatch: { kind: 'cidrs', cidrs: ['fd01::/64'] } },
    masqueradeMark: 0x4000,
    skips: [],
    conflicts: [],
  };
}

for (const variant of ['legacy', 'nft'] as const) {
  describe(`iptables source ranges, iptables-${variant} against a stand-in nat table`, () => {
    let fake: FakeIptables;
    let backend: Reconciler;
    const driver = () => new IptablesDriver(variant, { runner: fake, jumpCheckIntervalMs: 0 });
    beforeEach(() => {
      fake = new FakeIptables();
      backend = new Reconciler(driver());
    });
    const ours = (f: FakeIptables = fake) =>
      [...f.nat(variant, 'ipv4').chains]
        .filter(([name]) => isOurChain(name))
        .map(([name, c]) => [name, [...c.rules].sort()]);

    it("a range edit is one restore of the Service's chains, and leaves what a whole write leaves", async () => {
      await backend.sync(desired(ported(100, WIDE)), { full: true });
      const before = fake.restores().length;
      const edited = WIDE.map((r) => (r === '200.0.7.0/24' ? '198.18.0.0/15' : r)).sort();
      const result = await backend.sync(desired(ported(100, edited)), { full: false });
      expect(result.mode).to.equal('partial');
      const written = fake.restores().slice(before);
      expect(written).to.have.length(1);
      const lines = written[0]!.input!.split('\n').filter((l) => l.startsWith('-') || l.startsWith(':'));
      expect(lines.every((l) => /^(:|-A )IPVS_(PRE|OUT)_SR_/.test(l))).to.equal(true);
      expect(lines).to.have.length(2 + 1 + 128);
      const fresh = new FakeIptables();
      await new Reconciler(new IptablesDriver(variant, { runner: fresh, jumpCheckIntervalMs: 0 })).sync(
        desired(ported(100, edited)),
        { full: true },
      );
      expect(ours()).to.deep.equal(ours(fresh));
    });

    it("a full resync repairs a Service's chain that someone flushed or changed", async () => {
      const state = desired([entry({ sourceRanges: RANGES }), entry({ port: 443, sourceRanges: RANGES })]);
      await backend.sync(state, { full: true });
      const held = fake.nat(variant, 'ipv4').rules(WEB_OUT)!.slice();
      fake.write(variant, 'ipv4', `*nat\n-F ${WEB_OUT}\nCOMMIT\n`);
      expect((await backend.sync(state, { full: true })).mode).to.equal('full');
      expect(fake.nat(variant, 'ipv4').rules(WEB_OUT)).to.deep.equal(held);
      // Someone adds a range of their own, first.
      fake.write(variant, 'ipv4', `*nat\n-I ${WEB_OUT} 1 -s 0.0.0.0/0 -j DNAT --to-destination 10.96.0.10\nCOMMIT\n`);
      await backend.sync(state, { full: true });
      expect(fake.nat(variant, 'ipv4').rules(WEB_OUT)).to.deep.equal(held);
    });

    it('after a restart, the chains of a Service whose ranges went meanwhile are removed', async () => {
      const ranged = [entry({ sourceRanges: RANGES }), entry({ port: 443, sourceRanges: RANGES })];
      await backend.sync(desired(ranged), { full: true });
      expect(fake.nat(variant, 'ipv4').chains.has(WEB_OUT)).to.equal(true);
      // A new process, and the Service without its ranges.
      backend = new Reconciler(driver());
      const open = desired(ranged.map((e) => entry({ port: e.port })));
      await backend.sync(open, { full: true });
      if (variant === 'nft') {
        // iptables-nft's write reads the entry chains only: the Service's chains, which nothing goes
        // to any longer, are found by the next verification (after another writer's commit).
        fake.write(variant, 'ipv4', '*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n');
        await backend.sync(open, { full: true });
      }
      expect(fake.nat(variant, 'ipv4').chains.has(WEB_OUT)).to.equal(false);
      expect(fake.nat(variant, 'ipv4').chains.has(WEB_PRE)).to.equal(false);
      const fresh = new FakeIptables();
      await new Reconciler(new IptablesDriver(variant, { runner: fresh, jumpCheckIntervalMs: 0 })).sync(open, {
        full: true,
      });
      expect(ours()).to.deep.equal(ours(fresh));
    });

    it('a partial write that cannot be written in part becomes a whole write that leaves the odd entry out', async () => {
      const ranged = [entry({ sourceRanges: RANGES }), entry({ port: 443, sourceRanges: RANGES })];
      await backend.sync(desired(ranged), { full: true });
      const odd = entry({ port: 8080, sourceRanges: RANGES.slice(1) });
      const result = await backend.sync(desired([...ranged, odd]), { full: false });
      expect(result.fallbackReason).to.equal('partial-failed');
      // A whole write without the annex of the last write reads the whole table and compares it
      // before it writes (iptables-legacy always does): it holds that already.
      expect(result.mode).to.equal('noop');
      expect(result.rejected?.map((r) => r.item)).to.deep.equal(['default/web 192.0.2.10 tcp/8080']);
      expect(fake.nat(variant, 'ipv4').rules('IPVS_OUTPUT_10')).to.have.length(2);
    });
  });
}
