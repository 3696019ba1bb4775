// Which (family, external IP, protocol, port) tuples lose their conntrack entries for which
// change of the programmed state (semantics.md, "Connection tracking"). Pure.

import { expect } from 'chai';
import { staleTuples, type StaleTuple } from '../../src/conntrack/stale-tuples.js';
import { DesiredStateModel, buildDesiredState } from '../../src/model/desired-state.js';
import type { DesiredState, NodeInfo, ServiceInfo } from '../../src/model/types.js';
import { CONFIG } from '../support/fixtures.js';
import { changeBetween } from '../support/kernel-change.js';

/** The stale tuples of the change from `previous` to `next`, as the reconciler tells it. */
const stale = (previous: DesiredState | undefined, next: DesiredState): StaleTuple[] =>
  staleTuples(changeBetween(previous, next));

const NODE: NodeInfo = { name: 'node-1', podCIDRs: ['10.244.1.0/24', 'fd01::/64'] };

function service(overrides: Partial<ServiceInfo> = {}): ServiceInfo {
  return {
    namespace: 'default',
    name: 'dns',
    type: 'LoadBalancer',
    creationTimestamp: '2024-01-01T00:00:00Z',
    clusterIP: '10.96.0.10',
    clusterIPs: ['10.96.0.10', 'fd00::10'],
    ports: [
      { port: 53, protocol: 'UDP' },
      { port: 53, protocol: 'TCP' },
      { port: 9, protocol: 'SCTP' },
    ],
    ingress: [{ ip: '192.0.2.10' }, { ip: '2001:db8::10' }],
    ...overrides,
  };
}

const state = (services: ServiceInfo[], node: NodeInfo | undefined = NODE): DesiredState =>
  buildDesiredState(services, node, CONFIG);

/** `family ip proto/port why` lines, sorted, for readable expectations. */
function show(tuples: StaleTuple[]): string[] {
  return tuples
    .map(
      (t) =>
        `${t.family} ${t.externalIp} ${t.protocol}/${t.port} ${t.why}${t.untranslatedOnly ? ' (untranslated only)' : ''}`,
    )
    .sort();
}

const ALL_UDP_SCTP = (why: string) => [
  `ipv4 192.0.2.10 SCTP/9 ${why}`,
  `ipv4 192.0.2.10 UDP/53 ${why}`,
  `ipv6 2001:db8::10 SCTP/9 ${why}`,
  `ipv6 2001:db8::10 UDP/53 ${why}`,
];

describe('stale conntrack tuples', () => {
  it('flushes nothing when the programmed translations are the same', () => {
    expect(stale(state([service()]), state([service()]))).to.deep.equal([]);
  });

  it('flushes the UDP and SCTP tuples of a Service recreated with another ClusterIP, never TCP', () => {
    const recreated = service({ clusterIP: '10.96.0.99', clusterIPs: ['10.96.0.99', 'fd00::10'] });
    expect(show(stale(state([service()]), state([recreated])))).to.deep.equal([
      'ipv4 192.0.2.10 SCTP/9 retargeted',
      'ipv4 192.0.2.10 UDP/53 retargeted',
    ]);
  });

  it('flushes every UDP and SCTP tuple of a deleted Service', () => {
    expect(show(stale(state([service()]), state([])))).to.deep.equal(ALL_UDP_SCTP('removed'));
  });

  it('flushes a tuple whose ingress turns to ipMode Proxy', () => {
    const proxied = service({ ingress: [{ ip: '192.0.2.10', ipMode: 'Proxy' }, { ip: '2001:db8::10' }] });
    expect(show(stale(state([service()]), state([proxied])))).to.deep.equal([
      'ipv4 192.0.2.10 SCTP/9 removed',
      'ipv4 192.0.2.10 UDP/53 removed',
    ]);
  });

  it('flushes tuples whose translation appears (their flows went through untranslated)', () => {
    expect(show(stale(state([]), state([service()])))).to.deep.equal(ALL_UDP_SCTP('appeared'));
  });

  it('flushes only the lost port when one port of a Service goes', () => {
    const fewer = service({
      ports: [
        { port: 53, protocol: 'TCP' },
        { port: 9, protocol: 'SCTP' },
      ],
    });
    expect(show(stale(state([service()]), state([fewer])))).to.deep.equal([
      'ipv4 192.0.2.10 UDP/53 removed',
      'ipv6 2001:db8::10 UDP/53 removed',
    ]);
  });

  it('flushes a tuple when a conflict is won by another Service, and nothing for the loser', () => {
    const older = service({
      name: 'older',
      creationTimestamp: '2023-01-01T00:00:00Z',
      clusterIP: '10.96.0.20',
      clusterIPs: ['10.96.0.20'],
    });
    const tuples = show(stale(state([service()]), state([service(), older])));
    expect(tuples).to.deep.equal(['ipv4 192.0.2.10 SCTP/9 retargeted', 'ipv4 192.0.2.10 UDP/53 retargeted']);
    const loserArrives = service({
      name: 'younger',
      creationTimestamp: '2025-01-01T00:00:00Z',
      clusterIP: '10.96.0.30',
      clusterIPs: ['10.96.0.30'],
    });
    expect(stale(state([service()]), state([service(), loserArrives]))).to.deep.equal([]);
  });

  it('flushes nothing when only the owning name changes and the ClusterIP stays', () => {
    expect(stale(state([service()]), state([service({ name: 'renamed' })]))).to.deep.equal([]);
  });

  it('flushes every tuple of a family whose local pod match changes (pod flows change side)', () => {
    const tuples = show(stale(state([service()], { name: 'node-1' }), state([service()])));
    expect(tuples).to.deep.equal(ALL_UDP_SCTP('local pod match changed'));
  });

  it('on the first sync, flushes only untranslated entries of every UDP and SCTP tuple', () => {
    expect(show(stale(undefined, state([service()])))).to.deep.equal(ALL_UDP_SCTP('first sync (untranslated only)'));
  });

  it('flushes everything that was programmed when the rules are removed (an empty state)', () => {
    expect(show(stale(state([service()]), state([], undefined)))).to.deep.equal(ALL_UDP_SCTP('removed'));
  });

  it("reads the model's changes and agrees with comparing the lists", () => {
    const model = new DesiredStateModel(CONFIG);
    const others = Array.from({ length: 50 }, (_, i) =>
      service({
        name: `svc-${i}`,
        clusterIP: `10.96.1.${i}`,
        clusterIPs: [`10.96.1.${i}`],
        ingress: [{ ip: `192.0.2.${100 + i}` }],
      }),
    );
    const first = model.update([service(), ...others], NODE);
    const recreated = service({ clusterIP: '10.96.0.99', clusterIPs: ['10.96.0.99'] });
    const second = model.update([recreated, ...others.slice(1)], NODE);
    expect(second.ipv4.changes?.since).to.equal(first.ipv4.snapshot);
    const viaChanges = show(stale(first, second));
    const viaLists = show(
      stale(first, {
        ...second,
        ipv4: { ...second.ipv4, changes: undefined },
        ipv6: { ...second.ipv6, changes: undefined },
      }),
    );
    expect(viaChanges).to.deep.equal(viaLists);
    expect(viaChanges).to.deep.equal([
      'ipv4 192.0.2.10 SCTP/9 retargeted',
      'ipv4 192.0.2.10 UDP/53 retargeted',
      'ipv4 192.0.2.100 SCTP/9 removed',
      'ipv4 192.0.2.100 UDP/53 removed',
      'ipv6 2001:db8::10 SCTP/9 removed',
      'ipv6 2001:db8::10 UDP/53 removed',
    ]);
    // A later state with the same entries (the model hands out the same array) flushes nothing.
    expect(stale(second, model.update([recreated, ...others.slice(1)], NODE))).to.deep.equal([]);
  });
});
