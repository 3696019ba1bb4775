// The kernel tests' simulated node and what conntrack does with a connection whose source port
// meets an entry left from an earlier one. Every NodeNetwork's pod has the same address, and the
// kernel's source ports to one destination come round again after a few thousand connections,
// across test files: a port that meets an untranslated entry not yet closed is answered by the
// LoadBalancer path whatever the rules hold (the cause of a probe answered `lb-path` once in a
// whole suite, with the rules in place). These tests fail if NodeNetwork stops forgetting the
// flows of the network it replaces, and show the kernel behaviour docs/iptables.md states.

import { expect } from 'chai';
import { NamedServer, NodeNetwork, probe, sh } from '../../testbed/node-network.js';

const LB = '192.0.2.91';
const CLUSTER_IP = '10.96.0.91';
const PORT = 80;
// Below the ephemeral range, so that no other connection of the test takes it.
const REUSED_PORT = 20491;
const FRESH_PORT = 20492;
const PORT_OF_A_REPLACED_NODE = 20493;

describe("the kernel tests' node network and conntrack", function () {
  let net: NodeNetwork | undefined;
  let servers: NamedServer[] = [];

  /** A node whose pod's connections to LB:80 are DNAT'ed to the ClusterIP by a table of the test. */
  async function node(): Promise<NodeNetwork> {
    const n = new NodeNetwork();
    n.setUp();
    n.bindAddress(LB);
    n.bindAddress(CLUSTER_IP);
    servers = [await NamedServer.start(LB, PORT, 'lb-path'), await NamedServer.start(CLUSTER_IP, PORT, 'cluster')];
    sh(
      'nft',
      ['-f', '-'],
      `table ip node-network-test {
        chain prerouting {
          type nat hook prerouting priority dstnat; policy accept;
          ip saddr ${n.pod.ipv4} ip daddr ${LB} tcp dport ${PORT} dnat to ${CLUSTER_IP}
        }
      }\n`,
    );
    return n;
  }

  async function removeNode(): Promise<void> {
    for (const s of servers.splice(0)) await s.stop();
    try {
      sh('nft', ['delete', 'table', 'ip', 'node-network-test']);
    } catch {
      // not created
    }
    net?.tearDown();
    net = undefined;
  }

  /** An untranslated entry of pod:port -> LB:80, as a connection made before the rule leaves it. */
  function leaveUntranslatedEntry(pod: string, port: number, state: string): void {
    sh('conntrack', [
      '-I',
      '-p',
      'tcp',
      '-s',
      pod,
      '-d',
      LB,
      '--sport',
      String(port),
      '--dport',
      String(PORT),
      '--state',
      state,
      '--timeout',
      '300',
    ]);
  }

  afterEach(removeNode);

  it('a connect from a port that meets an untranslated entry not closed is answered by the LoadBalancer path, the rule in place', async () => {
    net = await node();
    expect(await probe(net.pod.ns, 'tcp', LB, PORT, 1500, FRESH_PORT)).to.equal('cluster');
    for (const state of ['SYN_SENT', 'ESTABLISHED']) {
      leaveUntranslatedEntry(net.pod.ipv4, REUSED_PORT, state);
      expect(await probe(net.pod.ns, 'tcp', LB, PORT, 1500, REUSED_PORT), state).to.equal('lb-path');
      sh('conntrack', ['-D', '-p', 'tcp', '-s', net.pod.ipv4, '--sport', String(REUSED_PORT)]);
    }
    // A closed one is not kept: the connect is a new connection, and translated.
    leaveUntranslatedEntry(net.pod.ipv4, REUSED_PORT, 'TIME_WAIT');
    expect(await probe(net.pod.ns, 'tcp', LB, PORT, 1500, REUSED_PORT)).to.equal('cluster');
  });

  it('a NodeNetwork set up after another starts with none of its flows: the same connect is translated', async () => {
    net = await node();
    leaveUntranslatedEntry(net.pod.ipv4, PORT_OF_A_REPLACED_NODE, 'ESTABLISHED');
    await removeNode();
    net = await node();
    expect(await probe(net.pod.ns, 'tcp', LB, PORT, 1500, PORT_OF_A_REPLACED_NODE)).to.equal('cluster');
  });
});
