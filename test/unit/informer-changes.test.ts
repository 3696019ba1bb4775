// The Service informer tells the model what changed since its last look, through its change
// feed (src/model/change-feed.ts); the model then reads only that. The feed's own rules first: a
// read changes nothing, the log is let go only when the consumer releases it, and a consumer that
// falls behind the bounded log is told to rebuild. Then against the API stand-in (the real client
// library on the real wire protocol), through adds, updates, deletes and a relist after 410 Gone,
// the model fed this way must give what a model given the whole list gives.

import { expect } from 'chai';
import { KubeConfig } from '@kubernetes/client-node';
import { ChangeLog, MAX_CHANGE_LOG } from '../../src/kube/store.js';
import { createClusterCaches, type ClusterCaches } from '../../src/kube/cluster.js';
import { toServiceInfo } from '../../src/kube/objects.js';
import { ObjectStore } from '../../src/kube/store.js';
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

/** The store of a Service informer, fed the raw objects a watch would deliver. */
function serviceStore(maxChangeLog?: number): ObjectStore<ServiceInfo> {
  return new ObjectStore<ServiceInfo>(toServiceInfo, maxChangeLog);
}

function put(store: ObjectStore<ServiceInfo>, raw: Record<string, unknown>): void {
  const decoded = store.decode(raw)!;
  store.put(decoded.key, decoded.info);
}

function remove(store: ObjectStore<ServiceInfo>, raw: Record<string, unknown>): void {
  store.remove(store.decode(raw)!.key);
}

const names = (services: ServiceInfo[]) => services.map(describeService).sort();

describe('the change feed of a cache', () => {
  it('answers a read asked twice the same: reading changes nothing', () => {
    const store = serviceStore();
    put(store, service('a', '198.18.0.1', '10.96.0.1'));
    const cursor = store.changes.cursor;
    put(store, service('b', '198.18.0.2', '10.96.0.2'));
    put(store, service('a', '198.18.0.9', '10.96.0.1'));
    remove(store, service('b', '198.18.0.2', '10.96.0.2'));
    const first = store.changes.changesSince(cursor)!;
    const second = store.changes.changesSince(cursor)!;
    expect(second).to.deep.equal(first);
    expect(second.removed).to.have.members(first.removed);
    expect(second.added).to.have.members(first.added);
    // b came and went between the two looks: neither; a was replaced.
    expect(names(first.removed)).to.deep.equal(['ns-1/a 198.18.0.1']);
    expect(names(first.added)).to.deep.equal(['ns-1/a 198.18.0.9']);
    expect(store.changes.cursor).to.equal(cursor + 3);
  });

  it('lets the log go only when told, and only what is before the cursor it is told', () => {
    const store = serviceStore();
    const start = store.changes.cursor;
    put(store, service('a', '198.18.0.1', '10.96.0.1'));
    const middle = store.changes.cursor;
    put(store, service('bb', '198.18.0.2', '10.96.0.2'));
    for (let i = 0; i < 3; i++) store.changes.changesSince(start);
    expect(names(store.changes.changesSince(start)!.added), 'after reads').to.deep.equal([
      'ns-1/a 198.18.0.1',
      'ns-2/bb 198.18.0.2',
    ]);
    store.changes.release(middle);
    expect(store.changes.changesSince(start), 'released').to.equal(undefined);
    expect(names(store.changes.changesSince(middle)!.added)).to.deep.equal(['ns-2/bb 198.18.0.2']);
    // A cursor outside the log releases nothing.
    store.changes.release(start);
    store.changes.release(store.changes.cursor + 1);
    expect(names(store.changes.changesSince(middle)!.added)).to.deep.equal(['ns-2/bb 198.18.0.2']);
    store.changes.release(store.changes.cursor);
    expect(store.changes.changesSince(middle)).to.equal(undefined);
    expect(store.changes.changesSince(store.changes.cursor)).to.deep.equal({ removed: [], added: [] });
  });

  it('is bounded: a consumer that falls behind is told to rebuild, one that keeps up is not', () => {
    const log = new ChangeLog<number>(() => [], 4);
    const behind = log.cursor;
    for (let i = 0; i < 4; i++) log.record(undefined, i);
    expect(log.changesSince(behind)!.added).to.deep.equal([0, 1, 2, 3]);
    const caughtUp = log.cursor;
    log.record(undefined, 4);
    expect(log.changesSince(behind), 'past the bound').to.equal(undefined);
    expect(log.changesSince(caughtUp)!.added).to.deep.equal([4]);
    // Released as it is read, the log never reaches its bound.
    let cursor = log.cursor;
    for (let i = 5; i < 50; i++) {
      log.record(undefined, i);
      expect(log.changesSince(cursor)!.added).to.deep.equal([i]);
      log.release((cursor = log.cursor));
    }
    expect(MAX_CHANGE_LOG).to.equal(10_000);
  });

  it('feeds a model that releases what it read, and rebuilds when it fell behind', () => {
    const store = serviceStore(8);
    const model = new DesiredStateModel(CONFIG);
    for (let i = 0; i < 5; i++) put(store, service(`svc-${i}`, `198.18.0.${i}`, `10.96.0.${i}`));
    const before = store.changes.cursor;
    model.update(store.changes, NODE);
    expect(store.changes.changesSince(before), 'read, not yet released: the log is kept').to.not.equal(undefined);
    put(store, service('svc-1', '198.18.1.1', '10.96.0.1'));
    const expected = () => withoutChanges(buildDesiredState(store.list(), NODE, CONFIG));
    expect(withoutChanges(model.update(store.changes, NODE))).to.deep.equal(expected());
    expect(store.changes.changesSince(before), 'released by the model').to.equal(undefined);
    const modelCursor = store.changes.cursor;
    // More changes than the log holds: the model's cursor falls out of it, and it reads the list.
    for (let i = 0; i < 20; i++) put(store, service(`svc-${i % 7}`, `198.18.2.${i}`, `10.96.0.${i % 7}`));
    remove(store, service('svc-2', '', '10.96.0.2'));
    expect(store.changes.changesSince(modelCursor), "past the log's bound").to.equal(undefined);
    expect(withoutChanges(model.update(store.changes, NODE))).to.deep.equal(expected());
    expect(model.update(store.changes, NODE).ipv4.entries).to.have.length(6);
  });
});

describe('Service informer change tracking', function () {
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
    model.update(caches.services.changes, NODE);

    let rounds = 0;
    for (let step = 0; step < 12; step++) {
      const mark = caches.services.changes.cursor;
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

      const changes = caches.services.changes.changesSince(mark);
      if (!changes) expect.fail('the informer knows what changed');
      expect(caches.services.changes.changesSince(mark), 'the same answer again').to.deep.equal(changes);
      const after = new Set(before);
      for (const s of changes.removed) expect(after.delete(s), 'a removed object was there before').to.equal(true);
      for (const s of changes.added) after.add(s);
      expect([...after], `step ${step}`).to.have.deep.members([...new Set(caches.services.list())]);

      expect(withoutChanges(model.update(caches.services.changes, NODE)), `step ${step}`).to.deep.equal(
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
    const mark = caches.services.changes.cursor;
    await caches.services.stop();
    caches.services.start();
    await waitFor(() => caches.services.list().length === 1, 'the list after the restart');
    expect(caches.services.changes.changesSince(mark)).to.equal(undefined);
  });
});
