// How the informers build their caches, against the API stand-in modelling each kind of API
// server: a WatchList stream where the server offers one (1.32, 1.34), lists from the watch cache
// where it refuses the parameters (1.26, 1.30, 1.33) or ignores them, a WatchList stream broken
// by 410 Gone, and a rebuild after 410 Gone on the watch. Each path: the cache equals the server's
// state only once it is whole (deletes seen), and no read goes page by page to etcd.

import { setTimeout as sleep } from 'node:timers/promises';
import { KubeConfig } from '@kubernetes/client-node';
import { expect } from 'chai';
import { createClusterCaches, type ClusterCaches } from '../../src/kube/cluster.js';
import type { ServiceInfo } from '../../src/model/types.js';
import { ApiStandIn, type ApiStandInOptions, type ClientReads } from '../../testbed/api-server.js';
import { waitFor } from '../support/eventually.js';
import { wireNode } from '../support/wire-objects.js';

function service(i: number, ip = `198.18.${i >> 8}.${i & 255}`) {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: `ns-${i % 7}`, name: `svc-${i}` },
    spec: { type: 'LoadBalancer', clusterIP: `10.96.${i >> 8}.${i & 255}`, ports: [{ protocol: 'TCP', port: 80 }] },
    status: { loadBalancer: { ingress: [{ ip }] } },
  };
}

const NODE = wireNode(['10.244.1.0/24']);

const N = 1200;

describe('informer start: from the API server cache', function () {
  this.timeout(60_000);
  let server: ApiStandIn;
  let caches: ClusterCaches | undefined;
  let unavailable: string[];
  let errors: string[];
  let changes: number;
  /** Called when the Service informer reports an error, a list or a new watch. */
  let onServiceReport: ((what: 'error' | 'list' | 'watch') => void) | undefined;

  async function startServer(options: ApiStandInOptions): Promise<void> {
    server = await ApiStandIn.start({ bookmarkIntervalMs: 100, ...options });
    server.apply(NODE);
    for (let i = 0; i < N; i++) server.apply(service(i));
  }

  function startCaches(withNode = true): ClusterCaches {
    const kc = new KubeConfig();
    kc.loadFromString(server.kubeconfig('agent'));
    unavailable = [];
    errors = [];
    changes = 0;
    onServiceReport = undefined;
    const report = (resource: string, what: 'error' | 'list' | 'watch') => {
      if (resource === 'services') onServiceReport?.(what);
    };
    caches = createClusterCaches(
      kc,
      'node-1',
      {
        onWatchListUnavailable: (resource, why) => unavailable.push(`${resource}: ${why}`),
        onError: (resource, err) => {
          errors.push(`${resource}: ${err.message}`);
          report(resource, 'error');
        },
        onList: (resource) => report(resource, 'list'),
        onWatch: (resource) => report(resource, 'watch'),
      },
      { minWatchTimeoutMs: 60_000 },
    );
    caches.onChange(() => changes++);
    caches.services.start();
    if (withNode) caches.node.start();
    return caches;
  }

  afterEach(async () => {
    await caches?.services.stop();
    await caches?.node.stop();
    caches = undefined;
    await server.stop();
  });

  const reads = (): ClientReads => server.readsByClient().agent!;
  const names = (list: ServiceInfo[]) => list.map((s) => `${s.namespace}/${s.name}`).sort();
  const serverNames = () =>
    server
      .list('Service')
      .map((o) => `${o.metadata.namespace}/${o.metadata.name}`)
      .sort();
  const ipOf = (name: string) => caches!.services.list().find((s) => s.name === name)?.ingress?.[0]?.ip;

  for (const version of ['1.32', '1.34'] as const) {
    it(`starts with one WatchList stream per resource on ${version}, and goes on watching on it`, async () => {
      await startServer({ serverVersion: version });
      const { services, node } = startCaches();
      await services.waitForSync();
      await node.waitForSync();
      expect(names(services.list())).to.deep.equal(serverNames());
      expect(node.list().map((n) => n.name)).to.deep.equal(['node-1']);
      const start = reads();
      expect(start).to.include({ lists: 0, watches: 2, watchLists: 2, etcdListReads: 0, etcdObjects: 0 });
      // A consistent start: etcd is asked its current revision, once per stream, and nothing else.
      expect(start.etcdRevisionReads).to.equal(2);
      expect(start.objects).to.equal(N + 1);
      expect(unavailable).to.deep.equal([]);
      // A change comes on the same stream.
      server.apply(service(3, '203.0.113.3'));
      await waitFor(() => ipOf('svc-3') === '203.0.113.3', 'the change');
      expect(reads().watches).to.equal(2);
      expect(errors).to.deep.equal([]);
    });
  }

  for (const { version, refusal } of [
    { version: '1.26' as const, refusal: 'resourceVersionMatch is forbidden for watch' },
    {
      version: '1.30' as const,
      refusal: 'sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled',
    },
    {
      version: '1.33' as const,
      refusal: 'sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled',
    },
  ]) {
    it(`falls back to one list at resourceVersion 0 when ${version} refuses the WatchList stream`, async () => {
      await startServer({ serverVersion: version });
      const { services, node } = startCaches();
      await services.waitForSync();
      await node.waitForSync();
      expect(names(services.list())).to.deep.equal(serverNames());
      await waitFor(() => server.openWatchCount('Service') + server.openWatchCount('Node') === 2, 'the watches');
      expect(unavailable).to.have.length(2);
      for (const line of unavailable) expect(line).to.include(refusal);
      const start = reads();
      // Two refused watches, one unpaginated list each from the cache, two watches from the lists.
      expect(start).to.include({ lists: 2, watches: 4, watchLists: 0, etcdListReads: 0, etcdRevisionReads: 0 });
      expect(start.objects).to.equal(N + 1);
      server.apply(service(3, '203.0.113.3'));
      await waitFor(() => ipOf('svc-3') === '203.0.113.3', 'the change');
      expect(errors).to.deep.equal([]);
    });
  }

  it('falls back to a list when the server ignores the WatchList parameters, and loses nothing', async () => {
    await startServer({ watchList: 'ignored' });
    const { services, node } = startCaches();
    await services.waitForSync();
    await node.waitForSync();
    expect(names(services.list())).to.deep.equal(serverNames());
    expect(unavailable).to.deep.equal([
      'services: a bookmark came before the end of the initial state',
      'nodes: a bookmark came before the end of the initial state',
    ]);
    expect(reads()).to.include({ lists: 2, watchLists: 0, etcdListReads: 0 });
    server.remove('Service', 'ns-1', 'svc-1');
    server.apply(service(N + 1));
    await waitFor(() => ipOf('svc-1') === undefined && ipOf(`svc-${N + 1}`) !== undefined, 'the delete and the add');
    // Asked once: later rebuilds list at once.
    server.expireHistory();
    server.setUnavailable(true);
    server.setUnavailable(false);
    server.apply(service(N + 2));
    await waitFor(() => ipOf(`svc-${N + 2}`) !== undefined, 'the add after the rebuild');
    expect(unavailable).to.have.length(2);
    expect(names(services.list())).to.deep.equal(serverNames());
  });

  it('is not synced by a WatchList stream broken by 410 Gone before its end, and starts it again', async () => {
    await startServer({ serverVersion: '1.34' });
    server.breakNextWatchList(N / 2, 410);
    const { services } = startCaches();
    let syncedWith = -1;
    void services.waitForSync().then(() => (syncedWith = services.list().length));
    await services.waitForSync();
    expect(syncedWith).to.equal(N);
    expect(names(services.list())).to.deep.equal(serverNames());
    // The broken stream and the one after it; never a list.
    expect(reads().watchLists).to.equal(3); // two for the Services, one for the Node
    expect(reads().lists).to.equal(0);
    expect(errors.filter((e) => e.startsWith('services:'))).to.have.length(1);
    expect(unavailable).to.deep.equal([]);
  });

  for (const version of ['1.34', '1.30'] as const) {
    it(`rebuilds after 410 Gone from the cache, not older than what it saw, deletes included (${version})`, async () => {
      await startServer({ serverVersion: version });
      const { services } = startCaches(false);
      await services.waitForSync();
      await waitFor(() => server.openWatchCount('Service') === 1, 'a watch');
      const before = reads();
      const mark = services.changes.cursor;
      // While the agent is cut off: deletes, a change, and the history it would resume from is gone.
      server.setUnavailable(true);
      for (let i = 0; i < 10; i++) server.remove('Service', `ns-${i % 7}`, `svc-${i}`);
      server.apply(service(20, '203.0.113.20'));
      server.expireHistory();
      server.setUnavailable(false);
      await waitFor(() => names(services.list()).join() === serverNames().join(), 'the cache to catch up');
      expect(ipOf('svc-20')).to.equal('203.0.113.20');
      const seen = services.changes.changesSince(mark)!;
      expect(seen.removed.map((s) => s.name).sort()).to.include.members(['svc-0', 'svc-9', 'svc-20']);
      expect(seen.added.map((s) => s.name)).to.deep.equal(['svc-20']);
      const after = reads();
      // Not older than the version last seen: the cache serves it, etcd is not asked at all.
      expect(after.etcdListReads).to.equal(0);
      expect(after.etcdRevisionReads - before.etcdRevisionReads).to.equal(0);
      if (version === '1.34') expect(after.watchLists - before.watchLists).to.equal(1);
      else expect(after.lists - before.lists).to.equal(1);
    });
  }
  /** The cache as one string: each Service with its address, sorted. */
  const cacheState = () =>
    caches!.services
      .list()
      .map((s) => `${s.namespace}/${s.name} ${s.ingress?.[0]?.ip}`)
      .sort()
      .join('\n');

  for (const { version, cut } of [
    { version: '1.30' as const, cut: 'list' },
    { version: '1.34' as const, cut: 'WatchList stream' },
  ]) {
    it(`a rebuild whose ${cut} is cut part-way leaves the cache as it was, then swaps the new state in whole (${version})`, async () => {
      await startServer({ serverVersion: version });
      const { services } = startCaches(false);
      await services.waitForSync();
      await waitFor(() => server.openWatchCount('Service') === 1, 'a watch');
      const before = cacheState();
      const kept = new Map(services.list().map((s) => [s.name, s]));
      const mark = services.changes.cursor;
      const changesBefore = changes;
      const listsBefore = reads().lists;
      // Seen from outside whenever the informer reports: never a mixture of two states.
      const seen: string[] = [];
      onServiceReport = () => seen.push(cacheState());
      server.setUnavailable(true);
      for (let i = 0; i < 10; i++) server.remove('Service', `ns-${i % 7}`, `svc-${i}`);
      server.apply(service(20, '203.0.113.20'));
      server.apply(service(N + 1));
      server.expireHistory();
      // The cut comes after the changed Service: a cache filled as the state arrives would hold it.
      const cutAfter = serverNames().indexOf('ns-6/svc-20') + 1;
      if (version === '1.30') server.breakNextList(cutAfter);
      else server.breakNextWatchList(cutAfter, 410);
      server.setUnavailable(false);
      await waitFor(() => names(services.list()).join() === serverNames().join(), 'the new state');
      const after = cacheState();
      expect(after).to.not.equal(before);
      expect(seen.length, 'reports between the cut and the new state').to.be.at.least(1);
      for (const state of seen) expect([before, after], 'a state the server had').to.include(state);
      // The cut list, and the whole one after it.
      if (version === '1.30') expect(reads().lists - listsBefore, errors.join('\n')).to.equal(2);
      // The swap, recorded exactly: the deleted, the changed (old and new), the added; told once.
      const swap = services.changes.changesSince(mark)!;
      const removed = swap.removed.map((s) => `${s.name} ${s.ingress?.[0]?.ip}`).sort();
      const expectedRemoved = [...Array.from({ length: 10 }, (_, i) => `svc-${i}`), 'svc-20'].map(
        (name) => `${name} ${kept.get(name)!.ingress?.[0]?.ip}`,
      );
      expect(removed).to.deep.equal(expectedRemoved.sort());
      expect(swap.added.map((s) => `${s.name} ${s.ingress?.[0]?.ip}`).sort()).to.deep.equal(
        [`svc-${N + 1} ${ipOf(`svc-${N + 1}`)}`, 'svc-20 203.0.113.20'].sort(),
      );
      expect(changes - changesBefore, 'readers told once').to.equal(1);
      // What did not change keeps its identity.
      const same = services.list().filter((s) => kept.get(s.name) === s);
      expect(same).to.have.length(N - 11);
    });
  }

  it('lists a rebuild once when its WatchList stream ends before the end of its initial state, and streams the next', async () => {
    await startServer({ serverVersion: '1.34' });
    server.breakNextWatchList(N / 2, 'end');
    const { services } = startCaches(false);
    await services.waitForSync();
    expect(names(services.list())).to.deep.equal(serverNames());
    // The stream that ended early, then one list for this build: the server is not written off.
    expect(reads()).to.include({ watchLists: 1, lists: 1 });
    expect(unavailable).to.deep.equal([]);
    expect(errors).to.have.length(1);
    expect(errors[0]).to.include('ended before the end of its initial state');
    await waitFor(() => server.openWatchCount('Service') === 1, 'a watch');
    // The next rebuild (410 Gone) is a WatchList stream again.
    server.setUnavailable(true);
    server.remove('Service', 'ns-1', 'svc-1');
    server.expireHistory();
    server.setUnavailable(false);
    await waitFor(() => ipOf('svc-1') === undefined, 'the rebuild');
    expect(reads()).to.include({ watchLists: 2, lists: 1 });
    expect(names(services.list())).to.deep.equal(serverNames());
  });

  it('after "Too large resource version" lists the newest state, never resourceVersion=0 from a lagging cache', async () => {
    await startServer({ serverVersion: '1.30' });
    const { services } = startCaches(false);
    await services.waitForSync();
    await waitFor(() => server.openWatchCount('Service') === 1, 'a watch');
    const oldIp = ipOf('svc-2');
    // The API server that new requests reach lags; the open watch is on one that does not.
    server.lagWatchCache();
    server.remove('Service', 'ns-1', 'svc-1');
    server.apply(service(2, '203.0.113.2'));
    await waitFor(() => ipOf('svc-1') === undefined && ipOf('svc-2') === '203.0.113.2', 'the changes');
    let stale: string | undefined;
    caches!.onChange(() => {
      if (ipOf('svc-1') !== undefined || ipOf('svc-2') === oldIp) stale ??= cacheState();
    });
    let listed = 0;
    onServiceReport = (what) => void (what === 'list' && listed++);
    const before = reads();
    // The watch is resumed on the lagging server: "Too large resource version".
    server.setUnavailable(true);
    server.setUnavailable(false);
    await waitFor(() => listed >= 1, 'a list after the answer');
    expect(stale, 'a state older than one already seen').to.equal(undefined);
    expect(ipOf('svc-1')).to.equal(undefined);
    // The newest state is a consistent read (etcd, while the cache lags), asked with a backoff.
    expect(reads().etcdListReads - before.etcdListReads).to.be.at.least(1);
    // Each answered with a backoff that grows, not at once (a list is pages here: count whole ones).
    await sleep(1500);
    expect(listed, `whole lists while the cache lags:\n${errors.join('\n')}`).to.be.at.most(4);
    server.catchUpWatchCache();
    server.apply(service(N + 1));
    await waitFor(() => ipOf(`svc-${N + 1}`) !== undefined, 'a change once the cache caught up');
    expect(stale).to.equal(undefined);
    expect(names(services.list())).to.deep.equal(serverNames());
  });
});
