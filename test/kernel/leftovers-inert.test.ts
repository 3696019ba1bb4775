// Rules left behind can never break a node (docs/semantics.md, "Which packets are translated"),
// on every backend, with the controller as shipped and real packets. A controller deleted without
// --cleanup (SIGKILLed here) leaves its translation in the kernel. When kube-proxy then moves the
// node from IPVS mode to nftables mode, it unbinds every address from kube-ipvs0 (it deletes the
// device) and DNATs ClusterIPs and LoadBalancer IPs itself, at priority -100 (dstnat). A leftover
// DNAT to the ClusterIP, bound nowhere now, that runs before kube-proxy's wins (the first NAT
// chain that translates a connection wins), and kube-proxy rejects what is still addressed to a
// ClusterIP after DNAT: every in-cluster client of the address is refused. The nft backend's chains
// run first at -110; the iptables backend's at kube-proxy's -100, where the hook registered last
// runs first: after kube-proxy's table, until a restore of the nat table re-registers iptables-nft's.
// Translating only what is local to the node (`fib daddr type local`, `-m addrtype --dst-type
// LOCAL`) makes the leftovers inert once the address is unbound, in any order: the pod and the node
// reach the LoadBalancer IP through kube-proxy, which keeps the pod's address and masquerades the
// node's. The eBPF backend's leftover programs translate the socket's destination to the
// ClusterIP, which kube-proxy DNATs in any mode: that must reach the endpoint too.
//
// The kube-proxy stand-in has the shape of kube-proxy's nftables proxier (pkg/proxy/nftables/
// proxier.go, read at kubernetes commit b0f823e6, with the filter chains at priority 0 of
// kubernetes PR 132456, in 1.34.0 and 1.33.6): table `ip kube-proxy`, `services` dispatching
// through the `service-ips` vmap from nat-prerouting and nat-output (dstnat), the Service's
// chains, `mark-for-masquerade` and `masquerading` (nat-postrouting, srcnat), the
// `no-endpoint-services` drop of external traffic to an externalTrafficPolicy: Local address
// without a local endpoint, and `cluster-ips-check`, which rejects new connections still addressed
// to a ClusterIP after DNAT. For the eTP=Local LoadBalancer IP without a local endpoint, its
// external chain short-circuits pod traffic (detect-local: the cluster CIDR) to the Service's
// cluster chain, and marks node-originated traffic (`fib saddr type local`) for masquerade before
// short-circuiting it too. The endpoint, a pod elsewhere, answers with the client address it sees.

import { expect } from 'chai';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { SourceEchoEndpoint } from '../../testbed/endpoint.js';
import { sh } from '../../testbed/node-network.js';
import { BACKEND_VARIANTS, variantNodeHooks } from '../support/variant-node.js';
import { TenantNode, UNTRANSLATED, lbService } from './tenant-node.js';

const CLUSTER_IP = '10.96.0.50';
const LB_IP = '192.0.2.50';
const PORT = 80;
/** What the ClusterIP answers in IPVS mode (a server on kube-ipvs0 stands for IPVS and the endpoints). */
const IPVS_CLUSTER_IP = 'web';
const CLUSTER_CIDR = '10.244.0.0/16';
/** The pod's address (testbed/node-network.ts). */
const POD_IP = '10.244.1.2';
/** The endpoint, a pod on another node, reached over a veth from this node's 10.244.9.1. */
const ENDPOINT = { address: '10.244.9.5', nodeSide: '10.244.9.1', port: 8080, name: 'endpoint' };
/** The node's default route, as every node has one: to the outside host of node-network.ts. */
const DEFAULT_GATEWAY = '192.168.50.2';

/** An externalTrafficPolicy: Local LoadBalancer Service; its endpoint is on another node. */
const SERVICE = (() => {
  const svc = lbService('web', CLUSTER_IP, LB_IP, PORT);
  return { ...svc, spec: { ...svc.spec, externalTrafficPolicy: 'Local' } };
})();

/** kube-proxy's nftables mode for SERVICE on a node without a local endpoint (see the header). */
const KUBE_PROXY_TABLE = `table ip kube-proxy {
  comment "rules for kube-proxy"
  set cluster-ips { type ipv4_addr; comment "Active ClusterIPs"; elements = { ${CLUSTER_IP} }; }
  map service-ips {
    type ipv4_addr . inet_proto . inet_service : verdict
    comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
    elements = { ${CLUSTER_IP} . tcp . ${PORT} : goto service-web, ${LB_IP} . tcp . ${PORT} : goto external-web }
  }
  map no-endpoint-services {
    type ipv4_addr . inet_proto . inet_service : verdict
    comment "vmap to drop or reject packets to services with no endpoints"
    elements = { ${LB_IP} . tcp . ${PORT} comment "default/web:p" : drop }
  }
  chain filter-input { type filter hook input priority 0; policy accept;
    ct state new jump service-endpoints-check
  }
  chain filter-forward { type filter hook forward priority 0; policy accept;
    ct state new jump service-endpoints-check
    ct state new jump cluster-ips-check
  }
  chain filter-output { type filter hook output priority 0; policy accept;
    ct state new jump service-endpoints-check
    ct state new jump cluster-ips-check
  }
  chain nat-prerouting { type nat hook prerouting priority -100; policy accept;
    jump services
  }
  chain nat-output { type nat hook output priority -100; policy accept;
    jump services
  }
  chain nat-postrouting { type nat hook postrouting priority 100; policy accept;
    jump masquerading
  }
  chain services {
    ip daddr . meta l4proto . th dport vmap @service-ips
  }
  chain service-endpoints-check {
    ip daddr . meta l4proto . th dport vmap @no-endpoint-services
  }
  chain cluster-ips-check {
    ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
  }
  chain mark-for-masquerade {
    meta mark set meta mark | 0x00004000
  }
  chain masquerading {
    meta mark & 0x00004000 == 0 return
    meta mark set meta mark ^ 0x00004000
    masquerade fully-random
  }
  chain service-web {
    ip daddr ${CLUSTER_IP} tcp dport ${PORT} ip saddr != ${CLUSTER_CIDR} jump mark-for-masquerade
    numgen random mod 1 vmap { 0 : goto endpoint-web }
  }
  chain external-web {
    ip saddr ${CLUSTER_CIDR} goto service-web comment "short-circuit pod traffic"
    fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
    fib saddr type local goto service-web comment "short-circuit local traffic"
  }
  chain endpoint-web {
    ip saddr ${ENDPOINT.address} jump mark-for-masquerade
    meta l4proto tcp dnat to ${ENDPOINT.address}:${ENDPOINT.port}
  }
}
`;

/** The endpoint's answer to a client it saw as `address`. */
const seen = (address: string) => `${ENDPOINT.name} ${address}`;

for (const variant of BACKEND_VARIANTS) {
  describe(`a SIGKILLed controller's leftovers go inert when kube-proxy moves to nftables mode, ${variant.name}`, function () {
    this.timeout(120_000);
    const node = new TenantNode(variant.backend);
    const endpointNs = `ep-${randomBytes(3).toString('hex')}`;
    const endpointLink = `v${endpointNs}`;
    let endpoint: SourceEchoEndpoint | undefined;
    let movedToNftables = false;

    variantNodeHooks(variant, node);

    before(async () => {
      await node.serve(CLUSTER_IP, PORT, IPVS_CLUSTER_IP);
      await node.serve(LB_IP, PORT, UNTRANSLATED);
      node.api.apply(SERVICE);
      // The endpoint on another node, reached over a veth as pods elsewhere are.
      sh('ip', ['netns', 'add', endpointNs]);
      sh('ip', ['link', 'add', endpointLink, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', endpointNs]);
      sh('ip', ['addr', 'add', `${ENDPOINT.nodeSide}/24`, 'dev', endpointLink]);
      sh('ip', ['link', 'set', endpointLink, 'up']);
      sh('ip', ['-n', endpointNs, 'link', 'set', 'lo', 'up']);
      sh('ip', ['-n', endpointNs, 'addr', 'add', `${ENDPOINT.address}/24`, 'dev', 'eth0']);
      sh('ip', ['-n', endpointNs, 'link', 'set', 'eth0', 'up']);
      sh('ip', ['-n', endpointNs, 'route', 'add', 'default', 'via', ENDPOINT.nodeSide]);
      endpoint = await SourceEchoEndpoint.start(endpointNs, ENDPOINT.address);
      await endpoint.listen(ENDPOINT.port, ENDPOINT.name);
      node.startController();
      await node.waitForOutput(/"msg":"Synced"/);
    });

    after(async () => {
      // What kube-proxy's nftables mode set up goes; the node (its kube-ipvs0 too) and the
      // controller's leftovers are the node's teardown (variantNodeHooks: --cleanup, then the rest).
      const steps: Array<() => unknown> = [
        () => endpoint?.stop(),
        () => sh('ip', ['netns', 'del', endpointNs]),
        () => movedToNftables && sh('nft', ['delete', 'table', 'ip', 'kube-proxy']),
        () => movedToNftables && sh('ip', ['route', 'del', 'default', 'via', DEFAULT_GATEWAY]),
      ];
      for (const step of steps) {
        try {
          await step();
        } catch {
          // already gone
        }
      }
    });

    it('translates in IPVS mode: pod and node -> LoadBalancer IP reach the ClusterIP', async () => {
      await node.eventually(LB_IP, PORT, IPVS_CLUSTER_IP, 20_000, { from: 'pod' });
      await node.eventually(LB_IP, PORT, IPVS_CLUSTER_IP, 20_000, { from: 'node' });
    });

    it("SIGKILLed, then kube-proxy moves to nftables mode: pod and node reach the endpoint through kube-proxy's DNAT", async () => {
      const controller = node.controller!;
      node.controller = undefined; // gone: nothing for the teardown to stop
      const exited = once(controller, 'exit');
      controller.kill('SIGKILL');
      await exited;
      // The leftovers still translate while the addresses are bound.
      expect(
        await node.probe(LB_IP, PORT, 'pod'),
        'the leftovers translate while kube-ipvs0 holds the address',
      ).to.equal(IPVS_CLUSTER_IP);

      // kube-proxy starts in nftables mode: IPVS mode's kube-ipvs0 goes, its own table comes.
      movedToNftables = true;
      sh('ip', ['link', 'del', 'kube-ipvs0']);
      sh('ip', ['route', 'add', 'default', 'via', DEFAULT_GATEWAY]);
      sh('nft', ['-f', '-'], KUBE_PROXY_TABLE);

      await expectKubeProxyServes('leftovers in nftables mode');
    });

    if (variant.backend === 'iptables' && !variant.legacy) {
      // At one priority the hook registered last runs first: kube-proxy's new table comes before
      // the iptables nat chains of the leftovers (the old rules lost that tie by chance alone).
      // A restore of the nat table without --noflush (a firewall reload, netfilter-persistent)
      // recreates iptables-nft's table, and its chains come first again.
      it("a restore of the iptables-nft nat table after the move (its chains then come before kube-proxy's) changes nothing", async () => {
        sh('iptables-nft-restore', ['-w'], sh('iptables-nft-save', ['-t', 'nat']));
        await expectKubeProxyServes('leftovers in nftables mode, the nat table restored');
      });
    }

    /** kube-proxy alone answers: the pod keeps its address, the node is masqueraded. */
    async function expectKubeProxyServes(when: string): Promise<void> {
      const fromPod = await node.probe(LB_IP, PORT, 'pod');
      const fromNode = await node.probe(LB_IP, PORT, 'node');
      const podToClusterIp = await node.probe(CLUSTER_IP, PORT, 'pod');
      console.log(
        `      ${variant.name}, ${when}: pod -> LB IP '${fromPod}', node -> LB IP '${fromNode}', ` +
          `pod -> ClusterIP '${podToClusterIp}'`,
      );
      expect(podToClusterIp, 'kube-proxy serves the ClusterIP').to.equal(seen(POD_IP));
      // kube-proxy short-circuits a pod's traffic to the cluster's endpoints with its own address...
      expect(fromPod, 'pod -> LB IP').to.equal(seen(POD_IP));
      // ...and masquerades the node's (its source is the node's address toward the endpoint).
      expect(fromNode, 'node -> LB IP').to.equal(seen(ENDPOINT.nodeSide));
    }
  });
}
