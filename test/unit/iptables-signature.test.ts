// When the iptables backend may skip a partial sync: exactly when the rules it would write are
// the ones it wrote last. The model's `changes` (how the entries came about) must not count.

import { expect } from 'chai';
import {
  familySignature,
  sameAsProgrammed,
  type ProgrammedFamily,
} from '../../src/backends/iptables/iptables-backend.js';
import { DesiredStateModel } from '../../src/model/desired-state.js';
import type { DesiredState, NodeInfo, ServiceInfo } from '../../src/model/types.js';
import { CONFIG } from '../support/fixtures.js';

const NODE: NodeInfo = { name: 'node-1', podCIDRs: ['10.244.1.0/24'] };

function service(name: string, ip: string, clusterIP: string): ServiceInfo {
  return {
    namespace: 'default',
    name,
    type: 'LoadBalancer',
    creationTimestamp: '2024-01-01T00:00:00Z',
    clusterIP,
    ports: [{ port: 80, protocol: 'TCP' }],
    ingress: [{ ip }],
  };
}

function programmedFrom(desired: DesiredState): ProgrammedFamily {
  return {
    entries: desired.ipv4.entries,
    ...familySignature(desired.ipv4, desired.masqueradeMark),
    programmed: desired.ipv4.entries.length,
    rejected: [],
  };
}

describe('iptables backend: the "nothing changed" check', () => {
  const a = service('a', '192.0.2.10', '10.96.0.10');
  const b = service('b', '192.0.2.11', '10.96.0.11');

  it('skips the sync after a change once the same state comes again, although `changes` differ', () => {
    const model = new DesiredStateModel(CONFIG);
    model.update([a], NODE);
    const changed = model.update([a, b], NODE);
    const again = model.update([a, b], NODE);
    // The model says how each state came about: after the change, and "nothing" since.
    expect(changed.ipv4.changes?.added).to.have.length(1);
    expect(again.ipv4.changes?.added).to.deep.equal([]);
    // The whole family state serialised (the old signature) differs between the two...
    expect(JSON.stringify([again.ipv4, again.masqueradeMark])).to.not.equal(
      JSON.stringify([changed.ipv4, changed.masqueradeMark]),
    );
    // ...but the rules do not.
    expect(sameAsProgrammed(programmedFrom(changed), again.ipv4, again.masqueradeMark)).to.equal(true);
  });

  it('compares the entries when the model hands out another array with the same content', () => {
    const first = new DesiredStateModel(CONFIG).update([a, b], NODE);
    const second = new DesiredStateModel(CONFIG).update([b, a], NODE);
    expect(second.ipv4.entries).to.not.equal(first.ipv4.entries);
    expect(sameAsProgrammed(programmedFrom(first), second.ipv4, second.masqueradeMark)).to.equal(true);
  });

  it('syncs when the entries, the local pod match or the mark change', () => {
    const model = new DesiredStateModel(CONFIG);
    const before = programmedFrom(model.update([a], NODE));
    const retargeted = model.update([service('a', '192.0.2.10', '10.96.0.99')], NODE);
    expect(sameAsProgrammed(before, retargeted.ipv4, retargeted.masqueradeMark)).to.equal(false);
    const other = new DesiredStateModel(CONFIG);
    const base = programmedFrom(other.update([a], NODE));
    const noPodCidr = other.update([a], { name: 'node-1' });
    expect(sameAsProgrammed(base, noPodCidr.ipv4, noPodCidr.masqueradeMark)).to.equal(false);
    const withNode = other.update([a], NODE);
    expect(sameAsProgrammed(base, withNode.ipv4, 0x8000)).to.equal(false);
    expect(sameAsProgrammed(undefined, withNode.ipv4, withNode.masqueradeMark)).to.equal(false);
  });
});
