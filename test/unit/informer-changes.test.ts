// The Service informer tells the model what changed since its last look (changesSince); the
// model then reads only that. Against the API stand-in (the real client library on the real wire
// protocol), through adds, updates, deletes and a relist after 410 Gone, the model fed this way
// must give what a model given the whole list gives.

import { expect } from 'chai';
import { KubeConfig } from '@kubernetes/client-node';
import { createClusterCaches, type ClusterCaches } from '../../src/kube/cluster.js';
import { DesiredStateModel, buildDesiredState } from '../../src/model/desired-state.js';
import type { DesiredState, FamilyState, NodeInfo, ServiceInfo } from '../../src/model/types.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { CONFIG } from '../support/fixtures.js';

const NODE: NodeInfo = { name: 'node-1', podCIDRs: ['10.244.1.0/24'] };

function service(name: string, ingressIp: string, clusterIp: string): Record<string, unknown> {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: `ns-${name.length % 3}`, name },
    spec: { type: 'LoadBalancer', clusterIP: clusterIp, ports: [{ protocol: 'TCP', port: 443 }] },
    status: { loadBalancer: { ingress: [{ ip: ingressIp }] } },
  };
}

/** The state without the change hints and the generation, which only a model that saw earlier input gives. */
function withoutChanges({ generation: _generation, ...d }: DesiredState): DesiredState {
  const family = ({ changes: _changes, ...rest }: FamilyState): FamilyState => rest;
  return { ...d, ipv4: family(d.ipv4), ipv6: family(d.ipv6) };
}

const describeService = (s: ServiceInfo) => `${s.namespace}/${s.name} ${s.ingress?.[0]?.ip}`;

async function waitFor(cond: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 2000 && !cond(); i++) await new Promise((resolve) => setTimeout(resolve, 5));
  expect(cond(), `timed out waiting for ${what}`).to.equal(true);
}

describe('Service informer change tracking', function () {
  this.timeout(30_000);
  let server: ApiStandIn;
  let caches: ClusterCaches;

  beforeEach(async () => {
    server = await ApiStandIn.start({ bookmarkIntervalMs: 50 });
  });
  afterEach(async () => {
    await caches?.services.stop();
    await server.stop();
  });

  it('feeds a model the changes since its last update, the same state as from the whole list', async () => {
    let serial = 0;
    const next = () => {
      const i = serial++;
      return service(`svc-${i}`, `198.18.0.${i % 40}`, `10.96.0.${i}`);
    };
    const names: string[] = [];
    for (let i = 0; i < 30; i++) names.push((server.apply(next()).metadata as { name: string }).name);
    const kc = new KubeConfig();
    kc.loadFromString(server.kubeconfig());
    caches = createClusterCaches(kc, NODE.name);
    caches.services.start();
    await caches.services.waitForSync();

    const expected = () =>
      server
        .list('Service')
        .map((o) => `${o.metadata.namespace}/${o.metadata.name} ${o.status.loadBalancer.ingress[0].ip}`)
        .sort();
    const converged = () => caches.services.list().map(describeService).sort().join() === expected().join();
    const model = new DesiredStateModel(CONFIG);
    model.update(caches.services, NODE);

    let rounds = 0;
    for (let step = 0; step < 12; step++) {
      const mark = caches.services.mark;
      const before = new Set(caches.services.list());
      for (let k = 0; k < 3; k++) {
        const at = (step * 7 + k * 5) % names.length;
        if (k === 0) server.apply({ ...service(names[at]!, `198.18.1.${step}`, `10.96.1.${step}`) });
        else if (k === 1) {
          server.remove('Service', `ns-${names[at]!.length % 3}`, names[at]!);
          names.splice(at, 1);
        } else names.push((server.apply(next()).metadata as { name: string }).name);
      }
      if (step === 6) {
        // A relist: the watch breaks and cannot resume (410 Gone); the informer lists again.
        server.expireHistory();
        server.setUnavailable(true);
        server.setUnavailable(false);
      }
      await waitFor(converged, `the informer to converge (step ${step})`);

      const changes = caches.services.changesSince(mark);
      if (!changes) expect.fail('the informer knows what changed');
      const after = new Set(before);
      for (const s of changes.removed) expect(after.delete(s), 'a removed object was there before').to.equal(true);
      for (const s of changes.added) after.add(s);
      expect([...after], `step ${step}`).to.have.deep.members([...new Set(caches.services.list())]);

      expect(withoutChanges(model.update(caches.services, NODE)), `step ${step}`).to.deep.equal(
        withoutChanges(buildDesiredState(caches.services.list(), NODE, CONFIG)),
      );
      rounds++;
    }
    expect(rounds).to.equal(12);
    expect(
      server.readsByClient().default!.watchLists,
      'the informer read the whole state again after 410 Gone',
    ).to.be.at.least(2);
  });

  it('cannot answer for a mark from before a restart of the informer', async () => {
    server.apply(service('a', '198.18.0.1', '10.96.0.1'));
    const kc = new KubeConfig();
    kc.loadFromString(server.kubeconfig());
    caches = createClusterCaches(kc, NODE.name);
    caches.services.start();
    await caches.services.waitForSync();
    const mark = caches.services.mark;
    await caches.services.stop();
    caches.services.start();
    await waitFor(() => caches.services.list().length === 1, 'the list after the restart');
    expect(caches.services.changesSince(mark)).to.equal(undefined);
  });
});
