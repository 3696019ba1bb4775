// loadBalancerSourceRanges (semantics.md, "Source ranges"): which sources of which addresses are
// translated, as kube-proxy's source-ranges firewall lets them through; how the backends write it.

import { expect } from 'chai';
import { DesiredStateModel, buildDesiredState } from '../../src/model/desired-state.js';
import { sourceRangesByFamily } from '../../src/model/service-rules.js';
import { toNodeInfo, toServiceInfo } from '../../src/kube/objects.js';
import type { DesiredState, FamilyState, ModelConfig, NodeInfo, ServiceInfo } from '../../src/model/types.js';
import { staleTuples, type StaleTuple } from '../../src/conntrack/stale-tuples.js';
import { entryDiff } from '../../src/model/entry-diff.js';
import { renderChainRules } from '../../src/backends/iptables/render.js';
import { desiredTable, sourceChainName } from '../../src/backends/nft/render.js';
import { tableText } from '../../src/backends/nft/text.js';
import { CONFIG, lbService, webEntry } from '../support/fixtures.js';
import { changeBetween } from '../support/kernel-change.js';

/** The stale tuples of the change from `previous` to `next`, as the reconciler tells it. */
const stale = (previous: DesiredState | undefined, next: DesiredState): StaleTuple[] =>
  staleTuples(changeBetween(previous, next));

const NODE: NodeInfo = {
  name: 'n1',
  podCIDRs: ['10.244.1.0/24', 'fd01::/64'],
  addresses: ['192.168.50.1'],
  hostIPs: ['192.168.50.1', 'fd50::1'],
};

/** default/web, dual-stack: 192.0.2.10 and 2001:db8::10 to 10.96.0.10 and fd00::10, TCP port 80. */
function lb(over: Partial<ServiceInfo> = {}): ServiceInfo {
  return lbService(10, {
    name: 'web',
    clusterIPs: ['10.96.0.10', 'fd00::10'],
    ingress: [{ ip: '192.0.2.10' }, { ip: '2001:db8::10' }],
    ...over,
  });
}

function build(services: ServiceInfo[], config: Partial<ModelConfig> = {}, node: NodeInfo = NODE): DesiredState {
  return buildDesiredState(services, node, { ...CONFIG, ...config });
}

function ranges(d: DesiredState): Record<string, readonly string[] | undefined> {
  const out: Record<string, readonly string[] | undefined> = {};
  for (const e of [...d.ipv4.entries, ...d.ipv6.entries]) out[`${e.externalIp}/${e.port}`] = e.sourceRanges;
  return out;
}

/** Whether each entry translates its own address as a source (Entry.sourcesFromNode). */
function fromNode(d: DesiredState): Record<string, boolean> {
  const out: Record<string, boolean> = {};
  for (const e of [...d.ipv4.entries, ...d.ipv6.entries]) out[`${e.externalIp}/${e.port}`] = e.sourcesFromNode === true;
  return out;
}

describe('source ranges: the model', () => {
  it('carries the ranges of each family on the LoadBalancer entries of that family, sorted and disjoint', () => {
    const d = build([
      lb({ loadBalancerSourceRanges: ['203.0.113.0/24', ' 10.0.0.0/8 ', '10.1.0.0/16', '2001:db8:1::/48'] }),
    ]);
    expect(ranges(d)).to.deep.equal({
      '192.0.2.10/80': ['10.0.0.0/8', '203.0.113.0/24'],
      '2001:db8::10/80': ['2001:db8:1::/48'],
    });
    expect(d.ipv4.sourceRanged).to.equal(true);
    expect(d.ipv6.sourceRanged).to.equal(true);
  });

  it('leaves a family without any range of its own unfiltered, as kube-proxy does', () => {
    const d = build([lb({ loadBalancerSourceRanges: ['203.0.113.0/24'] })]);
    expect(ranges(d)).to.deep.equal({ '192.0.2.10/80': ['203.0.113.0/24'], '2001:db8::10/80': undefined });
    expect(d.ipv6.sourceRanged).to.equal(undefined);
  });

  it('treats 0.0.0.0/0 as every source, and clears host bits and leading zeros as kube-proxy parses', () => {
    expect(ranges(build([lb({ loadBalancerSourceRanges: ['0.0.0.0/0', '10.0.0.0/8'] })]))['192.0.2.10/80']).to.equal(
      undefined,
    );
    expect(
      sourceRangesByFamily(['010.001.2.3/16']).ranges.ipv4!.map((c) => `${c.address}/${c.prefixLength}`),
    ).to.deep.equal(['10.1.0.0/16']);
  });

  it('ignores invalid ranges with a reason, and a family whose ranges are all invalid is unfiltered', () => {
    const d = build([lb({ loadBalancerSourceRanges: ['not-a-cidr', '10.0.0.0/33', '203.0.113.0/24'] })]);
    expect(ranges(d)['192.0.2.10/80']).to.deep.equal(['203.0.113.0/24']);
    expect(d.skips.map((s) => s.reason)).to.deep.equal(['invalidAddress']);
    expect(d.skips[0]!.detail).to.include('not-a-cidr and 1 more');
    expect(ranges(build([lb({ loadBalancerSourceRanges: ['bogus'] })]))['192.0.2.10/80']).to.equal(undefined);
  });

  it('filters LoadBalancer addresses only, never spec.externalIPs', () => {
    const d = build([lb({ externalIPs: ['198.51.100.7'], loadBalancerSourceRanges: ['203.0.113.0/24'] })]);
    expect(ranges(d)['198.51.100.7/80']).to.equal(undefined);
    expect(ranges(d)['192.0.2.10/80']).to.deep.equal(['203.0.113.0/24']);
  });

  it('lets the LoadBalancer IP itself through as a source when a range holds the node IP (allowFromNode)', () => {
    const d = build([lb({ loadBalancerSourceRanges: ['192.168.50.0/24'] })]);
    expect(ranges(d)['192.0.2.10/80']).to.deep.equal(['192.168.50.0/24']);
    expect(fromNode(d)['192.0.2.10/80']).to.equal(true);
    // The node IP of each family is the Node's first host IP of it: another address does not count.
    const other = build(
      [lb({ loadBalancerSourceRanges: ['192.168.50.0/24'] })],
      {},
      { ...NODE, hostIPs: ['192.168.60.1'] },
    );
    expect(ranges(other)['192.0.2.10/80']).to.deep.equal(['192.168.50.0/24']);
    expect(fromNode(other)['192.0.2.10/80']).to.equal(false);
  });

  it('keeps a range that holds the LoadBalancer IP whole, the IP itself refused when the node IP is in none', () => {
    const d = build([lb({ ingress: [{ ip: '10.1.2.3' }], loadBalancerSourceRanges: ['10.1.2.0/30'] })]);
    // Not split around the address (up to 31 more CIDRs for IPv4, 127 for IPv6): one range.
    expect(ranges(d)['10.1.2.3/80']).to.deep.equal(['10.1.2.0/30']);
    expect(fromNode(d)['10.1.2.3/80']).to.equal(false);
    const v6 = build([lb({ ingress: [{ ip: '2001:db8::10' }], loadBalancerSourceRanges: ['2001:db8::/1'] })]);
    expect(ranges(v6)['2001:db8::10/80']).to.deep.equal(['::/1']);
  });

  it("counts a Service's ranges once against the entry limits, whatever its ports", () => {
    const manyRanges = Array.from({ length: 64 }, (_, i) => `10.${i}.0.0/16`);
    const ports = Array.from({ length: 10 }, (_, i) => ({ port: 1000 + i, protocol: 'TCP' }));
    const svc = lb({ ingress: [{ ip: '192.0.2.10' }], ports, loadBalancerSourceRanges: manyRanges });
    // 10 entries and 64 ranges: 74, over a limit of 73, within one of 74.
    const over = build([svc], { maxEntriesPerService: 73 });
    expect(over.skips.map((s) => s.reason)).to.deep.equal(['tooManyEntries']);
    expect(over.skips[0]!.detail).to.include('1 addresses x 10 ports + 64 source ranges = 74 entries');
    expect(build([svc], { maxEntriesPerService: 74 }).ipv4.entries).to.have.length(10);
  });

  it('skips the ranged addresses of a Service with too many ranges, and those of a backend that cannot filter', () => {
    const many = Array.from({ length: 65 }, (_, i) => `10.${i}.0.0/16`);
    const d = build([lb({ externalIPs: ['198.51.100.7'], loadBalancerSourceRanges: many })]);
    expect(Object.keys(ranges(d))).to.deep.equal(['198.51.100.7/80', '2001:db8::10/80']);
    expect(d.skips.map((s) => s.reason)).to.deep.equal(['tooManySourceRanges']);
    const ebpf = build([lb({ loadBalancerSourceRanges: ['203.0.113.0/24'] })], { sourceRangesSupported: false });
    expect(Object.keys(ranges(ebpf))).to.deep.equal(['2001:db8::10/80']);
    expect(ebpf.skips.map((s) => s.reason)).to.deep.equal(['sourceRangesUnsupported']);
  });

  it('makes a change of ranges a change of the entry: element diff and stale conntrack tuples', () => {
    const model = new DesiredStateModel({ ...CONFIG });
    const udp = { ports: [{ port: 53, protocol: 'UDP' }] };
    const before = model.update([lb({ ...udp, loadBalancerSourceRanges: ['10.0.0.0/8'] })], NODE);
    const after = model.update([lb({ ...udp, loadBalancerSourceRanges: ['10.0.0.0/16'] })], NODE);
    const changes = entryDiff(
      { entries: before.ipv4.entries, objects: new Set(before.ipv4.entries) },
      { entries: after.ipv4.entries },
    );
    expect(changes.removed.map((e) => e.sourceRanges)).to.deep.equal([['10.0.0.0/8']]);
    expect(changes.added.map((e) => e.sourceRanges)).to.deep.equal([['10.0.0.0/16']]);
    expect(stale(before, after).filter((t) => t.family === 'ipv4')).to.deep.equal([
      {
        family: 'ipv4',
        externalIp: '192.0.2.10',
        protocol: 'UDP',
        port: 53,
        untranslatedOnly: false,
        why: 'retargeted',
      },
    ]);
    // The family's shape says whether any entry is ranged, as entries come and go.
    expect(model.update([lb(udp)], NODE).ipv4.sourceRanged).to.equal(undefined);
  });

  it('reads the ranges and the host IPs from API objects', () => {
    const svc = toServiceInfo({
      metadata: { name: 'a', namespace: 'b' },
      spec: { loadBalancerSourceRanges: ['10.0.0.0/8'] },
    });
    expect(svc!.loadBalancerSourceRanges).to.deep.equal(['10.0.0.0/8']);
    const node = toNodeInfo({
      metadata: { name: 'n' },
      status: {
        addresses: [
          { type: 'ExternalIP', address: '203.0.113.1' },
          { type: 'Hostname', address: 'n' },
          { type: 'InternalIP', address: '192.168.50.1' },
        ],
      },
    });
    expect(node!.hostIPs).to.deep.equal(['192.168.50.1', '203.0.113.1']);
  });
});

describe('source ranges: the ranged entries per Service, as the desired state says them', () => {
  it("counts each Service's ranged entries, the same map until one comes or goes", () => {
    const model = new DesiredStateModel({ ...CONFIG });
    const ranged = (name: string, ports: number[], ip: string) =>
      lb({
        name,
        clusterIPs: [`10.96.0.${ports[0]! % 250}`],
        clusterIP: `10.96.0.${ports[0]! % 250}`,
        ingress: [{ ip }],
        ports: ports.map((port) => ({ port, protocol: 'TCP' })),
        loadBalancerSourceRanges: ['10.0.0.0/8'],
      });
    const plain = lb({
      name: 'plain',
      ingress: [{ ip: '192.0.2.50' }],
      clusterIPs: ['10.96.0.50'],
      clusterIP: '10.96.0.50',
    });
    const first = model.update([ranged('a', [80, 81], '192.0.2.1'), ranged('b', [90], '192.0.2.2'), plain], NODE);
    expect(first.ipv4.rangedByService).to.deep.equal(
      new Map([
        ['default/a', 2],
        ['default/b', 1],
      ]),
    );
    expect(first.ipv6.rangedByService, 'no ranged entry: absent').to.equal(undefined);
    // A plain Service changes: the same map.
    const second = model.update(
      [
        ranged('a', [80, 81], '192.0.2.1'),
        ranged('b', [90], '192.0.2.2'),
        { ...plain, ports: [{ port: 8080, protocol: 'TCP' }] },
      ],
      NODE,
    );
    expect(second.ipv4.rangedByService).to.equal(first.ipv4.rangedByService);
    // One of a's ports goes, b goes: a new map, the one handed out before unchanged.
    const third = model.update([ranged('a', [80], '192.0.2.1'), plain], NODE);
    expect(third.ipv4.rangedByService).to.deep.equal(new Map([['default/a', 1]]));
    expect(first.ipv4.rangedByService).to.deep.equal(
      new Map([
        ['default/a', 2],
        ['default/b', 1],
      ]),
    );
  });
});

describe('source ranges: what the backends write', () => {
  const entry = webEntry;

  it("iptables: one rule per entry and hook going to the Service's chain, which holds each range once", () => {
    const { rules } = renderChainRules(
      'ipv4',
      {
        entries: [
          entry({ sourceRanges: ['10.0.0.0/8', '10.244.1.2/32', '203.0.113.0/24'] }),
          entry({ port: 443, sourceRanges: ['10.0.0.0/8', '10.244.1.2/32', '203.0.113.0/24'] }),
        ],
        localPodMatch: { kind: 'cidrs', cidrs: ['10.244.1.0/24'] },
      },
      0x4000,
      false,
    );
    const heads = [...new Set(rules.map((r) => r.replace(/ -p tcp .* -g /, ' -g ').replace(/ -m comment .*/, '')))];
    expect(heads).to.deep.equal([
      // The pod match in the bucket, the range in the Service's chain: both hold.
      '-A IPVS_PREROUTING_10 -s 10.244.1.0/24 -d 192.0.2.10/32 -g IPVS_PRE_SR_QKZ232OQBTIWIKSN',
      '-A IPVS_OUTPUT_10 -d 192.0.2.10/32 -g IPVS_OUT_SR_QKZ232OQBTIWIKSN',
      // 203.0.113.0/24 holds no pod: no prerouting rule.
      '-A IPVS_PRE_SR_QKZ232OQBTIWIKSN -s 10.0.0.0/8',
      '-A IPVS_PRE_SR_QKZ232OQBTIWIKSN -s 10.244.1.2/32',
      '-A IPVS_OUT_SR_QKZ232OQBTIWIKSN -s 10.0.0.0/8',
      '-A IPVS_OUT_SR_QKZ232OQBTIWIKSN -s 10.244.1.2/32',
      '-A IPVS_OUT_SR_QKZ232OQBTIWIKSN -s 203.0.113.0/24',
    ]);
    // Two entries, three ranges: 2 x 2 bucket rules, 2 + 3 x 2 in the Service's chains.
    expect(rules).to.have.length(4 + 2 + 6);
    const byInterface = renderChainRules(
      'ipv4',
      {
        entries: [entry({ sourceRanges: ['10.0.0.0/8'] })],
        localPodMatch: { kind: 'interfacePrefix', prefix: 'veth' },
      },
      0x4000,
      false,
    );
    expect(byInterface.rules[0]).to.match(
      /^-A IPVS_PREROUTING_10 -d 192\.0\.2\.10\/32 -i veth\+ -p tcp .* -g IPVS_PRE_SR_/,
    );
    expect(byInterface.rules).to.include(
      '-A IPVS_PRE_SR_QKZ232OQBTIWIKSN -s 10.0.0.0/8 -m comment --comment "default/web" -j DNAT --to-destination 10.96.0.10',
    );
  });

  it('nft: one chain per ranged Service holding its ranges once; each ranged entry an element that jumps to it', () => {
    const ports = [80, 443, 8080];
    const state: FamilyState = {
      entries: [
        ...ports.map((port) => entry({ port, sourceRanges: ['10.0.0.0/8', '192.0.2.0/24'] })),
        entry({ externalIp: '192.0.2.11', service: 'default/open' }),
      ],
      localPodMatch: { kind: 'cidrs', cidrs: ['10.244.1.0/24'] },
      sourceRanged: true,
    };
    const t = desiredTable('ipv4', state, 0x4000);
    const text = tableText(t);
    const chain = sourceChainName('default/web');
    for (const port of ports) expect(text).to.include(`192.0.2.10 . tcp . ${port} : jump ${chain}`);
    expect(text).to.include(`192.0.2.10 . tcp . 80 . 192.0.2.10`);
    expect(text).not.to.include('192.0.2.11 . tcp . 80 :  jump');
    // The ranges once, whatever the ports; the LoadBalancer IP itself refused (no allowFromNode).
    expect(text).to.include(
      `\tchain ${chain} {\n\t\tip daddr . meta l4proto . th dport . ip saddr @source-range-own-addresses accept\n\t\tip saddr { 10.0.0.0/8, 192.0.2.0/24 } return\n\t\taccept\n\t}`,
    );
    expect(text.match(/10\.0\.0\.0\/8/g)).to.have.length(1);
    // Each base chain asks the check map first.
    expect(text).to.include(
      '\t\tip daddr . meta l4proto . th dport vmap @source-range-checks\n\t\tip daddr . meta l4proto . th dport @external-ip-to-cluster-ip fib saddr type local',
    );
    const fromNodeToo = tableText(
      desiredTable(
        'ipv4',
        { ...state, entries: [entry({ sourceRanges: ['10.0.0.0/8'], sourcesFromNode: true })] },
        0x4000,
      ),
    );
    expect(fromNodeToo).to.include('@source-range-own-addresses return');
    // Objects: a chain per ranged Service, an element per ranged entry.
    expect(t.sourceRanges.chains.map((c) => c.name)).to.deep.equal([chain]);
    expect(t.sourceRanges.checks.elements).to.have.length(3);
    expect(t.sourceRanges.rules).to.have.length(3);
  });
});
