// The model against every row of semantics.md.

import assert from 'node:assert/strict';
import { buildDesiredState } from '../../src/model/desired-state.js';
import type { DesiredState, ModelConfig, NodeInfo, ServiceInfo } from '../../src/model/types.js';

const CONFIG: ModelConfig = {
  detectLocalMode: 'NodeCIDR',
  clusterCidrs: [],
  masqueradeBit: 14,
  localTrafficPolicyOnly: false,
};
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
    assert.deepEqual(entries(d), [
      '192.0.2.10 SCTP/9 -> 10.96.0.10 (default/a)',
      '192.0.2.10 TCP/80 -> 10.96.0.10 (default/a)',
      '192.0.2.10 UDP/53 -> 10.96.0.10 (default/a)',
    ]);
    assert.deepEqual(d.skips, []);
  });

  it('defaults a port without protocol to TCP', () => {
    assert.deepEqual(entries(build([lb('a', { ports: [{ port: 80 }] })])), [
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
    assert.deepEqual(entries(d), ['192.0.2.10 TCP/80 -> 10.96.0.10 (default/a)']);
    assert.deepEqual(reasons(d), ['default/a: ipModeProxy']);
  });

  it('skips an unknown ipMode rather than guessing', () => {
    const d = build([lb('a', { ingress: [{ ip: '192.0.2.10', ipMode: 'Tunnel' }] })]);
    assert.deepEqual(entries(d), []);
    assert.deepEqual(reasons(d), ['default/a: unknownIpMode']);
  });

  it('skips hostname-only ingress entries', () => {
    const d = build([lb('a', { ingress: [{ hostname: 'lb.example.com' }] })]);
    assert.deepEqual(entries(d), []);
    assert.deepEqual(reasons(d), ['default/a: hostnameOnly']);
  });

  it('ignores ingress of a Service that is not type LoadBalancer (stale status)', () => {
    assert.deepEqual(entries(build([lb('a', { type: 'NodePort' })])), []);
  });

  it('takes spec.externalIPs of any type with a ClusterIP', () => {
    const d = build([
      lb('c', { type: 'ClusterIP', ingress: undefined, externalIPs: ['198.51.100.7'] }),
      lb('n', { type: 'NodePort', ingress: undefined, externalIPs: ['198.51.100.8'], clusterIP: '10.96.0.11' }),
    ]);
    assert.deepEqual(entries(d), [
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
    assert.deepEqual(entries(d), []);
    assert.deepEqual(reasons(d), [
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
    assert.deepEqual(d.skips, []);
  });

  it('skips an external address whose family has no ClusterIP', () => {
    const d = build([lb('a', { ingress: [{ ip: '192.0.2.10' }, { ip: '2001:db8::10' }] })]);
    assert.deepEqual(entries(d), ['192.0.2.10 TCP/80 -> 10.96.0.10 (default/a)']);
    assert.deepEqual(reasons(d), ['default/a: familyWithoutClusterIP']);
  });

  it('maps each family to its own ClusterIP (dual-stack), clusterIPs before clusterIP', () => {
    const d = build([
      lb('a', {
        clusterIP: '10.96.0.10',
        clusterIPs: ['fd00::10', '10.96.0.10'],
        ingress: [{ ip: '192.0.2.10' }, { ip: '2001:DB8:0:0::10' }],
      }),
    ]);
    assert.deepEqual(entries(d), [
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
    assert.deepEqual(entries(d), ['192.0.2.12 TCP/443 -> 10.96.0.10 (default/a)']);
    assert.deepEqual(d.skips.map((s) => s.reason).sort(), [
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
    assert.deepEqual(entries(d), ['192.0.2.11 TCP/80 -> 10.96.0.11 (default/ok)']);
    assert.deepEqual(
      d.skips.map((s) => s.reason),
      ['invalidName'],
    );
  });

  it('skips an unparsable ClusterIP and keeps the Service out', () => {
    const d = build([lb('a', { clusterIP: 'ten' })]);
    assert.deepEqual(entries(d), []);
    assert.deepEqual(reasons(d), ['default/a: invalidAddress']);
  });

  it('--local-traffic-policy-only keeps only externalTrafficPolicy: Local', () => {
    const services = [
      lb('local', { externalTrafficPolicy: 'Local' }),
      lb('cluster', { externalTrafficPolicy: 'Cluster', clusterIP: '10.96.0.11', ingress: [{ ip: '192.0.2.11' }] }),
    ];
    assert.equal(entries(build(services)).length, 2);
    const d = build(services, { localTrafficPolicyOnly: true });
    assert.deepEqual(entries(d), ['192.0.2.10 TCP/80 -> 10.96.0.10 (default/local)']);
    assert.deepEqual(reasons(d), ['default/cluster: notLocalTrafficPolicy']);
  });

  it('lists an address given twice (ingress and externalIPs) once', () => {
    const d = build([lb('a', { externalIPs: ['192.0.2.10'] })]);
    assert.deepEqual(entries(d), ['192.0.2.10 TCP/80 -> 10.96.0.10 (default/a)']);
  });
});

describe('model: Services sharing an address', () => {
  it('lets two Services share one IP on different ports', () => {
    const d = build([
      lb('web', { ports: [{ port: 80 }] }),
      lb('metrics', { clusterIP: '10.96.0.11', ports: [{ port: 9100 }] }),
    ]);
    assert.deepEqual(entries(d), [
      '192.0.2.10 TCP/80 -> 10.96.0.10 (default/web)',
      '192.0.2.10 TCP/9100 -> 10.96.0.11 (default/metrics)',
    ]);
    assert.deepEqual(d.conflicts, []);
  });

  it('gives a claimed (ip, protocol, port) to the older Service and reports the loser', () => {
    const older = lb('older', { creationTimestamp: '2024-01-01T00:00:00Z' });
    const newer = lb('newer', { creationTimestamp: '2024-02-01T00:00:00Z', clusterIP: '10.96.0.11' });
    for (const order of [
      [older, newer],
      [newer, older],
    ]) {
      const d = build(order);
      assert.deepEqual(entries(d), ['192.0.2.10 TCP/80 -> 10.96.0.10 (default/older)']);
      assert.deepEqual(
        d.conflicts.map((c) => `${c.winner} > ${c.loser}`),
        ['default/older > default/newer'],
      );
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
      assert.deepEqual(entries(d), ['192.0.2.10 TCP/80 -> 10.96.0.12 (alpha/b)']);
      assert.deepEqual(
        d.conflicts.map((x) => `${x.winner} > ${x.loser}`),
        ['alpha/b > alpha/c', 'alpha/b > zeta/a'],
      );
    }
  });

  it('sorts a Service without creationTimestamp after every dated one', () => {
    const d = build([lb('undated', { creationTimestamp: undefined }), lb('dated', { clusterIP: '10.96.0.11' })]);
    assert.deepEqual(entries(d), ['192.0.2.10 TCP/80 -> 10.96.0.11 (default/dated)']);
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
    assert.deepEqual(backward, forward);
    assert.equal(forward.conflicts.length, 40 - 21);
  });
});

describe('model: local pod detection', () => {
  it('NodeCIDR uses the node podCIDRs per family, falling back to podCIDR', () => {
    const d = build([lb('a')]);
    assert.deepEqual(d.ipv4.localPodMatch, { kind: 'cidrs', cidrs: ['10.244.1.0/24'] });
    assert.deepEqual(d.ipv6.localPodMatch, { kind: 'cidrs', cidrs: ['fd01::/64'] });
    const single = build([lb('a')], {}, { name: 'n1', podCIDR: '10.244.2.0/24' });
    assert.deepEqual(single.ipv4.localPodMatch, { kind: 'cidrs', cidrs: ['10.244.2.0/24'] });
    assert.equal(single.ipv6.localPodMatch.kind, 'none');
  });

  it('NodeCIDR without podCIDRs or without the Node says why there is no prerouting match', () => {
    const noCidr = build([lb('a')], {}, { name: 'n1' });
    assert.deepEqual(noCidr.ipv4.localPodMatch, { kind: 'none', reason: 'NodeCIDR mode: node n1 has no ipv4 podCIDR' });
    const noNode = buildDesiredState([lb('a')], undefined, CONFIG);
    assert.deepEqual(noNode.ipv4.localPodMatch, {
      kind: 'none',
      reason: 'NodeCIDR mode: the Node object was not found',
    });
    assert.equal(noNode.ipv4.entries.length, 1, 'output entries are still programmed');
  });

  it('NodeCIDR ignores a malformed podCIDR and clears host bits of a sloppy one', () => {
    const d = build([lb('a')], {}, { name: 'n1', podCIDRs: ['banana', '10.244.1.7/24'] });
    assert.deepEqual(d.ipv4.localPodMatch, { kind: 'cidrs', cidrs: ['10.244.1.0/24'] });
  });

  it('ClusterCIDR uses --cluster-cidr per family', () => {
    const d = build([lb('a')], { detectLocalMode: 'ClusterCIDR', clusterCidrs: ['10.244.0.0/16'] });
    assert.deepEqual(d.ipv4.localPodMatch, { kind: 'cidrs', cidrs: ['10.244.0.0/16'] });
    assert.deepEqual(d.ipv6.localPodMatch, { kind: 'none', reason: 'ClusterCIDR mode: no ipv6 --cluster-cidr' });
  });

  it('BridgeInterface and InterfaceNamePrefix match on the input interface', () => {
    const bridge = build([lb('a')], { detectLocalMode: 'BridgeInterface', podBridgeInterface: 'cni0' });
    assert.deepEqual(bridge.ipv4.localPodMatch, { kind: 'interface', name: 'cni0' });
    assert.deepEqual(bridge.ipv6.localPodMatch, { kind: 'interface', name: 'cni0' });
    const prefix = build([lb('a')], { detectLocalMode: 'InterfaceNamePrefix', podInterfaceNamePrefix: 'cali' });
    assert.deepEqual(prefix.ipv4.localPodMatch, { kind: 'interfacePrefix', prefix: 'cali' });
  });

  it('computes the mark from --masquerade-bit', () => {
    assert.equal(build([]).masqueradeMark, 0x4000);
    assert.equal(build([], { masqueradeBit: 0 }).masqueradeMark, 1);
    assert.equal(build([], { masqueradeBit: 31 }).masqueradeMark, 0x80000000);
  });
});
