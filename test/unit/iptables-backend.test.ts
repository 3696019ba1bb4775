// Every branch of Reconciler.sync, its cleanup and the jump guard, without root: the
// backend runs its commands against a stand-in that keeps each nat table in memory and applies
// or refuses restores as the kernel does (test/doubles/fake-iptables.ts). The kernel
// tests (test/kernel/iptables*.test.ts) stay the proof with packets.

import { Reconciler } from '../../src/reconciler/reconciler.js';
import { expect } from 'chai';
import { IptablesCommands } from '../../src/backends/iptables/executor.js';
import { FakeIptables } from '../doubles/fake-iptables.js';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import { JumpGuard } from '../../src/backends/iptables/jump-guard.js';
import { parseBucketChain } from '../../src/backends/iptables/layout.js';
import { BackendError } from '../../src/driver/driver.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import type { DesiredState, Family, ModelConfig, ServiceInfo } from '../../src/model/types.js';
import { CONFIG, lbService } from '../support/fixtures.js';
import { linesLogger } from '../support/log-lines.js';
import { assertGolden } from '../support/golden.js';

const NODE = { name: 'node-1', podCIDRs: ['10.244.1.0/24', 'fd01::/64'] };

/** Dual-stack: one LoadBalancer IP and one ClusterIP per family. */
function service(i: number): ServiceInfo {
  return lbService(i, {
    clusterIPs: [`10.96.0.${i}`, `fd00::${i}`],
    ingress: [{ ip: `192.0.2.${i}` }, { ip: `2001:db8::${i}` }],
  });
}

const state = (services: ServiceInfo[], config: Partial<ModelConfig> = {}): DesiredState =>
  buildDesiredState(services, NODE, { ...CONFIG, ...config });

/** The rules of an entry chain's buckets, chain after chain; undefined when the entry chain does not exist. */
function bucketRules(fake: FakeIptables, variant: 'legacy' | 'nft', family: Family, entry: string) {
  const nat = fake.nat(variant, family);
  if (!nat.chains.has(entry)) return undefined;
  return [...nat.chains.keys()].filter((c) => parseBucketChain(c)?.entry === entry).flatMap((c) => nat.rules(c)!);
}

/** Our rules as `-save` prints them, for one family's nat table: the translations, the gotos and the jumps. */
function ourChains(fake: FakeIptables, variant: 'legacy' | 'nft', family: Family) {
  const nat = fake.nat(variant, family);
  return {
    prerouting: bucketRules(fake, variant, family, 'IPVS_PREROUTING'),
    output: bucketRules(fake, variant, family, 'IPVS_OUTPUT'),
    gotos: { PREROUTING: nat.rules('IPVS_PREROUTING'), OUTPUT: nat.rules('IPVS_OUTPUT') },
    jumps: {
      PREROUTING: nat.rules('PREROUTING')?.filter((r) => r.includes('IPVS_')),
      OUTPUT: nat.rules('OUTPUT')?.filter((r) => r.includes('IPVS_')),
    },
  };
}

for (const variant of ['legacy', 'nft'] as const) {
  describe(`Reconciler (iptables-${variant}) against a stand-in nat table`, () => {
    let fake: FakeIptables;
    let backend: Reconciler;
    beforeEach(() => {
      fake = new FakeIptables();
      backend = new Reconciler(new IptablesDriver(variant, { runner: fake, jumpCheckIntervalMs: 0 }));
    });

    it('a read alongside our writes that one of them overlapped is unfinished', async () => {
      const driver = new IptablesDriver(variant, { runner: fake, jumpCheckIntervalMs: 0 });
      const reconciler = new Reconciler(driver);
      const two = state([service(1), service(2)]);
      await reconciler.sync(two, { full: true });
      const shape = { state: { ...two.ipv4, entries: [] }, masqueradeMark: two.masqueradeMark };
      expect(await driver.readBack('ipv4', two.ipv4.entries, shape, 'alongside-writes')).to.deep.include({
        shapeDrift: [],
      });
      // A Service comes while the chains are being read: its rules are written meanwhile.
      fake.onRun = async () => {
        fake.onRun = undefined;
        await reconciler.sync(state([service(1), service(2), service(3)]), { full: false });
      };
      expect(await driver.readBack('ipv4', two.ipv4.entries, shape, 'alongside-writes')).to.equal('unfinished');
      expect(fake.onRun, 'the write ran during the read').to.equal(undefined);
      // Between our writes it reads, whatever happens: the chains now hold three entries, not two.
      const between = await driver.readBack('ipv4', two.ipv4.entries, shape, 'between-writes');
      expect(between).to.deep.include({ shapeDrift: ['chains'] });
    });

    it("the first sync writes both families: our chains, a jump at rule 1, the masquerade mark on the node's traffic only", async () => {
      const result = await backend.sync(state([service(1), service(2)]), { full: false });
      expect(result.mode).to.equal('full');
      expect(result.entries).to.deep.equal({ ipv4: 2, ipv6: 2 });
      expect(result.rejected).to.deep.equal([]);
      expect(fake.restores(variant).map((c) => c.command)).to.deep.equal([
        `iptables-${variant}-restore`,
        `ip6tables-${variant}-restore`,
      ]);
      for (const call of fake.restores()) expect(call.args).to.include.members(['--noflush', '-w']);
      for (const family of ['ipv4', 'ipv6'] as const) {
        const chains = ourChains(fake, variant, family);
        expect(fake.nat(variant, family).rules('PREROUTING')?.[0]).to.equal('-j IPVS_PREROUTING');
        expect(fake.nat(variant, family).rules('OUTPUT')?.[0]).to.equal('-j IPVS_OUTPUT');
        // Per entry: a DNAT rule for pods (their source kept), a mark rule and a DNAT rule for the node.
        expect(chains.prerouting).to.have.length(2);
        expect(chains.output).to.have.length(4);
      }
      const v4 = ourChains(fake, variant, 'ipv4');
      // Each address in the bucket of its last byte, gone to from the entry chain.
      expect(v4.gotos.OUTPUT).to.deep.equal([
        '-d 0.0.0.1/0.0.0.255 -g IPVS_OUTPUT_1',
        '-d 0.0.0.2/0.0.0.255 -g IPVS_OUTPUT_2',
      ]);
      expect(fake.nat(variant, 'ipv4').rules('IPVS_OUTPUT_2')).to.have.length(2);
      expect(ourChains(fake, variant, 'ipv6').gotos.PREROUTING).to.deep.equal([
        '-d ::1/::ff -g IPVS_PREROUTING_1',
        '-d ::2/::ff -g IPVS_PREROUTING_2',
      ]);
      expect(v4.output?.[0]).to.equal(
        '-d 192.0.2.1/32 -p tcp -m comment --comment "default/svc-1" -m addrtype --src-type LOCAL --dst-type LOCAL -m tcp --dport 80 -j MARK --set-xmark 0x4000/0x4000',
      );
      expect(v4.prerouting?.[0]).to.equal(
        '-s 10.244.1.0/24 -d 192.0.2.1/32 -p tcp -m comment --comment "default/svc-1" -m addrtype --dst-type LOCAL -m tcp --dport 80 -j DNAT --to-destination 10.96.0.1',
      );
      expect(
        (v4.prerouting ?? []).some((r) => r.includes('MARK')),
        'no mark on pod traffic',
      ).to.equal(false);
    });

    it('a partial sync writes only the family that changed, and exactly its new rules', async () => {
      await backend.sync(state([service(1)]), { full: true });
      const before = fake.restores().length;
      // Service 2 only has an IPv4 address: the IPv6 rules stay as they are.
      const v4only: ServiceInfo = { ...service(2), clusterIPs: ['10.96.0.2'], ingress: [{ ip: '192.0.2.2' }] };
      const calls = fake.calls.length;
      const result = await backend.sync(state([service(1), v4only]), { full: false });
      expect(result.mode).to.equal('partial');
      expect(result.entries).to.deep.equal({ ipv4: 2, ipv6: 1 });
      const written = fake.restores().slice(before);
      expect(written.map((c) => c.command)).to.deep.equal([`iptables-${variant}-restore`]);
      // Nothing is read or declared (which would flush the chain): four rules appended.
      expect(
        fake.calls.slice(calls).filter((c) => !c.command.endsWith('-restore')),
        'no listing',
      ).to.deep.equal([]);
      assertGolden('iptables-partial-add.txt', written[0]!.input!);
      expect(ourChains(fake, variant, 'ipv4').output).to.have.length(4);
      expect(ourChains(fake, variant, 'ipv6').output).to.have.length(2);
    });

    it('a partial sync deletes the rules of what went by their spec and appends what came, in one restore', async () => {
      await backend.sync(state([service(1), service(2), service(3)]), { full: true });
      const before = fake.restores().length;
      // Service 2 goes (its buckets with it), service 3 gets another ClusterIP (its mark rules
      // stay), service 4 comes (in new buckets).
      const retargeted: ServiceInfo = { ...service(3), clusterIP: '10.96.1.3', clusterIPs: ['10.96.1.3', 'fd00::1:3'] };
      const result = await backend.sync(state([service(1), retargeted, service(4)]), { full: false });
      expect(result.mode).to.equal('partial');
      expect(result.entries).to.deep.equal({ ipv4: 3, ipv6: 3 });
      const written = fake.restores().slice(before);
      expect(written).to.have.length(2);
      assertGolden('iptables-partial-churn.txt', written[0]!.input!);
      // The chains hold what a fresh full write of the same state holds, in another order.
      const fresh = new FakeIptables();
      await new Reconciler(new IptablesDriver(variant, { runner: fresh, jumpCheckIntervalMs: 0 })).sync(
        state([service(1), retargeted, service(4)]),
        { full: true },
      );
      for (const family of ['ipv4', 'ipv6'] as const) {
        const got = ourChains(fake, variant, family);
        const want = ourChains(fresh, variant, family);
        expect([...got.output!].sort()).to.deep.equal([...want.output!].sort());
        expect([...got.prerouting!].sort()).to.deep.equal([...want.prerouting!].sort());
        expect(got.gotos).to.deep.equal(want.gotos);
        expect(got.jumps).to.deep.equal(want.jumps);
        expect([...fake.nat(variant, family).chains.keys()].sort()).to.deep.equal(
          [...fresh.nat(variant, family).chains.keys()].sort(),
        );
      }
    });

    it('a partial write the kernel refuses (the chains changed under it) becomes a whole write', async () => {
      // Service 258's address shares service 2's last byte: bucket 2 keeps it when service 2 goes.
      const neighbour = lbService(258, {
        clusterIPs: ['10.96.1.2'],
        clusterIP: '10.96.1.2',
        ingress: [{ ip: '192.0.3.2' }],
      });
      await backend.sync(state([service(1), service(2), neighbour]), { full: true });
      const rules = fake.nat(variant, 'ipv4').rules('IPVS_OUTPUT_2')!;
      expect(rules).to.have.length(4);
      // Someone deleted service 2's DNAT rule: deleting it again fails the partial write.
      fake.write(variant, 'ipv4', `*nat\n-D IPVS_OUTPUT_2 ${rules[1]!}\nCOMMIT\n`);
      const result = await backend.sync(state([service(1), neighbour]), { full: false });
      expect(result.mode).to.equal('full');
      expect(result.fallbackReason).to.equal('partial-failed');
      expect(fake.nat(variant, 'ipv4').rules('IPVS_OUTPUT_2')).to.deep.equal(rules.slice(2));
    });

    it('a partial sync of the state written last writes nothing and repeats the counts', async () => {
      const desired = state([service(1), service(2)]);
      await backend.sync(desired, { full: true });
      const calls = fake.calls.length;
      const result = await backend.sync(state([service(1), service(2)]), { full: false });
      expect(result).to.deep.equal({ mode: 'noop', entries: { ipv4: 2, ipv6: 2 }, rejected: [] });
      // Not even a read: the state decides.
      expect(fake.calls.length).to.equal(calls);
    });

    it('a full resync of an untouched table reads it and writes only what the variant cannot compare', async () => {
      await backend.sync(state([service(1)]), { full: true });
      const saved = fake.nat(variant, 'ipv4').save();
      const before = fake.restores().length;
      const calls = fake.calls.length;
      const result = await backend.sync(state([service(1)]), { full: true });
      // A full sync: verified (or trusted), and nothing written.
      expect(result.mode).to.equal('full');
      expect(result.repairedElements).to.equal(undefined);
      expect(fake.restores().length).to.equal(before);
      if (variant === 'legacy') {
        // The whole table is read (what any listing costs) and compared.
        expect(fake.calls.slice(calls).map((c) => `${c.command} ${c.args.join(' ')}`)).to.deep.equal([
          'iptables-legacy-save -t nat',
          'ip6tables-legacy-save -t nat',
        ]);
      } else {
        // No commit but ours since the last write: the ruleset generation says so, nothing is read.
        expect(fake.calls.length).to.equal(calls);
      }
      expect(fake.nat(variant, 'ipv4').save()).to.equal(saved);
    });

    it('past the bound on rule deletes in a chain, a partial sync writes that chain whole in its one restore', async () => {
      backend = new Reconciler(
        new IptablesDriver(variant, { runner: fake, jumpCheckIntervalMs: 0, rewriteAboveDeletes: 5 }),
      );
      // Service 3 on three ports, and service 259 in the same bucket (its address ends in 3 too).
      const threePorts = (s: ServiceInfo, n: number): ServiceInfo => ({
        ...s,
        ports: [80, 81, 82].slice(0, n).map((port) => ({ port, protocol: 'TCP' as const })),
      });
      const neighbour = lbService(259, {
        clusterIPs: ['10.96.1.3'],
        clusterIP: '10.96.1.3',
        ingress: [{ ip: '192.0.3.3' }],
      });
      await backend.sync(state([service(1), threePorts(service(3), 3), neighbour]), { full: true });
      const before = fake.restores().length;
      // Two ports go: four deletes in each of service 3's bucket chains, at the bound: deleted.
      expect(
        (await backend.sync(state([service(1), threePorts(service(3), 1), neighbour]), { full: false })).mode,
      ).to.equal('partial');
      expect(fake.restores()[before]!.input).to.match(/^-D IPVS_OUTPUT_3 -d 192\.0\.2\.3\/32 .* --dport 82 -j DNAT/m);
      expect(fake.restores()[before]!.input).to.not.match(/^:/m);
      // Then service 3 comes back on three ports and goes with its address moved: six deletes per
      // chain, past the bound: bucket 3's chains are written whole with service 259 alone, and the
      // moved address is appended to the chains of its new bucket.
      await backend.sync(state([service(1), threePorts(service(3), 3), neighbour]), { full: false });
      const moved: ServiceInfo = {
        ...threePorts(service(3), 3),
        ingress: [{ ip: '192.0.2.103' }, { ip: '2001:db8::103' }],
      };
      const start = fake.restores().length;
      const result = await backend.sync(state([service(1), moved, neighbour]), { full: false });
      expect(result.mode).to.equal('partial');
      expect(result.entries).to.deep.equal({ ipv4: 5, ipv6: 4 });
      const written = fake.restores().slice(start);
      expect(written).to.have.length(2);
      assertGolden('iptables-partial-rewrite.txt', written[0]!.input!);
      const fresh = new FakeIptables();
      await new Reconciler(new IptablesDriver(variant, { runner: fresh, jumpCheckIntervalMs: 0 })).sync(
        state([service(1), moved, neighbour]),
        { full: true },
      );
      for (const family of ['ipv4', 'ipv6'] as const) {
        const got = ourChains(fake, variant, family);
        const want = ourChains(fresh, variant, family);
        expect([...got.output!].sort()).to.deep.equal([...want.output!].sort());
        expect([...got.prerouting!].sort()).to.deep.equal([...want.prerouting!].sort());
        expect([...got.gotos.OUTPUT!].sort()).to.deep.equal([...want.gotos.OUTPUT!].sort());
        // The chain written whole holds what a fresh write puts there, in its order.
        expect(fake.nat(variant, family).rules('IPVS_OUTPUT_3')).to.deep.equal(
          fresh.nat(variant, family).rules('IPVS_OUTPUT_3'),
        );
      }
      // What was written is known: the next change builds on it; a bucket that loses its last
      // entry goes with its goto.
      expect((await backend.sync(state([service(1), moved]), { full: false })).mode).to.equal('partial');
      // Service 259 has no IPv6 address: one restore.
      const last = fake.restores().at(-1)!.input!;
      expect(last).to.include('-D IPVS_OUTPUT -d 0.0.0.3/0.0.0.255 -g IPVS_OUTPUT_3\n');
      expect(last).to.include('-X IPVS_OUTPUT_3\n');
      expect(fake.nat(variant, 'ipv4').chains.has('IPVS_OUTPUT_3')).to.equal(false);
      expect(fake.nat(variant, 'ipv4').chains.has('IPVS_PREROUTING_3')).to.equal(false);
    });

    it('a full resync after another commit compares our chains with what was written, and writes nothing', async () => {
      await backend.sync(state([service(1), service(2)]), { full: true });
      await backend.sync(state([service(2), service(3)]), { full: false });
      fake.write(variant, 'ipv4', '*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n');
      const before = fake.restores().length;
      const result = await backend.sync(state([service(2), service(3)]), { full: true });
      expect(result.mode).to.equal('full');
      expect(result.repairedElements).to.equal(undefined);
      expect(fake.restores().length).to.equal(before);
      // Known again: the next resync reads nothing (iptables-nft).
      const calls = fake.calls.length;
      await backend.sync(state([service(2), service(3)]), { full: true });
      if (variant === 'nft') expect(fake.calls.length).to.equal(calls);
    });

    it('without the ruleset generation (iptables-nft) every full resync compares', async () => {
      fake.readsGenerations = false;
      await backend.sync(state([service(1)]), { full: true });
      const before = fake.restores().length;
      const calls = fake.calls.length;
      expect((await backend.sync(state([service(1)]), { full: true })).repairedElements).to.equal(undefined);
      expect(fake.restores().length).to.equal(before);
      expect(fake.calls.length).to.be.greaterThan(calls);
    });

    it('a full resync repairs a bucket chain, or an entry chain, flushed by someone else', async () => {
      await backend.sync(state([service(1)]), { full: true });
      const rules = ourChains(fake, variant, 'ipv4').output;
      const gotos = ourChains(fake, variant, 'ipv4').gotos;
      fake.write(variant, 'ipv4', '*nat\n-F IPVS_OUTPUT_1\nCOMMIT\n');
      expect(ourChains(fake, variant, 'ipv4').output).to.deep.equal([]);
      let result = await backend.sync(state([service(1)]), { full: true });
      expect(result.mode).to.equal('full');
      expect(ourChains(fake, variant, 'ipv4').output).to.deep.equal(rules);
      fake.write(variant, 'ipv4', '*nat\n-F IPVS_PREROUTING\nCOMMIT\n');
      result = await backend.sync(state([service(1)]), { full: true });
      expect(result.mode).to.equal('full');
      expect(ourChains(fake, variant, 'ipv4').gotos).to.deep.equal(gotos);
    });

    it('a full resync puts back our jump when someone removed it', async () => {
      await backend.sync(state([service(1)]), { full: true });
      fake.write(variant, 'ipv6', '*nat\n-D PREROUTING -j IPVS_PREROUTING\nCOMMIT\n');
      expect(ourChains(fake, variant, 'ipv6').jumps.PREROUTING).to.deep.equal([]);
      await backend.sync(state([service(1)]), { full: true });
      expect(fake.nat(variant, 'ipv6').rules('PREROUTING')).to.deep.equal(['-j IPVS_PREROUTING']);
    });

    it('a full resync moves our jump back to rule 1 above another writer, once, keeping its rule', async () => {
      // kube-proxy's IPVS-mode chain ACCEPTs the Services' addresses: above ours, it takes them.
      fake.write(
        variant,
        'ipv4',
        '*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -d 192.0.2.1/32 -j ACCEPT\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n',
      );
      await backend.sync(state([service(1)]), { full: true });
      expect(fake.nat(variant, 'ipv4').rules('PREROUTING')).to.deep.equal(['-j IPVS_PREROUTING', '-j KUBE-SERVICES']);
      fake.write(variant, 'ipv4', '*nat\n-I OUTPUT 1 -j KUBE-SERVICES\nCOMMIT\n');
      await backend.sync(state([service(1)]), { full: true });
      expect(fake.nat(variant, 'ipv4').rules('OUTPUT')).to.deep.equal(['-j IPVS_OUTPUT', '-j KUBE-SERVICES']);
      expect(fake.nat(variant, 'ipv4').rules('PREROUTING')).to.deep.equal(['-j IPVS_PREROUTING', '-j KUBE-SERVICES']);
    });

    it("jumps to kube-proxy's KUBE-MARK-MASQ when the table has it, else sets the mark itself", async () => {
      fake.write(
        variant,
        'ipv4',
        '*nat\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\nCOMMIT\n',
      );
      await backend.sync(state([service(1)]), { full: true });
      const withChain = ourChains(fake, variant, 'ipv4').output ?? [];
      const without = ourChains(fake, variant, 'ipv6').output ?? [];
      expect(withChain[0]).to.match(/ -j KUBE-MARK-MASQ$/);
      expect(without[0]).to.match(/ -j MARK --set-xmark 0x4000\/0x4000$/);
      // The DNAT rules do not depend on it.
      expect(withChain[1]).to.match(/ -j DNAT --to-destination 10\.96\.0\.1$/);
    });

    it('retries a restore that lost a race and programs the rules', async () => {
      fake.failNextRestores(2);
      const result = await backend.sync(state([service(1)]), { full: true });
      expect(result.mode).to.equal('full');
      expect(ourChains(fake, variant, 'ipv4').output).to.have.length(2);
    });

    it('reports a restore the kernel rejects, keeps the other family, and syncs it in full next time', async () => {
      await backend.sync(state([service(1)]), { full: true });
      const saved = fake.nat(variant, 'ipv4').save();
      // Both partial writes (IPv4's, IPv6's), then IPv4's whole write and its two retries.
      fake.failNextRestores(5, 'line 5 failed: Cannot allocate memory');
      const error = await backend.sync(state([service(1), service(2)]), { full: false }).then(
        () => undefined,
        (err: unknown) => err,
      );
      expect(error).to.be.instanceOf(BackendError);
      expect((error as Error).message).to.equal(
        `iptables-${variant} sync failed: ipv4: iptables-${variant}-restore: iptables-${variant}-restore: line 5 failed: Cannot allocate memory`,
      );
      // Rejected whole: the IPv4 table is as it was; IPv6 got the new Service.
      expect(fake.nat(variant, 'ipv4').save()).to.equal(saved);
      expect(ourChains(fake, variant, 'ipv6').output).to.have.length(4);
      // The same state again: IPv4 is written although the state did not change since; IPv6 is not.
      const before = fake.restores().length;
      const result = await backend.sync(state([service(1), service(2)]), { full: false });
      expect(result.mode).to.equal('full');
      expect(
        fake
          .restores()
          .slice(before)
          .map((c) => c.command),
      ).to.deep.equal([`iptables-${variant}-restore`]);
      expect(ourChains(fake, variant, 'ipv4').output).to.have.length(4);
    });

    it('restore input the kernel would refuse is rejected whole, and the table stays as it was', () => {
      fake.write(variant, 'ipv4', '*nat\n:A - [0:0]\nCOMMIT\n');
      const saved = fake.nat(variant, 'ipv4').save();
      expect(() => fake.write(variant, 'ipv4', '*nat\n-A A -j ACCEPT\n-A A -j NO-SUCH-CHAIN\nCOMMIT\n')).to.throw(
        /line 3 failed/,
      );
      expect(fake.nat(variant, 'ipv4').save()).to.equal(saved);
    });

    it('fails at once, without retries, when the commands are not installed', async () => {
      fake.missing.add(variant);
      const error = await backend.sync(state([service(1)]), { full: true }).then(
        () => undefined,
        (err: unknown) => err,
      );
      expect(error).to.be.instanceOf(BackendError);
      expect((error as Error).message).to.include(`the 'iptables-${variant}`);
      expect((error as Error).message).to.include('install the iptables package');
    });

    it('leaves out and reports entries that fail validation, logging each once per change', async () => {
      const lines: string[] = [];
      const logger = linesLogger(lines);
      backend = new Reconciler(new IptablesDriver(variant, { runner: fake, jumpCheckIntervalMs: 0, logger }));
      const desired = state([service(1), service(2)], {
        detectLocalMode: 'BridgeInterface',
        podBridgeInterface: 'cni"0',
      });
      const first = await backend.sync(desired, { full: true });
      expect(first.rejected!.map((r) => `${r.family} ${r.item}`)).to.deep.equal([
        'ipv4 pod bridge interface',
        'ipv6 pod bridge interface',
      ]);
      // The rest is programmed: the OUTPUT rules, no PREROUTING rules.
      expect(ourChains(fake, variant, 'ipv4').output).to.have.length(4);
      expect(ourChains(fake, variant, 'ipv4').prerouting).to.deep.equal([]);
      // A skipped partial sync reports the same rejections; the log has each once.
      const again = await backend.sync(desired, { full: false });
      expect(again.mode).to.equal('noop');
      expect(again.rejected).to.deep.equal(first.rejected);
      // So does a full one, which hands the driver back its annex of the last write.
      expect((await backend.sync(desired, { full: true })).rejected).to.deep.equal(first.rejected);
      const leftOut = lines
        .map((l) => JSON.parse(l) as Record<string, unknown>)
        .filter((l) => l.item === 'pod bridge interface');
      expect(leftOut.map((l) => [l.msg, l.family])).to.have.deep.members([
        ['Left out of the iptables rules', 'ipv4'],
        ['Left out of the iptables rules', 'ipv6'],
      ]);
    });

    it('a bad entry costs only its own rules', async () => {
      const desired = state([service(1), service(2)]);
      // A state made by hand (a model's entries never change): the model's, and one bad entry.
      const { entries, localPodMatch } = desired.ipv4;
      desired.ipv4 = { entries: [...entries, { ...entries[0]!, port: 70000 }], localPodMatch };
      const result = await backend.sync(desired, { full: true });
      expect(result.rejected).to.have.length(1);
      expect(result.rejected![0]?.reason).to.equal('port 70000 is not in 1..65535');
      expect(result.entries.ipv4).to.equal(2);
      expect(ourChains(fake, variant, 'ipv4').output).to.have.length(4);
    });

    it('cleanup removes our chains and jumps, keeps the rest, and is idempotent', async () => {
      fake.write(variant, 'ipv4', '*nat\n:KUBE-SERVICES - [0:0]\n-A OUTPUT -j KUBE-SERVICES\nCOMMIT\n');
      await backend.sync(state([service(1)]), { full: true });
      await backend.cleanup();
      for (const family of ['ipv4', 'ipv6'] as const) {
        const nat = fake.nat(variant, family);
        expect([...nat.chains.keys()].filter((c) => c.startsWith('IPVS_'))).to.deep.equal([]);
        expect(nat.save()).to.not.include('IPVS_');
      }
      expect(fake.nat(variant, 'ipv4').rules('OUTPUT')).to.deep.equal(['-j KUBE-SERVICES']);
      const restores = fake.restores().length;
      await backend.cleanup();
      expect(fake.restores().length).to.equal(restores);
      // After a cleanup the next sync starts over in full.
      expect((await backend.sync(state([service(1)]), { full: false })).mode).to.equal('full');
    });

    it('probes with a test restore that commits nothing', async () => {
      expect(await backend.driver.probe()).to.deep.equal({ ok: true, detail: `iptables via iptables-${variant}` });
      expect(fake.calls.map((c) => c.args.includes('--test'))).to.deep.equal([true, true]);
      expect(fake.nat(variant, 'ipv4').save()).to.not.include('IPVS_');
      fake.missing.add(variant);
      expect((await backend.driver.probe()).ok).to.equal(false);
    });

    it('the jump guard moves our jump back to rule 1 between syncs, and does nothing when it is there', async () => {
      await backend.sync(state([service(1)]), { full: true });
      const repaired: Family[] = [];
      const guard = new JumpGuard({
        variant,
        intervalMs: 1000,
        runner: fake,
        exclusive: (work) => work(),
        onRepair: (family) => repaired.push(family),
      });
      const restores = fake.restores().length;
      await guard.checkAll();
      expect(fake.restores().length).to.equal(restores);
      // A chain that only marks, above ours, takes nothing from it: left alone.
      fake.write(
        variant,
        'ipv6',
        '*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j MARK --or-mark 0x1000\n-I PREROUTING 1 -j KUBE-SERVICES\nCOMMIT\n',
      );
      await guard.checkAll();
      expect(repaired).to.deep.equal([]);
      expect(fake.nat(variant, 'ipv6').rules('PREROUTING')).to.deep.equal(['-j KUBE-SERVICES', '-j IPVS_PREROUTING']);
      // Once it ACCEPTs an address, it is moved below ours.
      fake.write(variant, 'ipv6', '*nat\n-A KUBE-SERVICES -d 2001:db8::1/128 -j ACCEPT\nCOMMIT\n');
      await guard.checkAll();
      expect(repaired).to.deep.equal(['ipv6']);
      expect(fake.nat(variant, 'ipv6').rules('PREROUTING')).to.deep.equal(['-j IPVS_PREROUTING', '-j KUBE-SERVICES']);
      // iptables-nft asked for rule 1 only, holding the lock; iptables-legacy, which reads the
      // whole table for any listing, read it with -save, which takes no lock.
      const listings = fake.calls
        .filter((c) => c.command.startsWith('ip6tables-'))
        .map((c) => `${c.command} ${c.args.join(' ')}`);
      if (variant === 'nft') {
        expect(listings).to.include('ip6tables-nft -w 30 -t nat -S PREROUTING 1');
      } else {
        expect(listings).to.include('ip6tables-legacy-save -t nat');
        expect(listings.filter((l) => l.startsWith('ip6tables-legacy '))).to.deep.equal([]);
      }
    });
  });
}

describe('the jump guard of iptables-nft and our own commits', () => {
  it('needs no round for a commit of ours, and makes one for anybody else’s', async () => {
    const fake = new FakeIptables();
    const backend = new Reconciler(new IptablesDriver('nft', { runner: fake, jumpCheckIntervalMs: 0 }));
    await backend.sync(state([service(1)]), { full: true });
    const guard = new JumpGuard({
      variant: 'nft',
      intervalMs: 60_000,
      runner: fake,
      exclusive: (work) => work(),
    });
    // Rule 1 of a hook, as the guard asks for it.
    const firstRules = () => fake.calls.filter((c) => c.args.at(-1) === '1' && c.args.includes('-S')).length;
    await guard.checkAll();
    expect(firstRules(), 'the first round asks for rule 1 of both hooks in both families').to.equal(4);
    // A change of ours: one commit per family, each of which the driver reports.
    const before = fake.nftGeneration;
    await backend.sync(state([service(1), service(2)]), { full: false });
    expect(fake.nftGeneration).to.equal(before + 2);
    guard.ownCommit(before, before + 1);
    guard.ownCommit(before + 1, before + 2);
    await guard.checkAll();
    expect(firstRules(), 'nothing asked for after our commits').to.equal(4);
    // Another writer's commit, even one that leaves our jumps alone, makes a round.
    fake.write('nft', 'ipv4', '*nat\n:OTHER - [0:0]\nCOMMIT\n');
    guard.ownCommit(fake.nftGeneration, fake.nftGeneration + 1);
    await guard.checkAll();
    expect(firstRules()).to.equal(8);
  });
});

describe('the iptables stand-in refuses what the real commands refuse', () => {
  it('a restore without the lock wait, a deleted rule that is not there, a chain still jumped to', async () => {
    const fake = new FakeIptables();
    expect((await fake.run('iptables-nft-restore', ['--noflush'], '*nat\nCOMMIT\n')).exitCode).to.equal(2);
    expect(() => fake.write('nft', 'ipv4', '*nat\n-D OUTPUT -j ACCEPT\nCOMMIT\n')).to.throw(/line 2 failed/);
    fake.write('nft', 'ipv4', '*nat\n:A - [0:0]\n-A OUTPUT -j A\nCOMMIT\n');
    expect(() => fake.write('nft', 'ipv4', '*nat\n-X A\nCOMMIT\n')).to.throw(/Too many links/);
    expect(() => fake.write('nft', 'ipv4', '*nat\n-A OUTPUT -j ACCEPT\n')).to.throw(/COMMIT expected/);
    const commands = new IptablesCommands('nft', 'ipv4', fake);
    expect(await commands.listRules('nat', 'NOPE')).to.equal(undefined);
    expect(await commands.firstRule('nat', 'OUTPUT')).to.equal('-j A');
    expect(await commands.firstRule('nat', 'A')).to.equal('');
  });
});
