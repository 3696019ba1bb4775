// The iptables driver keeps no record of the kernel: the reconciler's ledger keeps the one, the
// driver's annex of each family among it (src/backends/iptables/annex.ts), and hands it back with
// each operation. Shown twice, against the stand-in nat tables: a run of partial syncs through a
// driver made anew before every apply writes exactly what a long-lived driver writes, each sync
// as partial; after such a run nothing reachable from the driver holds an entry; and the jump
// guard, which runs between syncs, looks after the families whose entry chains the table holds.

import { expect } from 'chai';
import { Reconciler } from '../../src/reconciler/reconciler.js';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import { JumpGuard } from '../../src/backends/iptables/jump-guard.js';
import { removeIptablesObjects } from '../../src/backends/iptables/nat-view.js';
import { FAMILIES, type Family } from '../../src/model/types.js';
import type { SyncResult } from '../../src/reconciler/sync-result.js';
import { FakeIptables } from '../doubles/fake-iptables.js';
import { RebuiltDriver, iptablesSteps } from '../support/iptables-steps.js';

/** Paths from `root` to the entries (objects with an externalIp and a port) reachable from it through its fields, maps, sets and arrays. */
function reachableEntries(root: object): string[] {
  const seen = new Set<unknown>();
  const found: string[] = [];
  const visit = (value: unknown, path: string): void => {
    if (value === null || typeof value !== 'object' || seen.has(value)) return;
    seen.add(value);
    if ('externalIp' in value && 'port' in value) {
      found.push(path);
      return;
    }
    if (value instanceof Map) {
      for (const [key, v] of value) {
        visit(key, `${path} key`);
        visit(v, `${path}[${String(key)}]`);
      }
    } else if (value instanceof Set || Array.isArray(value)) {
      let i = 0;
      for (const v of value) visit(v, `${path}[${i++}]`);
    } else {
      for (const key of Object.getOwnPropertyNames(value))
        visit((value as Record<string, unknown>)[key], `${path}.${key}`);
    }
  };
  visit(root, 'driver');
  return found;
}

const summary = (r: SyncResult) => ({ mode: r.mode, fallbackReason: r.fallbackReason, entries: r.entries });

for (const variant of ['legacy', 'nft'] as const) {
  describe(`iptables-${variant}: the driver keeps no record of the kernel (stand-in nat tables)`, () => {
    it('a driver made anew before every apply writes what a long-lived one writes, each change in part', async () => {
      const steps = iptablesSteps();
      const lived = new FakeIptables();
      const rebuilt = new FakeIptables();
      const one = new Reconciler(new IptablesDriver(variant, { runner: lived, jumpCheckIntervalMs: 0 }));
      const anew = new RebuiltDriver(() => new IptablesDriver(variant, { runner: rebuilt, jumpCheckIntervalMs: 0 }));
      const many = new Reconciler(anew);
      for (const [i, step] of steps.entries()) {
        const full = i === 0;
        const a = await one.sync(step.state, { full });
        const b = await many.sync(step.state, { full });
        expect(summary(b), step.what).to.deep.equal(summary(a));
        expect(b.mode, step.what).to.equal(full ? 'full' : step.partial);
        expect(b.fallbackReason, step.what).to.equal(undefined);
        expect(b.rejected, step.what).to.deep.equal(a.rejected).and.have.length(step.rejected);
        for (const family of FAMILIES) {
          expect(rebuilt.nat(variant, family).save(), `${step.what}: ${family}`).to.equal(
            lived.nat(variant, family).save(),
          );
        }
      }
      expect(anew.made).to.be.greaterThan(steps.length);
      // A full sync verifies: the chains are what was written, nothing to repair.
      const last = steps.at(-1)!.state;
      const verified = await many.sync(last, { full: true });
      expect(verified).to.deep.include({ mode: 'full' });
      expect(verified.repairedElements).to.equal(undefined);
      for (const family of FAMILIES) {
        expect(rebuilt.nat(variant, family).save()).to.equal(lived.nat(variant, family).save());
      }
    });

    it('after a run of partial syncs, nothing reachable from the driver holds an entry', async () => {
      const fake = new FakeIptables();
      const driver = new IptablesDriver(variant, { runner: fake, jumpCheckIntervalMs: 0 });
      const reconciler = new Reconciler(driver);
      let annexes = 0;
      const apply = driver.apply.bind(driver);
      let lastAnnex: unknown;
      driver.apply = async (operations) => {
        const applied = await apply(operations);
        for (const annex of Object.values(applied.annex ?? {})) {
          if (annex === undefined) continue;
          annexes++;
          lastAnnex = annex;
        }
        return applied;
      };
      for (const [i, step] of iptablesSteps().entries()) await reconciler.sync(step.state, { full: i === 0 });
      expect(annexes, 'each apply hands its annexes to the reconciler').to.be.greaterThan(0);
      // The search finds entries where they are kept: in an annex, which the ledger holds.
      expect(reachableEntries({ kept: new Map([['ipv4', lastAnnex]]) })).to.not.deep.equal([]);
      delete (driver as { apply?: unknown }).apply;
      expect(reachableEntries(driver)).to.deep.equal([]);
    });

    it('the jump guard repairs the jumps of a family that holds our entry chains, and leaves one without them alone', async () => {
      const fake = new FakeIptables();
      const reconciler = new Reconciler(new IptablesDriver(variant, { runner: fake, jumpCheckIntervalMs: 0 }));
      await reconciler.sync(iptablesSteps()[0]!.state, { full: true });
      await removeIptablesObjects(variant, 'ipv6', fake);
      // Another writer's chain, first in both families, ACCEPTs what ours would translate.
      const other =
        '*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j ACCEPT\n-I PREROUTING 1 -j KUBE-SERVICES\nCOMMIT\n';
      for (const family of FAMILIES) fake.write(variant, family, other);
      const repaired: Family[] = [];
      const guard = new JumpGuard({
        variant,
        intervalMs: 1000,
        runner: fake,
        exclusive: (work) => work(),
        onRepair: (family) => repaired.push(family),
      });
      const restores = fake.restores(variant, 'ipv6').length;
      await guard.checkAll();
      expect(repaired).to.deep.equal(['ipv4']);
      expect(fake.restores(variant, 'ipv6'), 'nothing tried where our chains are not').to.have.length(restores);
      expect(fake.nat(variant, 'ipv4').rules('PREROUTING')).to.deep.equal(['-j IPVS_PREROUTING', '-j KUBE-SERVICES']);
      expect(fake.nat(variant, 'ipv6').rules('PREROUTING')).to.deep.equal(['-j KUBE-SERVICES']);
    });
  });
}
