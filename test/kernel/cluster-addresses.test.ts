// Addresses of the cluster itself are never translated (design/semantics.md, CVE-2020-8554), on
// every backend, with the controller as shipped and real packets: a tenant's Service that claims
// kube-dns's ClusterIP as an external IP (53/UDP) and the kubernetes Service's ClusterIP as its
// LoadBalancer address (443/TCP) takes neither: a pod's DNS and the node's keep reaching the
// server behind kube-dns's ClusterIP, whichever Service was created first. The tenant's other
// address is translated, which shows that the controller did program the tenant.

import { expect } from 'chai';
import { BACKEND_VARIANTS, variantNodeHooks } from '../support/variant-node.js';
import { TenantNode, UNTRANSLATED } from './tenant-node.js';

const KUBE_DNS = '10.96.0.10';
const KUBERNETES = '10.96.0.1';
const TENANT = '10.96.0.30';
/** An ordinary address of the tenant's, translated. */
const TENANT_OWN = '198.51.100.7';

/** What a UDP probe prints: who answered, and the source of the reply (the address asked, NAT undone). */
function answer(server: string, address: string): string {
  return `${server} from ${address}`;
}

function service(namespace: string, name: string, spec: object, status: object = {}) {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace, uid: `uid-${name}`, creationTimestamp: '2024-01-01T00:00:00Z' },
    spec,
    status,
  };
}

const kubeDns = service('kube-system', 'kube-dns', {
  type: 'ClusterIP',
  clusterIP: KUBE_DNS,
  clusterIPs: [KUBE_DNS],
  ports: [{ name: 'dns', port: 53, protocol: 'UDP' }],
});
const kubernetes = service('default', 'kubernetes', {
  type: 'ClusterIP',
  clusterIP: KUBERNETES,
  clusterIPs: [KUBERNETES],
  ports: [{ name: 'https', port: 443, protocol: 'TCP' }],
});
const grabby = service(
  'tenant',
  'grabby',
  {
    type: 'LoadBalancer',
    clusterIP: TENANT,
    clusterIPs: [TENANT],
    externalIPs: [KUBE_DNS, TENANT_OWN],
    ports: [
      { name: 'dns', port: 53, protocol: 'UDP' },
      { name: 'https', port: 443, protocol: 'TCP' },
    ],
  },
  { loadBalancer: { ingress: [{ ip: KUBERNETES }] } },
);

for (const variant of BACKEND_VARIANTS) {
  describe(`addresses of the cluster itself are never translated, ${variant.name}`, function () {
    this.timeout(120_000);
    const node = new TenantNode(variant.backend);

    variantNodeHooks(variant, node);

    before(async () => {
      // Servers on the ClusterIPs stand for IPVS and the endpoints behind them.
      await node.serve(KUBE_DNS, 53, 'kube-dns');
      await node.serve(KUBERNETES, 443, 'kubernetes');
      await node.serve(TENANT, 53, 'grabby');
      await node.serve(TENANT, 443, 'grabby');
      await node.serve(TENANT_OWN, 53, UNTRANSLATED);
      node.api.apply(grabby);
      node.api.apply(kubeDns);
      node.api.apply(kubernetes);
      node.startController(['--emit-events']);
      await node.waitForOutput(/"msg":"Synced"/);
      // The tenant is programmed: its own address is translated.
      await node.eventually(TENANT_OWN, 53, answer('grabby', TENANT_OWN), 20_000, { protocol: 'udp' });
      await node.eventually(TENANT_OWN, 53, answer('grabby', TENANT_OWN), 20_000, { protocol: 'udp', from: 'pod' });
    });

    it("keeps a pod's and the node's DNS and API traffic on the real ClusterIPs while a tenant claims them", async () => {
      for (const from of ['pod', 'node'] as const) {
        expect(await node.probe(KUBE_DNS, 53, from, 'udp'), `DNS from the ${from}`).to.equal(
          answer('kube-dns', KUBE_DNS),
        );
        expect(await node.probe(KUBERNETES, 443, from), `API from the ${from}`).to.equal('kubernetes');
      }
      const metrics = await node.metrics();
      expect(metrics.value('ipvs_node_controller_skipped_addresses', { reason: 'clusterAddress' })).to.equal(2);
      const skipped = (ip: string) =>
        `"service":{"namespace":"tenant","name":"grabby"},"reason":"clusterAddress","detail":"${ip} is the ClusterIP of a Service","msg":"Service address skipped"`;
      expect(node.output).to.include(skipped(KUBE_DNS));
      expect(node.output).to.include(skipped(KUBERNETES));
      const events = () =>
        node.api
          .list('Event')
          .filter((e) => e.involvedObject?.name === 'grabby')
          .map((e) => String(e.message));
      for (let i = 0; i < 200 && events().filter((m) => m.includes('clusterAddress')).length < 2; i++) {
        await new Promise((r) => setTimeout(r, 100));
      }
      expect(events().filter((m) => m.includes('(clusterAddress)'))).to.have.length(2);
    });

    it('translates the claim while no Service holds the address, and withdraws it when kube-dns comes back', async () => {
      node.api.remove('Service', 'kube-system', 'kube-dns');
      // Nothing holds the address: it is the tenant's, as any other address would be.
      await node.eventually(KUBE_DNS, 53, answer('grabby', KUBE_DNS), 20_000, { protocol: 'udp', from: 'pod' });
      node.api.apply(kubeDns);
      // kube-dns's Service created after the tenant's: the tenant loses the address on that change.
      await node.eventually(KUBE_DNS, 53, answer('kube-dns', KUBE_DNS), 20_000, { protocol: 'udp', from: 'pod' });
      expect(await node.probe(KUBE_DNS, 53, 'node', 'udp')).to.equal(answer('kube-dns', KUBE_DNS));
      expect(await node.probe(TENANT_OWN, 53, 'pod', 'udp'), 'the rest of the tenant stays').to.equal(
        answer('grabby', TENANT_OWN),
      );
    });
  });
}
