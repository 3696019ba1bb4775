// IPv6 rules whose addresses ip6tables-save prints in mixed notation (`-d ::1.2.3.4/128`, as
// inet_ntop writes ::102:304) read back as the rules the controller rendered: a verification
// finds no drift, and a whole write over them (iptables-legacy, which reads our chains' rules
// before it writes) sees that the kernel holds them already. Runs as root inside
// `unshare --net --mount` (test/run.mjs); refuses to run in the machine's own namespace.

import { expect } from 'chai';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import { removeIptablesObjects } from '../../src/backends/iptables/nat-view.js';
import type { IptablesVariant } from '../../src/backends/iptables/variant.js';
import type { Entry, FamilyState } from '../../src/model/types.js';
import { assertIsolatedNetns, sh } from '../../testbed/node-network.js';
import { ipv6Entries } from '../support/fixtures.js';

const VARIANTS: readonly IptablesVariant[] = ['legacy', 'nft'];

/** Addresses inet_ntop prints in mixed notation (::1.2.3.4, ::0.1.0.0, ::255.255.0.1), and others. */
const entries: Entry[] = ipv6Entries([
  ['::102:304', 'TCP', 443, 'fd00:96::1', ['::102:300/120', 'fd00:1::/64']],
  ['::1:0', 'TCP', 443, '::a60:1'],
  ['::ffff:1', 'UDP', 53, '::a60:2', ['::a00:0/104']],
  ['64:ff9b::102:304', 'TCP', 80, '::ffff'],
  ['2001:db8::1:0:0:1', 'UDP', 9000, '::c000:202'],
]);

const state: FamilyState = { entries, localPodMatch: { kind: 'cidrs', cidrs: ['fd01::/64'] } };

function writeWhole(driver: IptablesDriver) {
  return driver.apply([{ kind: 'writeFamily', family: 'ipv6', state, masqueradeMark: 0x4000 }]);
}

for (const variant of VARIANTS) {
  describe(`iptables-${variant}: IPv6 addresses ip6tables-save prints in mixed notation`, function () {
    this.timeout(60_000);
    before(() => assertIsolatedNetns());
    // A driver that wrote runs a jump guard until it is closed: left running, it would put its
    // jumps back into the nat table of the tests after this one.
    const drivers: IptablesDriver[] = [];
    const driver = () => {
      drivers.push(new IptablesDriver(variant));
      return drivers.at(-1)!;
    };
    afterEach(async () => {
      for (const d of drivers.splice(0)) await d.close();
      await removeIptablesObjects(variant, 'ipv6');
    });

    it('read back as the rules written: no drift, and a second whole write has nothing to change', async () => {
      const first = await writeWhole(driver());
      expect(first.rejected?.ipv6, 'every entry programmed').to.deep.equal([]);
      // The kernel's own tool prints them otherwise than the model: the case is real.
      const save = sh(`ip6tables-${variant}-save`, ['-t', 'nat']);
      expect(save).to.include('-d ::1.2.3.4/128');
      expect(save).to.include('-s ::1.2.3.0/120');
      expect(save).to.include('--to-destination ::10.96.0.1');

      const again = driver();
      const second = await writeWhole(again);
      // iptables-legacy reads our chains' rules before a whole write; iptables-nft lists only the
      // entry chains' gotos then, and writes the bucket chains again.
      if (variant === 'legacy') expect(second.unchanged, 'the table held every rule').to.equal(true);
      for (const how of ['between-writes', 'alongside-writes'] as const) {
        const read = await again.readBack(
          'ipv6',
          entries,
          { state: { ...state, entries: [] }, masqueradeMark: 0x4000 },
          how,
        );
        expect(read, how).to.deep.include({ missing: [], foreign: [], shapeDrift: [] });
      }
    });
  });
}
