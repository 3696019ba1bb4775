// The iptables driver keeps no record of the kernel between its applies (the reconciler's ledger
// keeps its annex of each family, src/backends/iptables/annex.ts): on the kernel, both variants,
// a run of partial syncs through a driver made anew before every apply and read leaves the nat
// table exactly as a run through one long-lived driver does, after every step (iptables-save
// compared), each change written in part: bucket chains created and emptied, Services with source
// ranges added, changed and removed, an entry refused and gone, a ClusterIP changed.

import { execFileSync } from 'node:child_process';
import { expect } from 'chai';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import { FAMILIES, type Family } from '../../src/model/types.js';
import { Reconciler } from '../../src/reconciler/reconciler.js';
import type { SyncResult } from '../../src/reconciler/sync-result.js';
import { assertIsolatedNetns } from '../../testbed/node-network.js';
import { RebuiltDriver, iptablesSteps } from '../support/iptables-steps.js';

/** The nat table as `-save` prints it, without its comments and chain counters. */
function natTable(variant: 'legacy' | 'nft', family: Family): string {
  const tool = `${family === 'ipv4' ? 'iptables' : 'ip6tables'}-${variant}-save`;
  return execFileSync(tool, ['-t', 'nat'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] })
    .split('\n')
    .filter((l) => !l.startsWith('#'))
    .map((l) => l.replace(/ \[\d+:\d+\]$/, ''))
    .join('\n');
}

const summary = (r: SyncResult) => ({
  mode: r.mode,
  fallbackReason: r.fallbackReason,
  entries: r.entries,
  rejected: r.rejected,
});

/** The nat tables after each step of the run, through `reconciler`. */
async function run(reconciler: Reconciler, variant: 'legacy' | 'nft') {
  const tables: string[][] = [];
  const results = [];
  for (const [i, step] of iptablesSteps().entries()) {
    const result = await reconciler.sync(step.state, { full: i === 0 });
    expect(result.mode, step.what).to.equal(i === 0 ? 'full' : step.partial);
    expect(result.fallbackReason, step.what).to.equal(undefined);
    expect(result.rejected, step.what).to.have.length(step.rejected);
    results.push(summary(result));
    tables.push(FAMILIES.map((family) => natTable(variant, family)));
  }
  const verified = await reconciler.sync(iptablesSteps().at(-1)!.state, { full: true });
  expect(verified.repairedElements, 'a verification finds nothing to repair').to.equal(undefined);
  return { tables, results };
}

for (const variant of ['legacy', 'nft'] as const) {
  describe(`iptables-${variant}: a driver made anew before every apply (the kernel)`, function () {
    this.timeout(120_000);
    before(() => assertIsolatedNetns());

    it('leaves the nat table as a long-lived driver does, after every partial sync', async () => {
      const one = new Reconciler(new IptablesDriver(variant, { jumpCheckIntervalMs: 0 }));
      const lived = await run(one, variant);
      await one.cleanup();
      await one.close();
      const anew = new RebuiltDriver(() => new IptablesDriver(variant, { jumpCheckIntervalMs: 0 }));
      const many = new Reconciler(anew);
      try {
        const rebuilt = await run(many, variant);
        expect(anew.made).to.be.greaterThan(lived.tables.length);
        expect(rebuilt.results).to.deep.equal(lived.results);
        const steps = iptablesSteps();
        for (const [i, tables] of rebuilt.tables.entries()) {
          expect(tables, steps[i]!.what).to.deep.equal(lived.tables[i]);
        }
        expect(lived.tables.at(-1)!.join('\n')).to.match(/-A IPVS_OUT_SR_/);
      } finally {
        await many.cleanup();
        await many.close();
      }
    });
  });
}
