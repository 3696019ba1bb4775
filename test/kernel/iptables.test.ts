// The iptables backend against the real kernel, for both variants: each bucket chain lists like
// the original controller's chain, KUBE-MARK-MASQ is used when present, rule 1 is kept, a
// kube-proxy stand-in writing the same nat table concurrently loses nothing and neither do we,
// cleanup is idempotent and safe without the tools. Runs as root inside `unshare --net --mount`.

import { Reconciler } from '../../src/reconciler/reconciler.js';
import { expect } from 'chai';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import { hasIptablesObjects } from '../../src/backends/iptables/nat-view.js';
import { parseNatSave } from '../../src/backends/iptables/parse.js';
import { renderChainRules } from '../../src/backends/iptables/render.js';
import { asSaved } from '../../src/backends/iptables/rules.js';
import { detectIptablesVariant, type IptablesVariant } from '../../src/backends/iptables/variant.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import type { Family } from '../../src/model/types.js';
import { assertGolden } from '../support/golden.js';
import { assertIsolatedNetns, sh } from '../../testbed/node-network.js';
import { CONFIG, NODE_INFO, SERVICES } from './scenario.js';
import { contractedSeedRows, seedDesired, type ListingRow } from '../support/seed-listing.js';
import { rejectionOf } from '../support/assertions.js';

const VARIANTS: readonly IptablesVariant[] = ['legacy', 'nft'];

const iptables = (variant: IptablesVariant, family: Family = 'ipv4') =>
  `${family === 'ipv4' ? 'iptables' : 'ip6tables'}-${variant}`;

function natSave(variant: IptablesVariant, family: Family = 'ipv4'): string {
  return sh(`${iptables(variant, family)}-save`, ['-t', 'nat']);
}

function restore(variant: IptablesVariant, input: string): void {
  sh(`${iptables(variant)}-restore`, ['--noflush', '-w'], input);
}

/** `iptables -nvL` without the nft variant's "legacy tables present" warnings. */
function listing(variant: IptablesVariant, chain: string): string {
  return sh(iptables(variant), ['-w', '-t', 'nat', '-nvL', chain])
    .split('\n')
    .filter((l) => !l.startsWith('#'))
    .join('\n');
}

/** Rows of a listing: target, source, destination, extras without the `tcp dpt:N` we add. */
function listingRows(text: string): ListingRow[] {
  return text
    .split('\n')
    .slice(2)
    .filter((l) => l.trim().length > 0)
    .map((l) => {
      const cols = l.trim().split(/\s+/);
      const extras = cols
        .slice(9)
        .join(' ')
        .replace(/ (tcp|udp|sctp) dpt:\d+/, '');
      return [cols[2]!, cols[7]!, cols[8]!, extras];
    });
}

function ruleLines(save: string, chain: string): string[] {
  return save.split('\n').filter((l) => l.startsWith(`-A ${chain} `) || l === `-A ${chain}`);
}

/** The bucket chains of an entry chain, in the order of its gotos. */
function bucketsOf(save: string, entry: string): string[] {
  return ruleLines(save, entry).map((l) => / -g (\S+)$/.exec(l)![1]!);
}

/** The rules of an entry chain's buckets, bucket after bucket. */
function bucketRuleLines(save: string, entry: string): string[] {
  return bucketsOf(save, entry).flatMap((chain) => ruleLines(save, chain));
}

/** Every rule of our chains (gotos and translations), sorted: -save lists chains in its own order. */
function ourRuleLines(save: string): string[] {
  return save
    .split('\n')
    .filter((l) => /^-A IPVS_(PREROUTING|OUTPUT)(_\w+)? /.test(l))
    .sort();
}

/** The rendered gotos and rules of a state, as -save prints them, sorted. */
function renderedLines(rendered: { gotos: string[]; rules: string[] }): string[] {
  return [...rendered.gotos, ...rendered.rules].map(asSaved).sort();
}

function createKubeMarkMasq(variant: IptablesVariant): void {
  restore(variant, '*nat\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\nCOMMIT\n');
}

function deleteKubeChains(variant: IptablesVariant): void {
  const view = parseNatSave(natSave(variant));
  const lines = ['*nat'];
  for (const [chain, specs] of view.rules) {
    if (chain.startsWith('KUBE-')) continue;
    for (const spec of specs) if (/-j KUBE-/.test(spec)) lines.push(`-D ${chain} ${spec}`);
  }
  const kube = [...view.chains].filter((c) => c.startsWith('KUBE-'));
  for (const c of kube) lines.push(`:${c} - [0:0]`);
  for (const c of kube) lines.push(`-X ${c}`);
  if (lines.length > 1) restore(variant, `${lines.join('\n')}\nCOMMIT\n`);
}

for (const variant of VARIANTS) {
  describe(`iptables backend on the kernel (iptables-${variant})`, function () {
    this.timeout(60_000);
    let backend: Reconciler;

    before(() => {
      assertIsolatedNetns();
      backend = new Reconciler(new IptablesDriver(variant));
    });
    afterEach(async () => {
      await backend.cleanup();
      deleteKubeChains(variant);
    });

    it('programs what it renders, rule for rule, in both families', async () => {
      const desired = buildDesiredState(SERVICES, NODE_INFO, CONFIG);
      const result = await backend.sync(desired, { full: true });
      expect(result.entries).to.deep.equal({ ipv4: desired.ipv4.entries.length, ipv6: desired.ipv6.entries.length });
      for (const family of ['ipv4', 'ipv6'] as const) {
        const save = natSave(variant, family);
        const rendered = renderChainRules(family, desired[family], desired.masqueradeMark, false);
        expect(ourRuleLines(save)).to.deep.equal(renderedLines(rendered));
        // Each bucket holds its rules in the rendered order.
        for (const chain of bucketsOf(save, 'IPVS_OUTPUT')) {
          expect(ruleLines(save, chain)).to.deep.equal(
            rendered.rules.filter((r) => r.startsWith(`-A ${chain} `)).map(asSaved),
          );
        }
        const view = parseNatSave(save);
        expect(view.rules.get('PREROUTING')![0]).to.equal('-j IPVS_PREROUTING');
        expect(view.rules.get('OUTPUT')![0]).to.equal('-j IPVS_OUTPUT');
      }
      // A full resync of an unchanged table: iptables-legacy sees it holds our rules already.
      const again = await backend.sync(desired, { full: true });
      expect(again.mode).to.equal('full');
      expect(again.repairedElements).to.equal(undefined);
      expect((await backend.sync(desired, { full: false })).mode).to.equal('noop');
    });

    it("lists each bucket chain of IPVS_OUTPUT and IPVS_PREROUTING like the original controller (with KUBE-MARK-MASQ), but for the contract's differences", async () => {
      createKubeMarkMasq(variant);
      await backend.sync(seedDesired(), { full: true });
      for (const chain of ['IPVS_OUTPUT', 'IPVS_PREROUTING'] as const) {
        const entry = listing(variant, chain);
        expect(entry).to.match(new RegExp(`^Chain ${chain} \\(1 references\\)`));
        // The entry chain goes to one bucket per last byte of the seed's addresses.
        const buckets = listingRows(entry).map((row) => row[0]);
        expect(buckets).to.deep.equal([`${chain}_57`, `${chain}_201`]);
        const listings = [entry];
        for (const bucket of buckets) {
          const text = listing(variant, bucket);
          expect(text).to.match(new RegExp(`^Chain ${bucket} \\(1 references\\)`));
          // Each port adds its rows; without protocol and port they are the original's rows of the
          // bucket's address, with the contract's differences (contractedSeedRows).
          const rows = listingRows(text).filter((row, i, all) => all.findIndex((r) => r.join() === row.join()) === i);
          expect(rows).to.deep.equal(contractedSeedRows(chain).filter((row) => row[2] === rows[0]![2]));
          listings.push(text);
        }
        // Both variants list the same text.
        assertGolden(`iptables-listing-${chain}.txt`, listings.join('\n\n'));
      }
    });

    it('uses KUBE-MARK-MASQ when it exists and sets the mark itself when it does not', async () => {
      const desired = seedDesired();
      await backend.sync(desired, { full: true });
      let rules = bucketRuleLines(natSave(variant), 'IPVS_OUTPUT');
      expect(
        rules.filter((_, i) => i % 2 === 0).every((r) => r.endsWith('-j MARK --set-xmark 0x4000/0x4000')),
      ).to.equal(true);
      createKubeMarkMasq(variant);
      await backend.sync(desired, { full: true });
      rules = bucketRuleLines(natSave(variant), 'IPVS_OUTPUT');
      expect(rules).to.have.length(8);
      expect(rules.filter((_, i) => i % 2 === 0).every((r) => r.endsWith('-j KUBE-MARK-MASQ'))).to.equal(true);
      expect(rules.filter((_, i) => i % 2 === 1).every((r) => r.includes('-j DNAT --to-destination'))).to.equal(true);
    });

    it("takes rule 1 back, once, after kube-proxy prepends its own jump, keeping kube-proxy's rule", async () => {
      const desired = seedDesired();
      await backend.sync(desired, { full: true });
      const portals = '-m comment --comment "kubernetes service portals" -j KUBE-SERVICES';
      // KUBE-SERVICES as kube-proxy's IPVS mode fills it: its ACCEPT of ClusterIP traffic ends the
      // nat walk, so a jump to it above ours can take packets first (an empty chain could not).
      const accept = '-A KUBE-SERVICES -d 10.96.0.0/12 -j ACCEPT';
      restore(
        variant,
        `*nat\n:KUBE-SERVICES - [0:0]\n${accept}\n-I PREROUTING 1 ${portals}\n-A OUTPUT -j IPVS_OUTPUT\nCOMMIT\n`,
      );
      let view = parseNatSave(natSave(variant));
      expect(view.rules.get('PREROUTING')![0]).to.equal(portals);
      expect(view.rules.get('OUTPUT')!).to.have.lengthOf(2);
      await backend.sync(desired, { full: true });
      view = parseNatSave(natSave(variant));
      expect(view.rules.get('PREROUTING')).to.deep.equal(['-j IPVS_PREROUTING', portals]);
      expect(view.rules.get('OUTPUT')).to.deep.equal(['-j IPVS_OUTPUT']);
    });

    it('a kube-proxy stand-in restoring the same nat table concurrently loses no rule, and neither do we', async () => {
      const a = seedDesired();
      const b = buildDesiredState(SERVICES, NODE_INFO, CONFIG);
      createKubeMarkMasq(variant);
      const standInRounds = 60;
      // kube-proxy's way: --noflush restores that rewrite its chains, add a per-round chain and
      // delete the previous one, and put rules in PREROUTING / OUTPUT after ours (every 5th
      // round before ours, as kube-proxy prepends its jump). A restore that fails means a rule
      // it wrote earlier was lost.
      const standIn = async () => {
        for (let i = 0; i < standInRounds; i++) {
          const lines = [
            '*nat',
            ':KUBE-SERVICES - [0:0]',
            ':KUBE-MARK-MASQ - [0:0]',
            `:KUBE-SEP-${i} - [0:0]`,
            '-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000',
            `-A KUBE-SERVICES -d 10.97.0.${i}/32 -p tcp -m tcp --dport 80 -j KUBE-SEP-${i}`,
            `-A KUBE-SEP-${i} -p tcp -j DNAT --to-destination 10.98.0.${i}:80`,
          ];
          if (i > 0) lines.push(`:KUBE-SEP-${i - 1} - [0:0]`, `-X KUBE-SEP-${i - 1}`);
          for (const chain of ['PREROUTING', 'OUTPUT']) {
            const where = i % 5 === 0 ? `-I ${chain} 1` : `-A ${chain}`;
            lines.push(`${where} -m comment --comment "stand-in ${i}" -j KUBE-SERVICES`);
            if (i > 0) lines.push(`-D ${chain} -m comment --comment "stand-in ${i - 1}" -j KUBE-SERVICES`);
          }
          lines.push('COMMIT', '');
          await execa(`${iptables(variant)}-restore`, ['--noflush', '-w'], { input: lines.join('\n') });
        }
      };
      const ours = async () => {
        for (let i = 0; i < 30; i++) await backend.sync(i % 2 === 0 ? a : b, { full: true });
      };
      const outcomes = await Promise.allSettled([standIn(), ours()]);
      for (const o of outcomes) if (o.status === 'rejected') throw o.reason;
      await backend.sync(b, { full: true });

      const save = natSave(variant);
      const view = parseNatSave(save);
      const last = standInRounds - 1;
      for (const chain of ['PREROUTING', 'OUTPUT']) {
        const specs = view.rules.get(chain)!;
        expect(specs[0], `rule 1 of ${chain} is our jump`).to.equal(`-j IPVS_${chain}`);
        expect(
          specs.filter((s) => s.includes('-j IPVS_')),
          `one jump in ${chain}`,
        ).to.have.lengthOf(1);
        expect(specs.slice(1)).to.deep.equal([`-m comment --comment "stand-in ${last}" -j KUBE-SERVICES`]);
      }
      expect(view.rules.get('KUBE-SERVICES')).to.deep.equal([
        `-d 10.97.0.${last}/32 -p tcp -m tcp --dport 80 -j KUBE-SEP-${last}`,
      ]);
      expect([...view.chains].filter((c) => c.startsWith('KUBE-SEP-'))).to.deep.equal([`KUBE-SEP-${last}`]);
      expect(ourRuleLines(save)).to.deep.equal(renderedLines(renderChainRules('ipv4', b.ipv4, b.masqueradeMark, true)));
    });

    it('cleanup removes chains and jumps only, and a second cleanup succeeds', async () => {
      createKubeMarkMasq(variant);
      await backend.sync(seedDesired(), { full: true });
      expect(await hasIptablesObjects(variant)).to.equal(true);
      await backend.cleanup();
      await backend.cleanup();
      expect(await hasIptablesObjects(variant)).to.equal(false);
      for (const family of ['ipv4', 'ipv6'] as const) {
        const save = natSave(variant, family);
        expect(save, `${family}: nothing of ours is left`).to.not.include('IPVS_');
      }
      expect(parseNatSave(natSave(variant)).chains, "kube-proxy's chain is kept").to.include('KUBE-MARK-MASQ');
    });

    it('is safe to clean up, and says what to install, when the iptables commands are missing', async () => {
      const emptyPath = mkdtempSync(join(tmpdir(), 'no-iptables-'));
      const path = process.env.PATH;
      process.env.PATH = emptyPath;
      try {
        const missing = new Reconciler(new IptablesDriver(variant));
        await missing.cleanup();
        expect((await rejectionOf(missing.sync(seedDesired(), { full: true }))).message).to.match(
          /install the iptables package/,
        );
        const probed = await missing.driver.probe();
        expect(probed.ok).to.equal(false);
        expect(probed.detail).to.match(/install the iptables package/);
      } finally {
        process.env.PATH = path;
        rmSync(emptyPath, { recursive: true, force: true });
      }
    });
  });
}

describe('iptables variant detection (kube-proxy iptables-wrapper rules)', function () {
  before(() => assertIsolatedNetns());
  afterEach(() => {
    for (const variant of VARIANTS) {
      for (const [table, chain] of [
        ['filter', 'DETECT-TEST'],
        ['mangle', 'KUBE-IPTABLES-HINT'],
      ] as const) {
        try {
          sh(iptables(variant), ['-w', '-t', table, '-F', chain]);
          sh(iptables(variant), ['-w', '-t', table, '-X', chain]);
        } catch {
          // not created by this test
        }
      }
    }
  });

  it('goes to nft on a tie, and does not count our own rules', async () => {
    const ours = new Reconciler(new IptablesDriver('legacy'));
    await ours.sync(seedDesired(), { full: true });
    try {
      const choice = await detectIptablesVariant();
      expect(choice.variant, choice.reason).to.equal('nft');
      expect(choice.reason).to.match(/ties go to nft/);
    } finally {
      await ours.cleanup();
      await ours.close();
    }
  });

  it('follows the variant that holds more rules', async () => {
    const twoRules = '*filter\n:DETECT-TEST - [0:0]\n-A DETECT-TEST -j RETURN\n-A DETECT-TEST -j RETURN\nCOMMIT\n';
    sh('iptables-legacy-restore', ['--noflush', '-w'], twoRules);
    const choice = await detectIptablesVariant();
    expect(choice.variant, choice.reason).to.equal('legacy');
  });

  it("follows the kubelet's hint chain before rule counts", async () => {
    const oneRule = '*filter\n:DETECT-TEST - [0:0]\n-A DETECT-TEST -j RETURN\nCOMMIT\n';
    sh('iptables-legacy-restore', ['--noflush', '-w'], oneRule);
    sh('iptables-nft-restore', ['--noflush', '-w'], '*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n');
    const choice = await detectIptablesVariant();
    expect(choice.variant, choice.reason).to.equal('nft');
    expect(choice.reason).to.match(/hint chain/);
  });
});
