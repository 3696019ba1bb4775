// DesiredStateModel keeps the desired state between syncs and redoes only what changed: after any
// sequence of changes it must give what buildDesiredState gives for the same input from nothing.

import { expect } from 'chai';
import { DesiredStateModel, buildDesiredState } from '../../src/model/desired-state.js';
import type { DesiredState, Entry, FamilyState, NodeInfo, ServiceInfo } from '../../src/model/types.js';
import { CONFIG, lbService, seededRandom } from '../support/fixtures.js';

const NODE: NodeInfo = { name: 'n1', podCIDRs: ['10.244.1.0/24', 'fd01::/64'] };
/** The same node with addresses that Services of the pools below also claim. */
const NODE_WITH_ADDRESSES: NodeInfo = { ...NODE, addresses: ['198.18.0.1', '198.18.0.2', '2001:db8::3'] };

/**
 * Services drawn from small pools so that they share addresses, collide on keys, repeat
 * ports and carry every kind of skipped value.
 */
function serviceMaker(rnd: () => number, addresses: number) {
  const pick = <T>(values: readonly T[]): T => values[Math.floor(rnd() * values.length)]!;
  const address = () =>
    rnd() < 0.1
      ? pick(['bad', '::ffff:192.0.2.1', '10.0.0.1/32', ''])
      : rnd() < 0.15
        ? // The ClusterIP of another Service (or its own), which comes and goes with that Service.
          pick([`10.96.0.${Math.floor(rnd() * 40)}`, `fd00::${Math.floor(rnd() * 40).toString(16)}`])
        : rnd() < 0.7
          ? `198.18.${Math.floor(rnd() * addresses) >> 8}.${Math.floor(rnd() * addresses) & 255}`
          : `2001:db8::${Math.floor(rnd() * addresses).toString(16)}`;
  let serial = 0;
  return (): ServiceInfo => {
    const i = serial++;
    return {
      namespace: pick(['default', 'shop', 'Bad_Namespace', 'zeta']),
      // Unique names: two objects of one name exist in hand-written files only (first one wins).
      name: `s${i}`,
      creationTimestamp: pick(['2024-01-01T00:00:00Z', '2024-01-02T00:00:00Z', undefined, 'garbage']),
      type: pick(['LoadBalancer', 'LoadBalancer', 'LoadBalancer', 'ClusterIP', 'ExternalName']),
      clusterIP: pick([`10.96.${(i >> 8) & 255}.${i & 255}`, 'None', '', 'ten']),
      clusterIPs: pick([undefined, undefined, [`10.96.${(i >> 8) & 255}.${i & 255}`, `fd00::${i.toString(16)}`]]),
      externalIPs: rnd() < 0.2 ? [address()] : undefined,
      externalTrafficPolicy: pick(['Local', 'Cluster', undefined]),
      ports: Array.from({ length: 1 + Math.floor(rnd() * 2) }, () => ({
        port: pick([80, 443, 443, 0]),
        protocol: pick(['TCP', 'TCP', 'UDP', undefined, 'ICMP']),
      })),
      ingress: [
        { ip: address(), ipMode: pick([undefined, 'VIP', 'Proxy']) },
        ...(rnd() < 0.1 ? [{ hostname: 'lb.example.com' }] : []),
      ],
    };
  };
}

/**
 * The state without the change hints and the generation, which only a model that saw earlier input
 * can give.
 */
function withoutChanges({ generation: _generation, ...d }: DesiredState): DesiredState {
  const family = ({ changes: _changes, ...rest }: FamilyState): FamilyState => rest;
  return { ...d, ipv4: family(d.ipv4), ipv6: family(d.ipv6) };
}

/** Entries as a set of objects, to check a change hint against the lists. */
function applied(since: Entry[], removed: Entry[], added: Entry[]): Set<Entry> {
  const out = new Set(since);
  for (const e of removed) expect(out.delete(e), 'removes an entry that was there').to.equal(true);
  for (const e of added) {
    expect(out, 'adds an entry that was not there').to.not.include(e);
    out.add(e);
  }
  return out;
}

/** Returns how many change hints it checked. */
function check(seed: number, size: number, addresses: number, steps: number, changesPerStep: () => number): number {
  let hints = 0;
  const rnd = seededRandom(seed);
  const makeService = serviceMaker(rnd, addresses);
  const pick = <T>(values: readonly T[]): T => values[Math.floor(rnd() * values.length)]!;
  const config = {
    ...CONFIG,
    localTrafficPolicyOnly: rnd() < 0.3,
    // Limits low enough that Services are over them, and in and out of the total as others change.
    maxEntriesPerService: pick([undefined, 1, 2]),
    maxEntries: pick([undefined, undefined, 4, Math.ceil(size / 4)]),
    externalIpRanges: pick([undefined, ['198.18.0.0/28', '2001:db8::/124']]),
    allowServiceExternalIPs: pick([undefined, false]),
    serviceCidrs: pick([undefined, undefined, ['10.96.0.16/28']]),
    nodeAddressRanges: pick([undefined, undefined, ['198.18.0.0/30', '2001:db8::/126']]),
  };
  let services = Array.from({ length: size }, makeService);
  const model = new DesiredStateModel(config);
  let previous: DesiredState | undefined;
  for (let step = 0; step < steps; step++) {
    const node = rnd() < 0.9 ? (rnd() < 0.8 ? NODE : NODE_WITH_ADDRESSES) : undefined;
    const desired = model.update(services, node);
    expect(withoutChanges(desired), `seed ${seed}, step ${step}`).to.deep.equal(
      withoutChanges(buildDesiredState([...services].reverse(), node, config)),
    );
    for (const family of ['ipv4', 'ipv6'] as const) {
      const changes = desired[family].changes;
      if (!changes) continue;
      expect(changes.since, 'the hint starts from the entries given last').to.equal(previous?.[family].snapshot);
      hints++;
      expect(
        [...applied(changes.since.entries(), changes.removed, changes.added)],
        `seed ${seed}, step ${step}`,
      ).to.have.deep.members([...new Set(desired[family].entries)]);
    }
    previous = desired;
    services = [...services];
    for (let k = changesPerStep(); k > 0; k--) {
      const at = Math.floor(rnd() * services.length);
      const r = rnd();
      if (r < 0.5) services[at] = makeService();
      else if (r < 0.75) services.splice(at, 1);
      else services.push(makeService());
    }
    if (rnd() < 0.1) services.reverse(); // the cache order is not a promise
  }
  return hints;
}

describe('DesiredStateModel', function () {
  // Hundreds of random change sequences, each checked against a state built from nothing: seconds
  // of work that a loaded machine stretches. What is checked is the result, never the time.

  it('after any changes equals the state built from nothing, collisions and skips included', () => {
    let hints = 0;
    for (let seed = 1; seed <= 60; seed++) hints += check(seed, 30, 24, 12, () => 1 + (seed % 4));
    expect(hints, `the change hints were checked (${hints} times)`).to.be.above(60 * 11);
  });

  it('also when many keys change at once (the state is sorted anew)', () => {
    check(101, 3000, 4000, 6, () => 1500);
    check(102, 3000, 400, 8, () => 20);
  });

  it("derives nothing again when only link-local addresses come and go (a pod's veth), and everything when a node address does", () => {
    const model = new DesiredStateModel(CONFIG);
    const services = [lbService(10), lbService(11, { ingress: [{ ip: '172.18.0.1' }] })];
    const base = ['172.18.0.5', 'fd18::5'];
    const first = model.update(services, NODE, base);
    expect(model.rebuilds).to.equal(1);
    for (let pod = 1; pod <= 20; pod++) {
      const veths = Array.from({ length: pod }, (_, i) => `fe80::8c3e:1ff:fe2a:${i.toString(16)}`);
      expect(withoutChanges(model.update(services, NODE, [...base, ...veths, '169.254.1.1']))).to.deep.equal(
        withoutChanges(first),
      );
    }
    expect(model.rebuilds, 'pods started: no rebuild').to.equal(1);
    // An address a Service claims, added to the node: that Service's entry goes.
    const claimed = model.update(services, NODE, [...base, '172.18.0.1']);
    expect(model.rebuilds).to.equal(2);
    expect(claimed.ipv4.entries.map((e) => e.externalIp)).to.not.include('172.18.0.1');
    expect(first.ipv4.entries.map((e) => e.externalIp)).to.include('172.18.0.1');
  });

  it('gives the same state through updateCooperatively, one call after the other', async () => {
    const rnd = seededRandom(7);
    const makeService = serviceMaker(rnd, 300);
    const config = { ...CONFIG, maxEntries: 400 };
    const model = new DesiredStateModel(config);
    let services = Array.from({ length: 2000 }, makeService);
    // Two calls at once are served in turn: the second sees the first's result as its past.
    const first = model.updateCooperatively(services, NODE);
    const later = [...services.slice(0, 1500), ...Array.from({ length: 600 }, makeService)];
    const second = model.updateCooperatively(later, NODE);
    expect(withoutChanges(await first)).to.deep.equal(withoutChanges(buildDesiredState(services, NODE, config)));
    expect(withoutChanges(await second)).to.deep.equal(withoutChanges(buildDesiredState(later, NODE, config)));
    services = later;
    expect(model.update(services, NODE).ipv4.entries).to.equal((await second).ipv4.entries);
  });

  it('numbers its states in the order they are asked for, and any model made later goes on after them', async () => {
    const model = new DesiredStateModel(CONFIG);
    const services = [lbService(1), lbService(2)];
    const g = model.update(services, NODE).generation!;
    expect(g).to.be.a('number');
    // Asked for together, served in turn: numbered as asked.
    const first = model.updateCooperatively(services, NODE);
    const second = model.updateCooperatively([lbService(1)], NODE);
    expect([(await first).generation, (await second).generation]).to.deep.equal([g + 1, g + 2]);
    expect(model.lastGeneration).to.equal(g + 2);
    const replacing = new DesiredStateModel(CONFIG, model.lastGeneration);
    expect(replacing.update(services, NODE).generation).to.equal(g + 3);
    // A model made without `after` (a test's, a tool's) still never gives an older number.
    expect(new DesiredStateModel(CONFIG).update(services, NODE).generation).to.equal(g + 4);
    expect(model.update(services, NODE).generation).to.equal(g + 5);
  });

  it('keeps an unchanged entry as the same object, and unchanged lists as the same arrays', () => {
    const lb = (name: string, ip: string): ServiceInfo => ({
      namespace: 'default',
      name,
      type: 'LoadBalancer',
      clusterIP: '10.96.0.10',
      ports: [{ port: 80 }],
      ingress: [{ ip }],
    });
    const services = [lb('a', '192.0.2.1'), lb('b', '192.0.2.2'), lb('c', '192.0.2.3')];
    const model = new DesiredStateModel(CONFIG);
    const first = model.update(services, NODE);
    expect(model.update([...services], NODE).ipv4.entries).to.equal(first.ipv4.entries);

    const second = model.update([services[0]!, lb('b', '192.0.2.9'), services[2]!], NODE);
    expect(second.ipv4.entries.map((e) => e.externalIp)).to.deep.equal(['192.0.2.1', '192.0.2.3', '192.0.2.9']);
    expect(second.ipv4.entries[0]).to.equal(first.ipv4.entries[0]);
    expect(second.ipv4.entries[1]).to.equal(first.ipv4.entries[2]);
    expect(
      first.ipv4.entries.map((e) => e.externalIp),
      'an earlier result is not changed',
    ).to.deep.equal(['192.0.2.1', '192.0.2.2', '192.0.2.3']);
  });
});
