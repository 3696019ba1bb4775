// What the iptables backend writes for a partial sync: the entries that went and came since the
// state it wrote last, whether the model says how they came about or hands out another array. A
// change of the local pod match or the mark is not a partial write: every rule depends on them.

import { expect } from 'chai';
import { entryChanges, familyRest } from '../../src/backends/iptables/iptables-backend.js';
import { DesiredStateModel } from '../../src/model/desired-state.js';
import type { NodeInfo, ServiceInfo } from '../../src/model/types.js';
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

describe('iptables backend: what a partial sync writes', () => {
  const a = service('a', '192.0.2.10', '10.96.0.10');
  const b = service('b', '192.0.2.11', '10.96.0.11');

  it('nothing once the same state comes again, although the model says it came another way', () => {
    const model = new DesiredStateModel(CONFIG);
    model.update([a], NODE);
    const changed = model.update([a, b], NODE);
    const again = model.update([a, b], NODE);
    expect(changed.ipv4.changes?.added).to.have.length(1);
    expect(entryChanges(changed.ipv4.entries, again.ipv4)).to.deep.equal({ removed: [], added: [] });
  });

  it("the model's own account when it starts from what was written", () => {
    const model = new DesiredStateModel(CONFIG);
    const first = model.update([a], NODE);
    const second = model.update([a, b], NODE);
    const changes = entryChanges(first.ipv4.entries, second.ipv4);
    expect(changes.removed).to.deep.equal([]);
    expect(changes.added.map((e) => e.externalIp)).to.deep.equal(['192.0.2.11']);
    expect(changes.added).to.equal(second.ipv4.changes?.added);
  });

  it('compares the lists when the model hands out an array it did not derive from the written one', () => {
    const first = new DesiredStateModel(CONFIG).update([a, b], NODE);
    const same = new DesiredStateModel(CONFIG).update([b, a], NODE);
    expect(same.ipv4.entries).to.not.equal(first.ipv4.entries);
    expect(entryChanges(first.ipv4.entries, same.ipv4)).to.deep.equal({ removed: [], added: [] });
    const retargeted = new DesiredStateModel(CONFIG).update([service('a', '192.0.2.10', '10.96.0.99'), b], NODE);
    const changes = entryChanges(first.ipv4.entries, retargeted.ipv4);
    expect(changes.removed.map((e) => e.clusterIp)).to.deep.equal(['10.96.0.10']);
    expect(changes.added.map((e) => e.clusterIp)).to.deep.equal(['10.96.0.99']);
  });

  it('the local pod match and the mark are what every rule depends on besides the entries', () => {
    const model = new DesiredStateModel(CONFIG);
    const withNode = model.update([a], NODE);
    const noPodCidr = model.update([a], { name: 'node-1' });
    expect(familyRest(noPodCidr.ipv4, noPodCidr.masqueradeMark)).to.not.equal(
      familyRest(withNode.ipv4, withNode.masqueradeMark),
    );
    expect(familyRest(withNode.ipv4, 0x8000)).to.not.equal(familyRest(withNode.ipv4, withNode.masqueradeMark));
    expect(familyRest(withNode.ipv4, withNode.masqueradeMark)).to.equal(
      familyRest(model.update([a, b], NODE).ipv4, withNode.masqueradeMark),
    );
  });
});
