// The iptables renderer: golden restore inputs, the original controller's listing shape, the
// comparison of a table with what our chains must hold, jump repairs, cleanup input and
// render-time validation. Pure: no iptables is run here.
// UPDATE_GOLDEN=1 rewrites the golden files from the current renderer (review the diff).

import { expect } from 'chai';
import {
  KUBE_MARK_MASQ,
  emptyNatTable,
  hasOurObjects,
  isOurRule,
  parseNatSave,
  type NatTableView,
} from '../../src/backends/iptables/parse.js';
import {
  chainsHold,
  renderChainRules,
  renderDesiredStateRestoreText,
  compareState,
  renderFamilyRestore,
} from '../../src/backends/iptables/render.js';
import { formatMark, interfaceNameProblem } from '../../src/backends/iptables/rules.js';
import { IptablesAnnex } from '../../src/backends/iptables/annex.js';
import { planPartialWrite } from '../../src/backends/iptables/partial-write.js';
import { renderJumpRepairs } from '../../src/backends/iptables/precedence.js';
import { renderCleanupRestore } from '../../src/backends/iptables/nat-view.js';
import { parseBucketChain } from '../../src/backends/iptables/layout.js';
import { countForeignRules, countHintChains } from '../../src/backends/iptables/variant.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import { assertGolden } from '../support/golden.js';
import {
  SEED,
  SEED_CONFIG,
  contractedSeedRows,
  seedDesired,
  seedServices,
  type ListingRow,
} from '../support/seed-listing.js';
import type { Entry, FamilyState } from '../../src/model/types.js';
import { webEntry } from '../support/fixtures.js';

const CONFIG = SEED_CONFIG;

/** Whether `current` holds the chains `state` makes (strays aside). */
async function stateHeld(
  current: NatTableView,
  family: 'ipv4' | 'ipv6',
  state: FamilyState,
  mark: number,
  pause: () => Promise<void>,
): Promise<boolean> {
  return (await compareState(current, family, state, mark, pause)).held;
}
const SEED_POD_CIDR = SEED.podCidr;

function withKubeMarkMasq(): NatTableView {
  const view = emptyNatTable();
  view.chains.add(KUBE_MARK_MASQ);
  return view;
}

/**
 * A rendered rule as `iptables -nvL` shows it, with protocol and port left out: the columns
 * target, source, destination, then the comment, ADDRTYPE and `to:` extras.
 */
function asListingRow(rule: string): { chain: string; row: ListingRow } {
  const arg = (flag: string) => new RegExp(`(?:^| )${flag} (\\S+)`).exec(rule)?.[1];
  const comment = /--comment "([^"]*)"/.exec(rule)![1]!;
  const types = /-m addrtype((?: --(?:src|dst)-type \S+)+)/.exec(rule)?.[1];
  const addrtype = types ? ` ADDRTYPE match${types.replace(/ --(src|dst)-type /g, ' $1-type ')}` : '';
  const to = arg('--to-destination');
  return {
    chain: arg('-A')!,
    row: [
      arg('-j')!,
      arg('-s') ?? '0.0.0.0/0',
      arg('-d')!.replace(/\/32$/, ''),
      `/* ${comment} */${addrtype}${to ? ` to:${to}` : ''}`,
    ],
  };
}

function entry(partial: Partial<Entry>): Entry {
  return webEntry({ service: 'default/svc-a', ...partial });
}

describe('iptables renderer', () => {
  describe('golden restore inputs', () => {
    it("renders the original listing's Services with KUBE-MARK-MASQ (seed shape)", () => {
      const desired = seedDesired();
      const r = renderFamilyRestore('ipv4', desired.ipv4, desired.masqueradeMark, withKubeMarkMasq());
      expect(r.rejected).to.deep.equal([]);
      expect(r.programmed).to.equal(4);
      assertGolden('iptables-seed-shape.txt', r.text);
    });

    it('renders shared IPs, UDP and SCTP, two pod CIDRs, and MARK when KUBE-MARK-MASQ is absent', () => {
      const state: FamilyState = {
        entries: [
          entry({ port: 80, service: 'default/web' }),
          entry({ port: 443, service: 'default/web' }),
          entry({ port: 53, protocol: 'UDP', clusterIp: '10.96.0.53', service: 'kube-system/dns' }),
          entry({ port: 3868, protocol: 'SCTP', clusterIp: '10.96.0.99', service: 'telecom/diameter' }),
        ],
        localPodMatch: { kind: 'cidrs', cidrs: ['10.244.0.0/16', '10.245.0.0/16'] },
      };
      const r = renderFamilyRestore('ipv4', state, 1 << 14, emptyNatTable());
      expect(r.rejected).to.deep.equal([]);
      assertGolden('iptables-shared-ip-mark.txt', r.text);
    });

    it('renders IPv6 with an interface name prefix', () => {
      const state: FamilyState = {
        entries: [
          entry({ family: 'ipv6', externalIp: '2001:db8::10', clusterIp: 'fd00::10', service: 'default/svc-a6' }),
        ],
        localPodMatch: { kind: 'interfacePrefix', prefix: 'veth' },
      };
      const r = renderFamilyRestore('ipv6', state, 0x4000, emptyNatTable());
      assertGolden('iptables-ipv6-interface-prefix.txt', r.text);
    });

    it('renders the bridge interface mode', () => {
      const state: FamilyState = { entries: [entry({})], localPodMatch: { kind: 'interface', name: 'cni0' } };
      assertGolden('iptables-bridge-interface.txt', renderFamilyRestore('ipv4', state, 0x4000, emptyNatTable()).text);
    });

    it('renders no prerouting rules, and keeps the chain, when local pods cannot be recognised', () => {
      const state: FamilyState = {
        entries: [entry({})],
        localPodMatch: { kind: 'none', reason: 'node has no podCIDRs' },
      };
      const r = renderFamilyRestore('ipv4', state, 0x4000, emptyNatTable());
      expect(r.text).to.not.include('-A IPVS_PREROUTING');
      expect(r.text).to.include(':IPVS_PREROUTING - [0:0]');
      expect(r.text).to.include('-I PREROUTING 1 -j IPVS_PREROUTING');
      assertGolden('iptables-no-local-pod-match.txt', r.text);
    });

    it('renders both families for --dry-run', () => {
      const desired = buildDesiredState(
        [
          ...seedServices(),
          {
            namespace: 'default',
            name: 'dual',
            type: 'LoadBalancer',
            clusterIPs: ['10.96.0.20', 'fd00::20'],
            ports: [{ port: 80, protocol: 'TCP' }],
            ingress: [{ ip: '192.0.2.20' }, { ip: '2001:db8::20' }],
          },
        ],
        { name: 'node-1', podCIDRs: [SEED_POD_CIDR] },
        CONFIG,
      );
      assertGolden('iptables-dry-run.txt', renderDesiredStateRestoreText(desired));
    });
  });

  describe('the original listing shape', () => {
    it('reads like the original, but for what the contract changes: commented namespace/name, KUBE-MARK-MASQ then DNAT for the node', () => {
      const desired = seedDesired();
      const { rules } = renderChainRules('ipv4', desired.ipv4, desired.masqueradeMark, true);
      const expected = {
        IPVS_OUTPUT: contractedSeedRows('IPVS_OUTPUT'),
        IPVS_PREROUTING: contractedSeedRows('IPVS_PREROUTING'),
      };
      expect(expected.IPVS_PREROUTING.length).to.be.above(0);
      for (const chain of ['IPVS_OUTPUT', 'IPVS_PREROUTING'] as const) {
        const listed = rules.map(asListingRow).filter((v) => parseBucketChain(v.chain)?.entry === chain);
        // Each address in the bucket chain of its last byte; each port adds its rules. Seen without
        // protocol and port, a bucket's rules collapse to the rows of its address.
        const buckets = [...new Set(listed.map((v) => v.chain))];
        expect(buckets).to.deep.equal([`${chain}_57`, `${chain}_201`]);
        for (const bucket of buckets) {
          const rows = listed
            .filter((v) => v.chain === bucket)
            .map((v) => v.row)
            .filter((row, i, all) => all.findIndex((r) => r.join() === row.join()) === i);
          const address = `10.19.${bucket.endsWith('_57') ? '22.57' : '20.201'}`;
          expect(rows).to.deep.equal(expected[chain].filter((row) => row[2] === address));
        }
      }
    });

    it('matches protocol and port on every rule, so that other ports of the IP are left alone', () => {
      const desired = seedDesired();
      const { rules } = renderChainRules('ipv4', desired.ipv4, desired.masqueradeMark, true);
      // Two addresses x two ports: a DNAT rule for pods, a mark and a DNAT rule for the node.
      expect(rules).to.have.lengthOf(12);
      for (const rule of rules) expect(rule).to.match(/ -p tcp .* -m tcp --dport (80|443) /);
    });

    it('sends each Service sharing an IP to its own ClusterIP', () => {
      const state: FamilyState = {
        entries: [entry({ port: 80 }), entry({ port: 8080, clusterIp: '10.96.0.11', service: 'default/svc-b' })],
        localPodMatch: { kind: 'none', reason: 'x' },
      };
      const { rules } = renderChainRules('ipv4', state, 0x4000, false);
      const dnat = rules.filter((r) => r.includes('-j DNAT'));
      expect(dnat.map((r) => [/--dport (\d+)/.exec(r)![1], /--to-destination (\S+)/.exec(r)![1]])).to.deep.equal([
        ['80', '10.96.0.10'],
        ['8080', '10.96.0.11'],
      ]);
    });
  });

  describe('comparing a nat table with what our chains must hold', () => {
    const state: FamilyState = {
      entries: Array.from({ length: 300 }, (_, i) =>
        entry({ externalIp: `192.0.${2 + (i >> 8)}.${i & 255}`, service: `default/svc-${i}` }),
      ),
      localPodMatch: { kind: 'cidrs', cidrs: ['10.244.1.0/24'] },
    };
    /** The nat table after a whole write of `state` (its jumps inserted), KUBE-MARK-MASQ present. */
    const written = () =>
      parseNatSave(
        renderFamilyRestore('ipv4', state, 0x4000, withKubeMarkMasq())
          .text.replace('*nat\n', '*nat\n:KUBE-MARK-MASQ - [0:0]\n')
          .replace(/^-I (PREROUTING|OUTPUT) 1 /gm, '-A $1 '),
      );

    it('finds a table written whole, or changed in order only, to hold it; a missing rule or goto not', async () => {
      let pauses = 0;
      const pause = () => {
        pauses++;
        return Promise.resolve();
      };
      const view = written();
      const layout = renderChainRules('ipv4', state, 0x4000, true);
      expect(chainsHold(view, layout)).to.equal(true);
      expect(await stateHeld(view, 'ipv4', state, 0x4000, pause)).to.equal(true);
      // 2 entry chains and 2 x 256 buckets, the event loop given back every 32 chains.
      expect(layout.chains.size).to.equal(514);
      expect(pauses).to.equal(16);
      // Appended rules come last in their bucket: the same translations.
      const bucket = view.rules.get('IPVS_OUTPUT_7')!;
      view.rules.set('IPVS_OUTPUT_7', [...bucket.slice(2), ...bucket.slice(0, 2)]);
      expect(await stateHeld(view, 'ipv4', state, 0x4000, pause)).to.equal(true);
      // So are the pods' DNAT rules, which have no mark rule, in another order.
      const pods = view.rules.get('IPVS_PREROUTING_7')!;
      expect(pods.length).to.be.above(1);
      expect(pods.some((r) => r.includes('MARK'))).to.equal(false);
      view.rules.set('IPVS_PREROUTING_7', [...pods].reverse());
      expect(await stateHeld(view, 'ipv4', state, 0x4000, pause)).to.equal(true);
      // A DNAT rule before its mark rule is not.
      view.rules.set('IPVS_OUTPUT_7', [bucket[1]!, bucket[0]!, ...bucket.slice(2)]);
      expect(await stateHeld(view, 'ipv4', state, 0x4000, pause)).to.equal(false);
      const noRule = written();
      noRule.rules.get('IPVS_PREROUTING_9')!.pop();
      expect(await stateHeld(noRule, 'ipv4', state, 0x4000, pause)).to.equal(false);
      expect(chainsHold(noRule, layout)).to.equal(false);
      const noGoto = written();
      noGoto.rules.get('IPVS_OUTPUT')!.splice(3, 1);
      expect(await stateHeld(noGoto, 'ipv4', state, 0x4000, pause)).to.equal(false);
      // A bucket chain no goto reaches is walked by no packet: the chains hold, and it is a stray
      // for a whole write to remove.
      const stray = written();
      stray.chains.add('IPVS_OUTPUT_c9');
      stray.rules.set('IPVS_OUTPUT_c9', ['-j ACCEPT']);
      expect(await compareState(stray, 'ipv4', state, 0x4000, pause)).to.deep.equal({
        held: true,
        strays: ['IPVS_OUTPUT_c9'],
      });
      // Without KUBE-MARK-MASQ the mark rules differ.
      const withoutChain = written();
      withoutChain.chains.delete(KUBE_MARK_MASQ);
      expect(await stateHeld(withoutChain, 'ipv4', state, 0x4000, pause)).to.equal(false);
    });

    it('a whole write removes the bucket chains of ours the state no longer needs, and nothing is up to date then', () => {
      const view = written();
      const fewer: FamilyState = { ...state, entries: state.entries.slice(0, 200) };
      const r = renderFamilyRestore('ipv4', fewer, 0x4000, view);
      expect(r.upToDate).to.equal(false);
      // Entries 200..255 had the buckets 200..255 to themselves.
      const removed = r.text.split('\n').filter((l) => l.startsWith('-X '));
      expect(removed).to.have.length(2 * 56);
      expect(removed).to.include('-X IPVS_OUTPUT_255');
      expect(r.text).to.match(/^:IPVS_OUTPUT_255 - \[0:0\]$/m);
      expect(r.text.indexOf(':IPVS_OUTPUT_255 - [0:0]')).to.be.lessThan(r.text.indexOf('-X IPVS_OUTPUT_255'));
      // The whole state: the table holds it, nothing to write.
      expect(renderFamilyRestore('ipv4', state, 0x4000, view).upToDate).to.equal(true);
      const stray = written();
      stray.chains.add('IPVS_OUTPUT_c9');
      expect(renderFamilyRestore('ipv4', state, 0x4000, stray).upToDate, 'a stray bucket chain to remove').to.equal(
        false,
      );
    });
  });

  describe('without comments (--iptables-comments=false)', () => {
    const desired = seedDesired();
    const strip = (rule: string) => rule.replace(/ -m comment --comment "[^"]*"/, '');

    it('renders the same rules, each without its comment match', () => {
      const commented = renderChainRules('ipv4', desired.ipv4, desired.masqueradeMark, true);
      const bare = renderChainRules('ipv4', desired.ipv4, desired.masqueradeMark, true, false);
      expect(commented.rules.every((r) => r.includes(' -m comment --comment "'))).to.equal(true);
      expect(bare.rules.some((r) => r.includes('comment'))).to.equal(false);
      expect(bare.rules).to.deep.equal(commented.rules.map(strip));
      expect([...bare.chains.keys()]).to.deep.equal([...commented.chains.keys()]);
    });

    it('a table written with comments is not what the rules without them must be, nor the other way: the flag changed, the chains are written whole again', async () => {
      const state = desired.ipv4;
      const table = (comments: boolean) =>
        parseNatSave(
          renderFamilyRestore('ipv4', state, desired.masqueradeMark, withKubeMarkMasq(), comments)
            .text.replace('*nat\n', '*nat\n:KUBE-MARK-MASQ - [0:0]\n')
            .replace(/^-I (PREROUTING|OUTPUT) 1 /gm, '-A $1 '),
        );
      const pause = () => Promise.resolve();
      const compare = (view: NatTableView, comments: boolean) =>
        compareState(view, 'ipv4', state, desired.masqueradeMark, pause, comments);
      expect(await compare(table(false), false)).to.deep.equal({ held: true, strays: [] });
      expect((await compare(table(true), false)).held).to.equal(false);
      expect((await compare(table(false), true)).held).to.equal(false);
      expect(renderFamilyRestore('ipv4', state, desired.masqueradeMark, table(false), false).upToDate).to.equal(true);
      expect(renderFamilyRestore('ipv4', state, desired.masqueradeMark, table(true), false).upToDate).to.equal(false);
    });

    it('a partial write renders its rules as the whole write it follows did', () => {
      const state = desired.ipv4;
      for (const comments of [true, false]) {
        const whole = renderFamilyRestore('ipv4', state, desired.masqueradeMark, withKubeMarkMasq(), comments);
        const shape = { localPodMatch: state.localPodMatch, masqueradeMark: desired.masqueradeMark };
        const annex = IptablesAnnex.of(whole, { ...shape, useKubeMarkMasq: true, comments });
        const moved = { ...state.entries[0]!, externalIp: '10.19.20.202' };
        const plan = planPartialWrite('ipv4', annex, [state.entries[0]!], [moved], Number.POSITIVE_INFINITY);
        // The gotos into a bucket carry no comment either way.
        const lines = plan.text!.split('\n').filter((l) => /^-[AD] IPVS_/.test(l) && !l.includes(' -g '));
        const added = lines.filter((l) => l.startsWith('-A '));
        expect(lines.length - added.length, `comments: ${comments}`).to.be.above(0);
        expect(
          lines.every((l) => l.includes(' -m comment --comment "')),
          `comments: ${comments}`,
        ).to.equal(comments);
        expect(added.length, `comments: ${comments}`).to.be.above(0);
        // Exactly the rules a whole write of the new state would hold.
        const next = { ...state, entries: [moved, ...state.entries.slice(1)] };
        const rules = renderChainRules('ipv4', next, desired.masqueradeMark, true, comments).rules;
        for (const line of added) expect(rules).to.include(line);
      }
    });

    it('leaves them out of source-range chains and of --dry-run too', () => {
      const state: FamilyState = {
        entries: [entry({ sourceRanges: ['10.0.0.0/8'], sourcesFromNode: true })],
        localPodMatch: { kind: 'cidrs', cidrs: ['10.244.1.0/24'] },
      };
      const ranged = renderChainRules('ipv4', state, 0x4000, false, false);
      expect(ranged.rules.some((r) => r.includes(' -s 10.0.0.0/8 '))).to.equal(true);
      expect(ranged.rules.some((r) => r.includes('comment'))).to.equal(false);
      expect(renderDesiredStateRestoreText(desired, { comments: false })).not.to.include('--comment');
      expect(renderDesiredStateRestoreText(desired)).to.include('--comment "');
    });
  });

  describe('mark', () => {
    it('uses KUBE-MARK-MASQ when it exists, else sets the masquerade bit itself', () => {
      const state: FamilyState = { entries: [entry({})], localPodMatch: { kind: 'none', reason: 'x' } };
      const withChain = renderChainRules('ipv4', state, 0x4000, true).rules;
      const without = renderChainRules('ipv4', state, 0x4000, false).rules;
      expect(withChain[0]!).to.match(/ -j KUBE-MARK-MASQ$/);
      expect(without[0]!).to.match(/ -j MARK --or-mark 0x4000$/);
    });

    it('formats every single-bit mark, including bit 31', () => {
      expect(formatMark(1 << 14)).to.equal('0x4000');
      expect(formatMark(1 << 0)).to.equal('0x1');
      expect(formatMark(1 << 31)).to.equal('0x80000000');
      expect(() => formatMark(0)).to.throw(RangeError);
      expect(() => formatMark(3)).to.throw(RangeError);
      expect(() => formatMark(0.5)).to.throw(RangeError);
    });
  });

  describe('jump rules', () => {
    const view = (save: string) =>
      parseNatSave(`*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n${save}COMMIT\n`);

    it('inserts both jumps at position 1 when they are missing', () => {
      expect(renderJumpRepairs(view(''))).to.deep.equal([
        '-I PREROUTING 1 -j IPVS_PREROUTING',
        '-I OUTPUT 1 -j IPVS_OUTPUT',
      ]);
    });

    it('does nothing when rule 1 is the only jump', () => {
      const v = view(
        '-A PREROUTING -j IPVS_PREROUTING\n' +
          '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES\n' +
          '-A OUTPUT -j IPVS_OUTPUT\n',
      );
      expect(renderJumpRepairs(v)).to.deep.equal([]);
    });

    it('moves a jump that is not first, and removes duplicates, by their exact specs', () => {
      const v = view(
        '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES\n' +
          '-A PREROUTING -j IPVS_PREROUTING\n' +
          '-A PREROUTING -i eth0 -j IPVS_PREROUTING\n' +
          '-A OUTPUT -j IPVS_OUTPUT\n-A OUTPUT -j IPVS_OUTPUT\n',
      );
      expect(renderJumpRepairs(v)).to.deep.equal([
        '-D PREROUTING -j IPVS_PREROUTING',
        '-D PREROUTING -i eth0 -j IPVS_PREROUTING',
        '-I PREROUTING 1 -j IPVS_PREROUTING',
        '-D OUTPUT -j IPVS_OUTPUT',
        '-D OUTPUT -j IPVS_OUTPUT',
        '-I OUTPUT 1 -j IPVS_OUTPUT',
      ]);
    });

    it('writes the repairs into the same transaction as the chains', () => {
      const v = view('-A PREROUTING -j KUBE-SERVICES\n-A PREROUTING -j IPVS_PREROUTING\n-A OUTPUT -j IPVS_OUTPUT\n');
      const state: FamilyState = { entries: [entry({})], localPodMatch: { kind: 'cidrs', cidrs: ['10.244.1.0/24'] } };
      assertGolden('iptables-jump-repair.txt', renderFamilyRestore('ipv4', state, 0x4000, v).text);
    });
  });

  describe('nat table listings', () => {
    const SAVE = [
      '# Generated by iptables-save v1.8.9',
      '*mangle',
      ':PREROUTING ACCEPT [0:0]',
      ':KUBE-IPTABLES-HINT - [0:0]',
      '-A PREROUTING -j MARK --set-xmark 0x1/0x1',
      'COMMIT',
      '*nat',
      ':PREROUTING ACCEPT [3:180]',
      ':OUTPUT ACCEPT [0:0]',
      ':IPVS_OUTPUT - [0:0]',
      ':IPVS_PREROUTING - [0:0]',
      ':IPVS_OUTPUT_10 - [0:0]',
      ':KUBE-MARK-MASQ - [0:0]',
      '-A PREROUTING -j IPVS_PREROUTING',
      '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
      '-A OUTPUT -j IPVS_OUTPUT',
      // A rule of the flat layout of earlier versions, beside a bucket chain of the current one.
      '-A IPVS_OUTPUT -d 192.0.2.10/32 -p tcp -m comment --comment "default/svc-a" -m tcp --dport 80 -j KUBE-MARK-MASQ',
      '-A IPVS_OUTPUT -d 0.0.0.10/0.0.0.255 -g IPVS_OUTPUT_10',
      '-A IPVS_OUTPUT_10 -d 192.0.2.10/32 -p tcp -m comment --comment "default/svc-a" -m tcp --dport 80 -j KUBE-MARK-MASQ',
      '-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000',
      'COMMIT',
      '',
    ].join('\n');

    it('parses the nat section only', () => {
      const v = parseNatSave(SAVE);
      expect([...v.chains]).to.deep.equal([
        'PREROUTING',
        'OUTPUT',
        'IPVS_OUTPUT',
        'IPVS_PREROUTING',
        'IPVS_OUTPUT_10',
        'KUBE-MARK-MASQ',
      ]);
      expect(v.rules.get('PREROUTING')!).to.have.lengthOf(2);
      expect(v.rules.get('IPVS_PREROUTING')).to.deep.equal([]);
      expect(hasOurObjects(v)).to.equal(true);
      const others = parseNatSave('*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n');
      expect(hasOurObjects(others)).to.equal(false);
    });

    it('tells our rules from others, and counts the others and the kubelet hint chains', () => {
      expect(isOurRule('-A IPVS_OUTPUT -d 192.0.2.10/32 -j KUBE-MARK-MASQ')).to.equal(true);
      expect(isOurRule('-A PREROUTING -j IPVS_PREROUTING')).to.equal(true);
      expect(isOurRule('-A IPVS_OUTPUT -d 0.0.0.10/0.0.0.255 -g IPVS_OUTPUT_10')).to.equal(true);
      expect(isOurRule('-A IPVS_OUTPUT_10 -d 192.0.2.10/32 -j KUBE-MARK-MASQ')).to.equal(true);
      expect(isOurRule('-A IPVS_PREROUTING_c9 -d 2001:db8::c9/128 -j KUBE-MARK-MASQ')).to.equal(true);
      expect(isOurRule('-A PREROUTING -j IPVS_PREROUTING_OTHER')).to.equal(false);
      expect(isOurRule('-A IPVS_OUTPUT_OTHER -j ACCEPT')).to.equal(false);
      expect(isOurRule('-A OTHER -m comment --comment "-j IPVS_OUTPUT" -j ACCEPT')).to.equal(false);
      expect(isOurRule('-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000')).to.equal(false);
      expect(countForeignRules(SAVE)).to.equal(3);
      expect(countHintChains(SAVE)).to.equal(1);
    });

    it('renders a cleanup that removes jumps, then flushes and deletes our chains, buckets included', () => {
      const cleanup = renderCleanupRestore(parseNatSave(SAVE))!;
      expect(cleanup).to.include(':IPVS_OUTPUT_10 - [0:0]');
      expect(cleanup.indexOf('-X IPVS_OUTPUT_10')).to.be.greaterThan(cleanup.indexOf(':IPVS_OUTPUT - [0:0]'));
      assertGolden('iptables-cleanup.txt', cleanup);
      const others = parseNatSave('*nat\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT -j KUBE-SERVICES\nCOMMIT\n');
      expect(renderCleanupRestore(others)).to.equal(undefined);
    });
  });

  describe('render-time validation', () => {
    const cidrs: FamilyState['localPodMatch'] = { kind: 'cidrs', cidrs: ['10.244.1.0/24'] };

    it('leaves out each bad entry, reports it, and programs the rest', () => {
      const bad: Array<[Partial<Entry>, RegExp]> = [
        [{ externalIp: '192.0.2.300' }, /not an IP address/],
        [{ externalIp: '2001:db8::1' }, /not ipv4/],
        [{ clusterIp: '10.96.0.010' }, /not an IP address/],
        [{ clusterIp: '' }, /not an IP address/],
        [{ port: 0 }, /not in 1\.\.65535/],
        [{ port: 65536 }, /not in 1\.\.65535/],
        [{ port: 80.5 }, /not in 1\.\.65535/],
        [{ protocol: 'ICMP' as Entry['protocol'] }, /not TCP, UDP or SCTP/],
        [{ service: 'Default/svc' }, /characters other than/],
        [{ service: 'default/svc" -j ACCEPT\n-A INPUT -j DROP' }, /characters other than/],
        [{ service: `default/${'a'.repeat(300)}` }, /longer than 255/],
        [{ family: 'ipv6' }, /entry of ipv6/],
      ];
      const good = entry({ port: 443, service: 'default/good' });
      const state: FamilyState = { entries: [...bad.map(([p]) => entry(p)), good], localPodMatch: cidrs };
      const r = renderFamilyRestore('ipv4', state, 0x4000, emptyNatTable());
      expect(r.programmed).to.equal(1);
      expect(r.rejected).to.have.lengthOf(bad.length);
      bad.forEach(([, reason], i) => expect(r.rejected[i]!.reason).to.match(reason));
      expect(r.text, 'nothing of a bad value reaches the restore input').to.not.include('INPUT');
      // The good entry's DNAT for pods, and its mark and DNAT for the node.
      expect(r.rules).to.have.lengthOf(3);
      // One bucket (192.0.2.10: 10) in each hook.
      expect(r.gotos).to.deep.equal([
        '-A IPVS_PREROUTING -d 0.0.0.10/0.0.0.255 -g IPVS_PREROUTING_10',
        '-A IPVS_OUTPUT -d 0.0.0.10/0.0.0.255 -g IPVS_OUTPUT_10',
      ]);
      expect(r.text.split('\n').filter((l) => l.startsWith('-A '))).to.have.lengthOf(5);
      expect(r.text).to.include('--comment "default/good"');
    });

    it('writes addresses and CIDRs canonically and refuses CIDRs of the other family', () => {
      const state: FamilyState = {
        entries: [entry({})],
        localPodMatch: { kind: 'cidrs', cidrs: ['10.244.1.7/24', 'fd01::/64', 'nonsense'] },
      };
      const r = renderChainRules('ipv4', state, 0x4000, false);
      expect(r.rules.some((l) => l.startsWith('-A IPVS_PREROUTING_10 -s 10.244.1.0/24 '))).to.equal(true);
      expect(r.rejected.map((x) => x.item)).to.deep.equal(['local pod CIDR "fd01::/64"', 'local pod CIDR "nonsense"']);
      const v6 = renderChainRules(
        'ipv6',
        {
          entries: [entry({ family: 'ipv6', externalIp: '2001:DB8::10', clusterIp: 'fd00::10' })],
          localPodMatch: cidrs,
        },
        0x4000,
        false,
      );
      expect(v6.programmed).to.equal(0);
      expect(v6.rejected[0]!.reason).to.match(/canonical form/);
    });

    it('checks interface names by Linux rules and what iptables-restore reads literally', () => {
      expect(interfaceNameProblem('cni0', false)).to.equal(undefined);
      expect(interfaceNameProblem('flannel.1', false)).to.equal(undefined);
      expect(interfaceNameProblem('a'.repeat(15), false)).to.equal(undefined);
      expect(interfaceNameProblem('veth', true)).to.equal(undefined);
      expect(interfaceNameProblem('a'.repeat(16), false)!).to.match(/1 to 15/);
      expect(interfaceNameProblem('a'.repeat(15), true)!).to.match(/1 to 14/);
      expect(interfaceNameProblem('', true)!).to.match(/1 to 14/);
      expect(interfaceNameProblem('..', false)!).to.match(/not allowed/);
      for (const name of ['eth 0', 'eth/0', 'eth:0', 'eth\n0', 'caf\u00e9']) {
        expect(interfaceNameProblem(name, false)!).to.match(/Linux does not allow/);
      }
      for (const name of ['eth"0', 'veth+', '!eth0', '-eth0', "it's"]) {
        expect(interfaceNameProblem(name, false)!).to.match(/would not read literally/);
      }
    });

    it('leaves prerouting out, and reports it, when the interface is not a valid name', () => {
      const state: FamilyState = { entries: [entry({})], localPodMatch: { kind: 'interface', name: 'cni0 -j DROP' } };
      const r = renderFamilyRestore('ipv4', state, 0x4000, emptyNatTable());
      expect(r.text).to.not.include('-A IPVS_PREROUTING');
      expect(r.text).to.not.include('DROP');
      expect(r.rejected[0]!.item).to.equal('pod bridge interface');
      expect(r.programmed, 'output rules are still programmed').to.equal(1);
    });
  });
});
