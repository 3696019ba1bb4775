// The model against every row of semantics.md.

import { expect } from 'chai';
import { DesiredStateModel, buildDesiredState } from '../../src/model/desired-state.js';
import type { ChangeFeed } from '../../src/model/change-feed.js';
import type { DesiredState, ModelConfig, NodeInfo, ServiceInfo } from '../../src/model/types.js';
import { CONFIG } from '../support/fixtures.js';

const NODE: NodeInfo = { name: 'n1', podCIDRs: ['10.244.1.0/24', 'fd01::/64'] };

function lb(name: string, over: Partial<ServiceInfo> = {}): ServiceInfo {
  return {
    namespace: 'default',
    name,
    type: 'LoadBalancer',
    creationTimestamp: '2024-01-01T00:00:00Z',
    clusterIP: '10.96.0.10',
    ports: [{ port: 80, protocol: 'TCP' }],
    ingress: [{ ip: '192.0.2.10' }],
    ...over,
  };
}

function build(services: ServiceInfo[], config: Partial<ModelConfig> = {}, node: NodeInfo | undefined = NODE) {
  return buildDesiredState(services, node, { ...CONFIG, ...config });
}

function entries(d: DesiredState): string[] {
  return [...d.ipv4.entries, ...d.ipv6.entries].map(
    (e) => `${e.externalIp} ${e.protocol}/${e.port} -> ${e.clusterIp} (${e.service})`,
  );
}

function reasons(d: DesiredState): string[] {
  return d.skips.map((s) => `${s.service}: ${s.reason}`);
}

describe('model: which addresses are translated', () => {
  it('takes LoadBalancer ingress IPs, one entry per port', () => {
    const d = build([
      lb('a', {
        ports: [
          { port: 80, protocol: 'TCP' },
          { port: 53, protocol: 'UDP' },
          { port: 9, protocol: 'SCTP' },
        ],
      }),
    ]);
    expect(entries(d)).to.deep.equal([
      '192.0.2.10 SCTP/9 -> 10.96.0.10 (default/a)',
      '192.0.2.10 TCP/80 -> 10.96.0.10 (default/a)',
      '192.0.2.10 UDP/53 -> 10.96.0.10 (default/a)',
    ]);
    expect(d.skips).to.deep.equal([]);
  });

  it('defaults a port without protocol to TCP', () => {
    expect(entries(build([lb('a', { ports: [{ port: 80 }] })]))).to.deep.equal([
      '192.0.2.10 TCP/80 -> 10.96.0.10 (default/a)',
    ]);
  });

  it('takes ipMode VIP and skips ipMode Proxy with a reason', () => {
    const d = build([
      lb('a', {
        ingress: [
          { ip: '192.0.2.10', ipMode: 'VIP' },
          { ip: '192.0.2.11', ipMode: 'Proxy' },
        ],
      }),
    ]);
    expect(entries(d)).to.deep.equal(['192.0.2.10 TCP/80 -> 10.96.0.10 (default/a)']);
    expect(reasons(d)).to.deep.equal(['default/a: ipModeProxy']);
  });

  it('skips an unknown ipMode rather than guessing', () => {
    const d = build([lb('a', { ingress: [{ ip: '192.0.2.10', ipMode: 'Tunnel' }] })]);
    expect(entries(d)).to.deep.equal([]);
    expect(reasons(d)).to.deep.equal(['default/a: unknownIpMode']);
  });

  it('skips hostname-only ingress entries', () => {
    const d = build([lb('a', { ingress: [{ hostname: 'lb.example.com' }] })]);
    expect(entries(d)).to.deep.equal([]);
    expect(reasons(d)).to.deep.equal(['default/a: hostnameOnly']);
  });

  it('ignores ingress of a Service that is not type LoadBalancer (stale status)', () => {
    expect(entries(build([lb('a', { type: 'NodePort' })]))).to.deep.equal([]);
  });

  it('takes spec.externalIPs of any type with a ClusterIP', () => {
    const d = build([
      lb('c', { type: 'ClusterIP', ingress: undefined, externalIPs: ['198.51.100.7'] }),
      lb('n', { type: 'NodePort', ingress: undefined, externalIPs: ['198.51.100.8'], clusterIP: '10.96.0.11' }),
    ]);
    expect(entries(d)).to.deep.equal([
      '198.51.100.7 TCP/80 -> 10.96.0.10 (default/c)',
      '198.51.100.8 TCP/80 -> 10.96.0.11 (default/n)',
    ]);
  });

  it('skips headless, empty-ClusterIP and ExternalName Services that have external addresses', () => {
    const d = build([
      lb('headless', { clusterIP: 'None', clusterIPs: ['None'] }),
      lb('empty', { clusterIP: '', clusterIPs: undefined }),
      lb('extname', { type: 'ExternalName', clusterIP: undefined, ingress: undefined, externalIPs: ['198.51.100.9'] }),
    ]);
    expect(entries(d)).to.deep.equal([]);
    expect(reasons(d)).to.deep.equal([
      'default/empty: noClusterIP',
      'default/extname: externalName',
      'default/headless: headless',
    ]);
  });

  it('says nothing about Services without external addresses', () => {
    const d = build([
      lb('plain', { type: 'ClusterIP', ingress: undefined }),
      lb('hl', { clusterIP: 'None', ingress: [] }),
    ]);
    expect(d.skips).to.deep.equal([]);
  });

  it('skips an external address whose family has no ClusterIP', () => {
    const d = build([lb('a', { ingress: [{ ip: '192.0.2.10' }, { ip: '2001:db8::10' }] })]);
    expect(entries(d)).to.deep.equal(['192.0.2.10 TCP/80 -> 10.96.0.10 (default/a)']);
    expect(reasons(d)).to.deep.equal(['default/a: familyWithoutClusterIP']);
  });

  it('maps each family to its own ClusterIP (dual-stack), clusterIPs before clusterIP', () => {
    const d = build([
      lb('a', {
        clusterIP: '10.96.0.10',
        clusterIPs: ['fd00::10', '10.96.0.10'],
        ingress: [{ ip: '192.0.2.10' }, { ip: '2001:DB8:0:0::10' }],
      }),
    ]);
    expect(entries(d)).to.deep.equal([
      '192.0.2.10 TCP/80 -> 10.96.0.10 (default/a)',
      '2001:db8::10 TCP/80 -> fd00::10 (default/a)',
    ]);
  });

  it('never trusts the object: unparsable addresses, ports and protocols are skipped with a reason', () => {
    const d = build([
      lb('a', {
        ingress: [{ ip: '192.0.2.300' }, { ip: '192.0.2.10; drop' }, { ip: '::ffff:192.0.2.1' }, { ip: '192.0.2.12' }],
        externalIPs: ['10.0.0.1/32', 'fe80::1%eth0'],
        ports: [
          { port: 0 },
          { port: 70000 },
          { port: 80, protocol: 'ICMP' },
          { port: '80' as unknown as number },
          { port: 443 },
        ],
      }),
    ]);
    expect(entries(d)).to.deep.equal(['192.0.2.12 TCP/443 -> 10.96.0.10 (default/a)']);
    expect(d.skips.map((s) => s.reason).sort()).to.deep.equal([
      'invalidAddress',
      'invalidAddress',
      'invalidAddress',
      'invalidAddress',
      'invalidAddress',
      'invalidPort',
      'invalidPort',
      'invalidPort',
      'unsupportedProtocol',
    ]);
  });

  it('skips a Service whose name could not come from a real API server', () => {
    const d = build([lb('a" comment "x'), lb('ok', { clusterIP: '10.96.0.11', ingress: [{ ip: '192.0.2.11' }] })]);
    expect(entries(d)).to.deep.equal(['192.0.2.11 TCP/80 -> 10.96.0.11 (default/ok)']);
    expect(d.skips.map((s) => s.reason)).to.deep.equal(['invalidName']);
  });

  it('skips an unparsable ClusterIP and keeps the Service out', () => {
    const d = build([lb('a', { clusterIP: 'ten' })]);
    expect(entries(d)).to.deep.equal([]);
    expect(reasons(d)).to.deep.equal(['default/a: invalidAddress']);
  });

  it('--local-traffic-policy-only keeps only externalTrafficPolicy: Local', () => {
    const services = [
      lb('local', { externalTrafficPolicy: 'Local' }),
      lb('cluster', { externalTrafficPolicy: 'Cluster', clusterIP: '10.96.0.11', ingress: [{ ip: '192.0.2.11' }] }),
    ];
    expect(entries(build(services))).to.have.lengthOf(2);
    const d = build(services, { localTrafficPolicyOnly: true });
    expect(entries(d)).to.deep.equal(['192.0.2.10 TCP/80 -> 10.96.0.10 (default/local)']);
    expect(reasons(d)).to.deep.equal(['default/cluster: notLocalTrafficPolicy']);
  });

  it('lists an address given twice (ingress and externalIPs) once', () => {
    const d = build([lb('a', { externalIPs: ['192.0.2.10'] })]);
    expect(entries(d)).to.deep.equal(['192.0.2.10 TCP/80 -> 10.96.0.10 (default/a)']);
  });
});

describe('model: Services sharing an address', () => {
  it('lets two Services share one IP on different ports', () => {
    const d = build([
      lb('web', { ports: [{ port: 80 }] }),
      lb('metrics', { clusterIP: '10.96.0.11', ports: [{ port: 9100 }] }),
    ]);
    expect(entries(d)).to.deep.equal([
      '192.0.2.10 TCP/80 -> 10.96.0.10 (default/web)',
      '192.0.2.10 TCP/9100 -> 10.96.0.11 (default/metrics)',
    ]);
    expect(d.conflicts).to.deep.equal([]);
  });

  it('gives a claimed (ip, protocol, port) to the older Service and reports the loser', () => {
    const older = lb('older', { creationTimestamp: '2024-01-01T00:00:00Z' });
    const newer = lb('newer', { creationTimestamp: '2024-02-01T00:00:00Z', clusterIP: '10.96.0.11' });
    for (const order of [
      [older, newer],
      [newer, older],
    ]) {
      const d = build(order);
      expect(entries(d)).to.deep.equal(['192.0.2.10 TCP/80 -> 10.96.0.10 (default/older)']);
      expect(d.conflicts.map((c) => `${c.winner} > ${c.loser}`)).to.deep.equal(['default/older > default/newer']);
    }
  });

  it('breaks creation-time ties by namespace/name, whatever the event order', () => {
    const a = lb('a', { namespace: 'zeta', clusterIP: '10.96.0.11' });
    const b = lb('b', { namespace: 'alpha', clusterIP: '10.96.0.12' });
    const c = lb('c', { namespace: 'alpha', clusterIP: '10.96.0.13' });
    const results = [
      [a, b, c],
      [c, b, a],
      [b, a, c],
      [c, a, b],
    ].map((order) => build(order));
    for (const d of results) {
      expect(entries(d)).to.deep.equal(['192.0.2.10 TCP/80 -> 10.96.0.12 (alpha/b)']);
      expect(d.conflicts.map((x) => `${x.winner} > ${x.loser}`)).to.deep.equal([
        'alpha/b > alpha/c',
        'alpha/b > zeta/a',
      ]);
    }
  });

  it('sorts a Service without creationTimestamp after every dated one', () => {
    const d = build([lb('undated', { creationTimestamp: undefined }), lb('dated', { clusterIP: '10.96.0.11' })]);
    expect(entries(d)).to.deep.equal(['192.0.2.10 TCP/80 -> 10.96.0.11 (default/dated)']);
  });

  it('orders the entries by address as numbers, not as text', () => {
    const ips = ['255.255.255.254', '10.0.0.10', '9.255.255.255', '10.0.0.9', '1.0.0.1', '128.0.0.0', '10.0.1.0'];
    const d = build(ips.map((ip, i) => lb(`s${i}`, { ingress: [{ ip }] })));
    expect(d.ipv4.entries.map((e) => e.externalIp)).to.deep.equal([
      '1.0.0.1',
      '9.255.255.255',
      '10.0.0.9',
      '10.0.0.10',
      '10.0.1.0',
      '128.0.0.0',
      '255.255.255.254',
    ]);
  });

  it('produces the same state whatever the order of the input', () => {
    const services = Array.from({ length: 40 }, (_, i) =>
      lb(`s${i}`, {
        clusterIP: `10.96.1.${i}`,
        creationTimestamp: `2024-01-${String((i % 5) + 1).padStart(2, '0')}T00:00:00Z`,
        ingress: [{ ip: `192.0.2.${i % 7}` }],
        ports: [{ port: 80 + (i % 3) }],
      }),
    );
    const forward = build(services);
    const backward = build([...services].reverse());
    expect(backward).to.deep.equal(forward);
    expect(forward.conflicts).to.have.lengthOf(40 - 21);
  });
});

describe('model: local pod detection', () => {
  it('NodeCIDR uses the node podCIDRs per family, falling back to podCIDR', () => {
    const d = build([lb('a')]);
    expect(d.ipv4.localPodMatch).to.deep.equal({ kind: 'cidrs', cidrs: ['10.244.1.0/24'] });
    expect(d.ipv6.localPodMatch).to.deep.equal({ kind: 'cidrs', cidrs: ['fd01::/64'] });
    const single = build([lb('a')], {}, { name: 'n1', podCIDR: '10.244.2.0/24' });
    expect(single.ipv4.localPodMatch).to.deep.equal({ kind: 'cidrs', cidrs: ['10.244.2.0/24'] });
    expect(single.ipv6.localPodMatch.kind).to.equal('none');
  });

  it('NodeCIDR without podCIDRs or without the Node says why there is no prerouting match', () => {
    const noCidr = build([lb('a')], {}, { name: 'n1' });
    expect(noCidr.ipv4.localPodMatch).to.deep.equal({
      kind: 'none',
      reason: 'NodeCIDR mode: node n1 has no ipv4 podCIDR',
    });
    const noNode = buildDesiredState([lb('a')], undefined, CONFIG);
    expect(noNode.ipv4.localPodMatch).to.deep.equal({
      kind: 'none',
      reason: 'NodeCIDR mode: the Node object was not found',
    });
    expect(noNode.ipv4.entries, 'output entries are still programmed').to.have.lengthOf(1);
  });

  it('NodeCIDR ignores a malformed podCIDR and clears host bits of a sloppy one', () => {
    const d = build([lb('a')], {}, { name: 'n1', podCIDRs: ['banana', '10.244.1.7/24'] });
    expect(d.ipv4.localPodMatch).to.deep.equal({ kind: 'cidrs', cidrs: ['10.244.1.0/24'] });
  });

  it('ClusterCIDR uses --cluster-cidr per family', () => {
    const d = build([lb('a')], { detectLocalMode: 'ClusterCIDR', clusterCidrs: ['10.244.0.0/16'] });
    expect(d.ipv4.localPodMatch).to.deep.equal({ kind: 'cidrs', cidrs: ['10.244.0.0/16'] });
    expect(d.ipv6.localPodMatch).to.deep.equal({ kind: 'none', reason: 'ClusterCIDR mode: no ipv6 --cluster-cidr' });
  });

  it('BridgeInterface and InterfaceNamePrefix match on the input interface', () => {
    const bridge = build([lb('a')], { detectLocalMode: 'BridgeInterface', podBridgeInterface: 'cni0' });
    expect(bridge.ipv4.localPodMatch).to.deep.equal({ kind: 'interface', name: 'cni0' });
    expect(bridge.ipv6.localPodMatch).to.deep.equal({ kind: 'interface', name: 'cni0' });
    const prefix = build([lb('a')], { detectLocalMode: 'InterfaceNamePrefix', podInterfaceNamePrefix: 'cali' });
    expect(prefix.ipv4.localPodMatch).to.deep.equal({ kind: 'interfacePrefix', prefix: 'cali' });
  });

  it('computes the mark from --masquerade-bit', () => {
    expect(build([]).masqueradeMark).to.equal(0x4000);
    expect(build([], { masqueradeBit: 0 }).masqueradeMark).to.equal(1);
    expect(build([], { masqueradeBit: 31 }).masqueradeMark).to.equal(0x80000000);
  });
});

describe('model: addresses that point at the node', () => {
  const NODE_ADDRESSES: NodeInfo = { ...NODE, addresses: ['192.0.2.50', '2001:db8::50'] };
  const pointing = [
    ['127.0.0.1', 'a loopback address'],
    ['127.8.9.10', 'a loopback address'],
    ['::1', 'a loopback address'],
    ['0.0.0.0', 'an unspecified address'],
    ['::', 'an unspecified address'],
    ['169.254.169.254', 'a link-local address'],
    ['fe80::1', 'a link-local address'],
    ['224.0.0.1', 'a multicast address'],
    ['ff02::1', 'a multicast address'],
    ['255.255.255.255', 'a broadcast address'],
    ['192.0.2.50', "one of the node's own addresses"],
    ['2001:db8::50', "one of the node's own addresses"],
  ] as const;

  for (const source of ['externalIPs', 'ingress'] as const) {
    it(`never translates them, from ${source}`, () => {
      const ips = pointing.map(([ip]) => ip);
      const fields: Partial<ServiceInfo> =
        source === 'externalIPs'
          ? { ingress: [{ ip: '192.0.2.10' }], externalIPs: ips }
          : { ingress: [{ ip: '192.0.2.10' }, ...ips.map((ip) => ({ ip }))] };
      const d = build([lb('a', { ...fields, clusterIPs: ['10.96.0.10', 'fd00::10'] })], {}, NODE_ADDRESSES);
      expect(entries(d)).to.deep.equal(['192.0.2.10 TCP/80 -> 10.96.0.10 (default/a)']);
      const details = d.skips.filter((s) => s.reason === 'pointsAtNode').map((s) => s.detail);
      // Eight one by one, in the order the Service lists them, the rest folded into one.
      expect(details).to.have.members([
        ...pointing.slice(0, 8).map(([ip, what]) => `${ip} is ${what}`),
        '4 more of this reason',
      ]);
      expect(d.skips.reduce((n, s) => n + (s.reason === 'pointsAtNode' ? (s.count ?? 1) : 0), 0)).to.equal(12);
    });
  }

  it('translates an address once it is no longer the node own', () => {
    const svc = lb('a', { ingress: [{ ip: '192.0.2.50' }] });
    expect(entries(build([svc], {}, NODE_ADDRESSES))).to.deep.equal([]);
    expect(entries(build([svc], {}, NODE))).to.deep.equal(['192.0.2.50 TCP/80 -> 10.96.0.10 (default/a)']);
  });
});

describe('model: which external IPs the operator and kube-proxy allow', () => {
  const svc = lb('a', { ingress: [{ ip: '192.0.2.10' }], externalIPs: ['198.51.100.7', '203.0.113.9'] });

  it('takes every spec.externalIPs address by default', () => {
    expect(entries(build([svc]))).to.have.length(3);
  });

  it('takes only those inside --service-external-ip-range; ingress addresses are not concerned', () => {
    const d = build([svc], { externalIpRanges: ['198.51.100.0/24', '2001:db8::/64'] });
    expect(entries(d)).to.deep.equal([
      '192.0.2.10 TCP/80 -> 10.96.0.10 (default/a)',
      '198.51.100.7 TCP/80 -> 10.96.0.10 (default/a)',
    ]);
    expect(d.skips).to.deep.equal([
      { service: 'default/a', reason: 'externalIpNotAllowed', detail: 'external IP 203.0.113.9' },
    ]);
  });

  it("takes none when kube-proxy's AllowServiceExternalIPs gate is off", () => {
    const d = build([svc], { allowServiceExternalIPs: false });
    expect(entries(d)).to.deep.equal(['192.0.2.10 TCP/80 -> 10.96.0.10 (default/a)']);
    expect(reasons(d)).to.deep.equal(['default/a: externalIpsDisabled', 'default/a: externalIpsDisabled']);
  });
});

describe('model: limits', () => {
  const ports = (n: number) => Array.from({ length: n }, (_, i) => ({ port: 1000 + i }));
  const addresses = (n: number, third = 0) => Array.from({ length: n }, (_, i) => ({ ip: `198.51.${third}.${i + 1}` }));

  it('skips a Service over --max-entries-per-service whole, and programs it once a change brings it under', () => {
    const big = lb('big', { ingress: addresses(10), ports: ports(11) });
    const over = build([big, lb('small')], { maxEntriesPerService: 100 });
    expect(entries(over)).to.deep.equal(['192.0.2.10 TCP/80 -> 10.96.0.10 (default/small)']);
    expect(over.skips).to.deep.equal([
      {
        service: 'default/big',
        reason: 'tooManyEntries',
        detail:
          '10 addresses x 11 ports = 110 entries, more than the 100 one Service may ask for (--max-entries-per-service)',
      },
    ]);
    const model = new DesiredStateModel({ ...CONFIG, maxEntriesPerService: 100 });
    expect(model.update([big], NODE).ipv4.entries).to.have.length(0);
    const fitting = model.update([{ ...big, ports: ports(10) }], NODE);
    expect(fitting.ipv4.entries).to.have.length(100);
    expect(fitting.skips).to.deep.equal([]);
  });

  it('counts a port or an address listed twice once', () => {
    const d = build([lb('a', { ingress: [...addresses(2), ...addresses(2)], ports: [...ports(2), ...ports(2)] })], {
      maxEntriesPerService: 4,
    });
    expect(entries(d)).to.have.length(4);
  });

  it('keeps the oldest Services when the total is short, each whole, and lets the others in as room is made', () => {
    const at = (day: number) => `2024-01-0${day}T00:00:00Z`;
    const oldest = lb('oldest', { creationTimestamp: at(1), ingress: addresses(3, 1), ports: ports(2) }); // 6
    const middle = lb('middle', { creationTimestamp: at(2), ingress: addresses(3, 2), ports: ports(2) }); // 6
    const young = lb('young', { creationTimestamp: at(3), ingress: addresses(2, 3), ports: ports(1) }); // 2
    const config = { ...CONFIG, maxEntries: 9 };
    const d = build([young, middle, oldest], config);
    const holders = (s: DesiredState) => [...new Set(s.ipv4.entries.map((e) => e.service))].sort();
    // middle does not fit after oldest; young, smaller, still does.
    expect(holders(d)).to.deep.equal(['default/oldest', 'default/young']);
    expect(d.skips.map((s) => [s.service, s.reason])).to.deep.equal([['default/middle', 'overCapacity']]);

    const model = new DesiredStateModel(config);
    model.update([young, middle, oldest], NODE);
    const after = model.update([young, middle], NODE);
    expect(holders(after)).to.deep.equal(['default/middle', 'default/young']);
    expect(after.skips).to.deep.equal([]);
  });
});

describe('model: addresses that belong to the cluster itself', () => {
  // kube-dns and the API server's Service, as kubeadm creates them; a tenant claims their ClusterIPs.
  const kubeDns = lb('kube-dns', {
    namespace: 'kube-system',
    type: 'ClusterIP',
    clusterIP: '10.96.0.10',
    clusterIPs: ['10.96.0.10', 'fd00:10:96::a'],
    ports: [{ port: 53, protocol: 'UDP' }],
    ingress: undefined,
  });
  const kubernetes = lb('kubernetes', {
    type: 'ClusterIP',
    clusterIP: '10.96.0.1',
    ports: [{ port: 443, protocol: 'TCP' }],
    ingress: undefined,
  });
  const tenant = lb('grabby', {
    namespace: 'tenant',
    creationTimestamp: '2023-01-01T00:00:00Z',
    clusterIP: '10.96.7.7',
    clusterIPs: ['10.96.7.7', 'fd00:10:96::77'],
    ports: [
      { port: 53, protocol: 'UDP' },
      { port: 443, protocol: 'TCP' },
    ],
    externalIPs: ['10.96.0.10', 'fd00:10:96:0:0::a'],
    ingress: [{ ip: '10.96.0.1' }, { ip: '192.0.2.10' }],
  });
  const bystander = lb('bystander', { clusterIP: '10.96.8.8', ingress: [{ ip: '192.0.2.88' }] });
  const TENANT_OWN = [
    '192.0.2.10 TCP/443 -> 10.96.7.7 (tenant/grabby)',
    '192.0.2.10 UDP/53 -> 10.96.7.7 (tenant/grabby)',
  ];
  const TENANT_ALL = [
    '10.96.0.1 TCP/443 -> 10.96.7.7 (tenant/grabby)',
    '10.96.0.1 UDP/53 -> 10.96.7.7 (tenant/grabby)',
    '10.96.0.10 TCP/443 -> 10.96.7.7 (tenant/grabby)',
    '10.96.0.10 UDP/53 -> 10.96.7.7 (tenant/grabby)',
    ...TENANT_OWN,
    'fd00:10:96::a TCP/443 -> fd00:10:96::77 (tenant/grabby)',
    'fd00:10:96::a UDP/53 -> fd00:10:96::77 (tenant/grabby)',
  ];
  const clusterSkips = (d: DesiredState) => d.skips.filter((s) => s.reason === 'clusterAddress').map((s) => s.detail);
  const own = (d: DesiredState) => entries(d).filter((e) => e.endsWith('(tenant/grabby)'));

  it("never translates another Service's ClusterIP, of either family and from either source", () => {
    const d = build([kubeDns, kubernetes, tenant]);
    expect(own(d)).to.deep.equal(TENANT_OWN);
    expect(clusterSkips(d)).to.have.members([
      '10.96.0.1 is the ClusterIP of a Service',
      '10.96.0.10 is the ClusterIP of a Service',
      'fd00:10:96::a is the ClusterIP of a Service',
    ]);
    expect(d.skips.every((s) => s.service === 'tenant/grabby')).to.equal(true);
  });

  it('refuses them whichever Service came first, withdraws the entries when the owner comes later and restores them when it goes', () => {
    const model = new DesiredStateModel(CONFIG);
    // The tenant first: nothing else claims the addresses yet, they are translated.
    expect(own(model.update([tenant, bystander], NODE))).to.deep.equal(TENANT_ALL);
    // kube-dns created later: its ClusterIPs are withdrawn from the tenant on that change.
    let d = model.update([tenant, bystander, kubeDns], NODE);
    expect(own(d)).to.deep.equal(TENANT_ALL.filter((e) => !/^(10\.96\.0\.10|fd00:10:96::a) /.test(e)));
    expect(clusterSkips(d)).to.have.members([
      '10.96.0.10 is the ClusterIP of a Service',
      'fd00:10:96::a is the ClusterIP of a Service',
    ]);
    d = model.update([kubernetes, tenant, bystander, kubeDns], NODE);
    expect(own(d)).to.deep.equal(TENANT_OWN);
    expect(d).to.deep.include({ skips: build([kubeDns, kubernetes, tenant, bystander]).skips });
    // A ClusterIP that goes away frees the address.
    d = model.update([tenant, bystander, kubeDns], NODE);
    expect(own(d)).to.deep.equal(TENANT_ALL.filter((e) => !/^(10\.96\.0\.10|fd00:10:96::a) /.test(e)));
    d = model.update([tenant, bystander], NODE);
    expect(own(d)).to.deep.equal(TENANT_ALL);
    expect(clusterSkips(d)).to.deep.equal([]);

    // The owners first, then the tenant: refused from its first sight.
    const other = new DesiredStateModel(CONFIG);
    other.update([kubeDns, kubernetes], NODE);
    expect(own(other.update([kubeDns, tenant, kubernetes], NODE))).to.deep.equal(TENANT_OWN);
  });

  it('follows an address several Services look up: each withdrawn while it is a ClusterIP, each restored when it stops, whichever leaves first', () => {
    const second = lb('grabby-too', {
      namespace: 'tenant',
      creationTimestamp: '2023-01-02T00:00:00Z',
      clusterIP: '10.96.7.9',
      ports: [{ port: 8053, protocol: 'UDP' }],
      externalIPs: ['10.96.0.10', '10.96.0.10'],
      ingress: undefined,
    });
    const secondOn = (d: DesiredState) =>
      d.ipv4.entries.filter((e) => e.service === 'tenant/grabby-too').map((e) => `${e.externalIp}/${e.port}`);
    const tenantOn = (d: DesiredState, address: string) => own(d).filter((e) => e.startsWith(`${address} `));
    for (const leaving of [tenant, second]) {
      const model = new DesiredStateModel(CONFIG);
      let d = model.update([tenant, second], NODE);
      expect(secondOn(d)).to.deep.equal(['10.96.0.10/8053']);
      expect(tenantOn(d, '10.96.0.10')).to.have.length(2);
      // kube-dns comes: both lose the address, nothing else.
      d = model.update([tenant, second, kubeDns], NODE);
      expect(secondOn(d)).to.deep.equal([]);
      expect(tenantOn(d, '10.96.0.10')).to.deep.equal([]);
      expect(tenantOn(d, '192.0.2.10')).to.have.length(2);
      // One of them leaves while the address is a ClusterIP; kube-dns goes: the other gets it back.
      const staying = leaving === tenant ? second : tenant;
      model.update([staying, kubeDns], NODE);
      d = model.update([staying], NODE);
      expect(clusterSkips(d)).to.deep.equal([]);
      if (staying === second) expect(secondOn(d)).to.deep.equal(['10.96.0.10/8053']);
      else expect(tenantOn(d, '10.96.0.10')).to.have.length(2);
      // And it follows kube-dns again, alone.
      d = model.update([staying, kubeDns], NODE);
      expect(staying === second ? secondOn(d) : tenantOn(d, '10.96.0.10')).to.deep.equal([]);
      d = model.update([staying], NODE);
      expect(staying === second ? secondOn(d) : tenantOn(d, '10.96.0.10')).to.have.length(staying === second ? 1 : 2);
    }
  });

  it('withdraws and restores the same way when the cache says only what changed (the informer)', () => {
    // A cache that tracks its changes, as the informer does: one object replaced, added or removed at a time.
    const history: Array<{ removed: ServiceInfo[]; added: ServiceInfo[] }> = [];
    let current: ServiceInfo[] = [];
    let released = 0;
    const cache: ChangeFeed<ServiceInfo> = {
      list: () => current,
      get cursor() {
        return history.length;
      },
      changesSince: (cursor) =>
        cursor < released
          ? undefined
          : {
              removed: history.slice(cursor).flatMap((c) => c.removed),
              added: history.slice(cursor).flatMap((c) => c.added),
            },
      release: (cursor) => {
        released = Math.max(released, cursor);
      },
    };
    const change = (removed: ServiceInfo[], added: ServiceInfo[]) => {
      history.push({ removed, added });
      current = [...current.filter((svc) => !removed.includes(svc)), ...added];
    };
    const model = new DesiredStateModel(CONFIG);
    change([], [tenant, bystander]);
    expect(own(model.update(cache, NODE))).to.deep.equal(TENANT_ALL);
    change([], [kubeDns, kubernetes]);
    let d = model.update(cache, NODE);
    expect(own(d)).to.deep.equal(TENANT_OWN);
    expect(d).to.deep.include({ skips: build(current).skips });
    change([kubeDns], []);
    d = model.update(cache, NODE);
    expect(own(d)).to.include('10.96.0.10 UDP/53 -> 10.96.7.7 (tenant/grabby)');
    expect(d).to.deep.equal({ ...build(current), ipv4: d.ipv4, ipv6: d.ipv6, generation: d.generation });
    expect(d.ipv4.entries).to.deep.equal(build(current).ipv4.entries);
    expect(released, 'the model released what it read, and no more').to.equal(history.length);
  });

  it('follows a ClusterIP that moves from one object of a Service to the next', () => {
    const model = new DesiredStateModel(CONFIG);
    model.update([kubeDns, tenant], NODE);
    // kube-dns replaced by an object without IPv6 (the cache replaces objects, never edits them).
    const v4Only = { ...kubeDns, clusterIPs: ['10.96.0.10'] };
    const d = model.update([v4Only, tenant], NODE);
    expect(own(d)).to.include('fd00:10:96::a UDP/53 -> fd00:10:96::77 (tenant/grabby)');
    expect(own(d)).to.not.include('10.96.0.10 UDP/53 -> 10.96.7.7 (tenant/grabby)');
    expect(d).to.deep.equal({ ...build([v4Only, tenant]), ipv4: d.ipv4, ipv6: d.ipv6, generation: d.generation });
  });

  it('derives anew only the Services that asked for an address whose answer changed', () => {
    const model = new DesiredStateModel(CONFIG);
    const first = model.update([tenant, bystander], NODE);
    const second = model.update([tenant, bystander, kubeDns], NODE);
    const bystanderEntry = (d: DesiredState) => d.ipv4.entries.find((e) => e.service === 'default/bystander');
    expect(bystanderEntry(second), 'the same entry object: not derived again').to.equal(bystanderEntry(first));
    const changes = second.ipv4.changes!;
    expect(
      [...changes.removed, ...changes.added].every((e) => e.service === 'tenant/grabby'),
      'only the tenant is derived again',
    ).to.equal(true);
    const keys = (list: readonly { externalIp: string; protocol: string; port: number }[]) =>
      list.map((e) => `${e.externalIp} ${e.protocol}/${e.port}`);
    const kept = new Set(keys(changes.added));
    expect(keys(changes.removed).filter((k) => !kept.has(k))).to.have.members([
      '10.96.0.10 TCP/443',
      '10.96.0.10 UDP/53',
    ]);
  });

  it('refuses its own ClusterIP as an external address too', () => {
    const d = build([lb('a', { externalIPs: ['10.96.0.10'] })]);
    expect(entries(d)).to.deep.equal(['192.0.2.10 TCP/80 -> 10.96.0.10 (default/a)']);
    expect(clusterSkips(d)).to.deep.equal(['10.96.0.10 is the ClusterIP of a Service']);
  });

  it('refuses any address inside --service-cluster-ip-range and --node-address-ranges, allocated or not', () => {
    const svc = lb('a', {
      clusterIPs: ['10.96.0.10', 'fd00:10:96::10'],
      externalIPs: ['10.100.0.1', 'fd00:10:96::1:1', '192.168.5.20', '2001:db8:ffff::20', '198.51.100.1'],
    });
    const d = build([svc], {
      serviceCidrs: ['10.96.0.0/12', 'fd00:10:96::/108'],
      nodeAddressRanges: ['192.168.5.0/24', '2001:db8:ffff::/64'],
    });
    expect(entries(d)).to.deep.equal([
      '192.0.2.10 TCP/80 -> 10.96.0.10 (default/a)',
      '198.51.100.1 TCP/80 -> 10.96.0.10 (default/a)',
    ]);
    expect(clusterSkips(d)).to.have.members([
      '10.100.0.1 is inside the Service CIDR 10.96.0.0/12 (--service-cluster-ip-range)',
      'fd00:10:96::1:1 is inside the Service CIDR fd00:10:96::/108 (--service-cluster-ip-range)',
      '192.168.5.20 is inside the node address range 192.168.5.0/24 (--node-address-ranges)',
      '2001:db8:ffff::20 is inside the node address range 2001:db8:ffff::/64 (--node-address-ranges)',
    ]);
    // Without the ranges, the same addresses are translated.
    expect(entries(build([svc]))).to.have.length(6);
  });
});
