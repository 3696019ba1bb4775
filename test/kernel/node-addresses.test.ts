// Addresses that point at the node are never translated (design/semantics.md, CVE-2020-8554),
// on every backend, with the controller as shipped and real packets: a Service author who claims
// the loopback, the cloud metadata address, multicast, broadcast, the node's InternalIP or an
// address of one of its interfaces takes nothing from the node. An operator's allowed ranges
// (--service-external-ip-range) and kube-proxy's AllowServiceExternalIPs gate are followed.

import { expect } from 'chai';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sh } from '../../testbed/node-network.js';
import { eventually } from '../support/eventually.js';
import { TENANT_BACKENDS, TenantNode, UNTRANSLATED, lbService } from './tenant-node.js';

const GRABBY = '10.96.0.30';
const NORMAL = { clusterIp: '10.96.0.31', lb: '192.0.2.40' };
const ALLOWED = '198.51.100.7';
const OUTSIDE_RANGE = '203.0.113.9';
/** The node's InternalIP (the Node object says so) and an address of one of its interfaces. */
const NODE_OWN = '192.168.50.1';
const POD_GATEWAY = '10.244.1.1';
const METADATA = '169.254.169.254';

/** Claims every kind of address that points at the node, and two ordinary ones. */
const grabby = {
  apiVersion: 'v1',
  kind: 'Service',
  metadata: { name: 'grabby', namespace: 'tenant', uid: 'uid-grabby', creationTimestamp: '2024-01-01T00:00:00Z' },
  spec: {
    type: 'LoadBalancer',
    clusterIP: GRABBY,
    clusterIPs: [GRABBY],
    externalIPs: [
      METADATA,
      '127.0.0.1',
      '0.0.0.0',
      '224.0.0.1',
      '255.255.255.255',
      NODE_OWN,
      POD_GATEWAY,
      ALLOWED,
      OUTSIDE_RANGE,
    ],
    ports: [{ name: 'http', port: 80, protocol: 'TCP' }],
  },
  status: { loadBalancer: { ingress: [{ ip: '127.0.0.2' }] } },
};

for (const backend of TENANT_BACKENDS) {
  describe(`addresses that point at the node are never translated, --backend=${backend}`, function () {
    this.timeout(120_000);
    const node = new TenantNode(backend);
    const dir = mkdtempSync(join(tmpdir(), 'node-addresses-'));

    before(async () => {
      await node.setUp();
      sh('ip', ['addr', 'add', `${METADATA}/32`, 'dev', 'lo']);
      await node.serve('127.0.0.1', 80, 'node-loopback', false);
      await node.serve('127.0.0.2', 80, 'node-loopback-2', false);
      await node.serve(METADATA, 80, 'metadata', false);
      await node.serve(NODE_OWN, 80, 'node-own', false);
      await node.serve(POD_GATEWAY, 80, 'pod-gateway', false);
      await node.serve(GRABBY, 80, 'grabby');
      await node.serve(ALLOWED, 80, UNTRANSLATED);
      await node.serve(OUTSIDE_RANGE, 80, UNTRANSLATED);
      await node.serve(NORMAL.clusterIp, 80, 'normal');
      await node.serve(NORMAL.lb, 80, UNTRANSLATED);
      node.api.apply(grabby);
      node.api.apply(lbService('normal', NORMAL.clusterIp, NORMAL.lb));
    });

    after(async () => {
      await node.tearDown();
      sh('ip', ['addr', 'del', `${METADATA}/32`, 'dev', 'lo']);
      rmSync(dir, { recursive: true, force: true });
    });

    afterEach(async function () {
      if (this.currentTest?.state === 'failed') console.log(node.tail());
      await node.stopController();
    });

    it('leaves loopback, metadata, the node own and its interfaces alone, and translates only allowed external IPs', async () => {
      node.startController(['--service-external-ip-range=198.51.100.0/24']);
      await node.eventually(ALLOWED, 80, 'grabby');
      await node.eventually(NORMAL.lb, 80, 'normal');
      expect(await node.probe('127.0.0.1', 80)).to.equal('node-loopback');
      expect(await node.probe('127.0.0.2', 80)).to.equal('node-loopback-2');
      expect(await node.probe(METADATA, 80)).to.equal('metadata');
      expect(await node.probe(NODE_OWN, 80)).to.equal('node-own');
      expect(await node.probe(POD_GATEWAY, 80)).to.equal('pod-gateway');
      expect(await node.probe(NODE_OWN, 80, 'pod'), 'from a pod').to.equal('node-own');
      expect(await node.probe(POD_GATEWAY, 80, 'pod'), 'from a pod').to.equal('pod-gateway');
      expect(await node.probe(OUTSIDE_RANGE, 80)).to.equal(UNTRANSLATED);
      const metrics = await node.metrics();
      // 0.0.0.0, 224.0.0.1, 255.255.255.255 and the ingress 127.0.0.2 too: eight in all.
      expect(metrics.value('ipvs_node_controller_skipped_addresses', { reason: 'pointsAtNode' })).to.equal(8);
      expect(metrics.value('ipvs_node_controller_skipped_addresses', { reason: 'externalIpNotAllowed' })).to.equal(1);
      const skipped = (detail: string) =>
        `"service":{"namespace":"tenant","name":"grabby"},"reason":"pointsAtNode","detail":"${detail}","msg":"Service address skipped"`;
      expect(node.output).to.include(skipped(`${NODE_OWN} is one of the node's own addresses`));
      expect(node.output).to.include(skipped(`${METADATA} is a link-local address`));
    });

    it('stops translating an address within seconds of it appearing on an interface of the node, with no Service change', async () => {
      node.startController(['--service-external-ip-range=198.51.100.0/24']);
      const pointsAtNode = async () =>
        (await node.metrics()).value('ipvs_node_controller_skipped_addresses', { reason: 'pointsAtNode' });
      // The rules of the run before stay until this one's first sync: its metrics say it synced.
      await eventually('the first sync', () =>
        pointsAtNode().then(
          (n) => n === 8,
          () => false,
        ),
      );
      await node.eventually(ALLOWED, 80, 'grabby');
      sh('ip', ['addr', 'add', `${ALLOWED}/32`, 'dev', 'lo']);
      try {
        await eventually('the address skipped as the node own', async () => (await pointsAtNode()) === 9, 10_000);
        // Read once a second (InterfaceAddressWatch), then one sync: well inside the wait above,
        // where without a Service change the next sync would be --sync-period (30 s) away.
        expect(await node.probe(ALLOWED, 80)).to.not.equal('grabby');
      } finally {
        sh('ip', ['addr', 'del', `${ALLOWED}/32`, 'dev', 'lo']);
      }
      // And translated again once it is gone.
      await node.eventually(ALLOWED, 80, 'grabby');
    });

    it("translates no spec.externalIPs when kube-proxy's AllowServiceExternalIPs gate is off", async () => {
      const config = join(dir, 'kube-proxy.conf');
      writeFileSync(
        config,
        'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n' +
          'featureGates:\n  AllowServiceExternalIPs: false\n',
      );
      node.startController(['--kube-proxy-config', config]);
      // The rules of the run before stay until this one's first sync.
      await node.waitForOutput(/"msg":"Synced"/);
      await node.eventually(NORMAL.lb, 80, 'normal');
      expect(await node.probe(ALLOWED, 80)).to.equal(UNTRANSLATED);
      expect(await node.probe(OUTSIDE_RANGE, 80)).to.equal(UNTRANSLATED);
      expect(await node.probe(METADATA, 80)).to.equal('metadata');
      const metrics = await node.metrics();
      expect(metrics.value('ipvs_node_controller_skipped_addresses', { reason: 'externalIpsDisabled' })).to.equal(2);
    });
  });
}
