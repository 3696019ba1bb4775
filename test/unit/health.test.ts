// Liveness and readiness judgements through their states, the informers' report of the API
// server's reachability (against the API stand-in), and the HTTP endpoint.

import { expect } from 'chai';
import { KubeConfig } from '@kubernetes/client-node';
import type { ControllerStatus } from '../../src/controller/controller.js';
import { ApiReachability, judgeLiveness, judgeReadiness, type HealthInputs } from '../../src/health/health.js';
import { startHealthEndpoint } from '../../src/health/health-server.js';
import type { HttpEndpoint } from '../../src/http/endpoint.js';
import { createClusterCaches, type ClusterCaches } from '../../src/kube/cluster.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { httpGet } from '../support/scrape.js';
import { waitFor as waitUntil } from '../support/eventually.js';

const PERIOD = 30_000;
const T0 = 1_700_000_000_000;

function inputs(status: Partial<ControllerStatus>, api: ApiReachability, now: number): HealthInputs {
  return {
    // A successful sync is also the last sync that ended, unless the test says otherwise.
    status: { cachesSynced: false, localPodMatchProblems: [], lastSyncEndedAt: status.lastSuccessfulSyncAt, ...status },
    api,
    syncPeriodMs: PERIOD,
    startedAt: T0,
    now,
  };
}

/** An ApiReachability whose clock the test sets. */
function reachability(): { api: ApiReachability; at(t: number): void } {
  let now = T0;
  return { api: new ApiReachability(() => now), at: (t) => (now = t) };
}

describe('liveness (/healthz)', () => {
  it('holds while the caches have not synced, however long that takes', () => {
    const { api } = reachability();
    api.onError('services', new Error('connection refused'));
    const j = judgeLiveness(inputs({}, api, T0 + 100 * PERIOD));
    expect(j.ok).to.equal(true);
    expect(j.detail).to.match(/waiting for the Service and Node caches/);
  });

  it('gives the first sync 2 x sync-period from the moment the caches synced', () => {
    const clock = reachability();
    clock.at(T0 + 5 * PERIOD);
    clock.api.onList('services');
    clock.at(T0 + 6 * PERIOD);
    clock.api.onList('nodes');
    const synced = T0 + 6 * PERIOD;
    const at = (now: number, lastError?: string) =>
      judgeLiveness(inputs({ cachesSynced: true, lastError }, clock.api, now));
    expect(at(synced + 2 * PERIOD).ok).to.equal(true);
    expect(at(synced + PERIOD).detail).to.match(/first sync pending/);
    const failed = at(synced + 2 * PERIOD + 1);
    expect(failed.ok).to.equal(false);
    expect(failed.detail).to.equal(
      'no sync has ended for 60s (limit: 2 x --sync-period = 60s): the sync loop is stuck',
    );
  });

  it('fails once no sync has ended for 2 x sync-period, and recovers with the next', () => {
    const { api } = reachability();
    const last = T0 + 1000;
    const at = (now: number, lastSyncEndedAt = last) =>
      judgeLiveness(inputs({ cachesSynced: true, lastSuccessfulSyncAt: last, lastSyncEndedAt }, api, now));
    expect(at(last + 2 * PERIOD).ok).to.equal(true);
    expect(at(last + 2 * PERIOD + 1).ok).to.equal(false);
    expect(at(last + 2 * PERIOD + 1).detail).to.match(/the sync loop is stuck$/);
    expect(at(last + 5 * PERIOD, last + 5 * PERIOD - 10).ok).to.equal(true);
  });

  it('holds while syncs end in failure: the loop is alive (readiness says the rest)', () => {
    const { api } = reachability();
    const status = { cachesSynced: true, lastSuccessfulSyncAt: T0, lastError: 'nft: Operation not permitted' };
    const j = judgeLiveness(inputs({ ...status, lastSyncEndedAt: T0 + 10 * PERIOD }, api, T0 + 10 * PERIOD + 5000));
    expect(j.ok).to.equal(true);
    expect(j.detail).to.equal('last sync ended 5.0s ago');
    expect(j.warnings).to.deep.equal(['last sync failed: nft: Operation not permitted']);
  });

  it('fails when one sync runs for longer than 2 x sync-period', () => {
    const { api } = reachability();
    const status = { cachesSynced: true, lastSuccessfulSyncAt: T0, syncStartedAt: T0 + 1000 };
    expect(judgeLiveness(inputs(status, api, T0 + 1000 + 2 * PERIOD)).ok).to.equal(true);
    const stuck = judgeLiveness(inputs(status, api, T0 + 1001 + 2 * PERIOD));
    expect(stuck.ok).to.equal(false);
    expect(stuck.detail).to.equal('a sync has been running for 60s (limit: 2 x --sync-period = 60s)');
  });
});

describe('readiness (/readyz)', () => {
  it('waits for the caches, then for the first sync, then is ready', () => {
    const { api } = reachability();
    const notSynced = judgeReadiness(inputs({}, api, T0));
    expect(notSynced.ok).to.equal(false);
    expect(notSynced.detail).to.equal('waiting for the Service and Node caches to sync');
    api.onList('services');
    api.onList('nodes');
    const noSync = judgeReadiness(inputs({ cachesSynced: true, lastError: 'nft: x' }, api, T0 + 10));
    expect(noSync.ok).to.equal(false);
    expect(noSync.detail).to.equal('waiting for the first sync: nft: x');
    const ready = judgeReadiness(inputs({ cachesSynced: true, lastSuccessfulSyncAt: T0 + 20 }, api, T0 + 1020));
    expect(ready.ok).to.equal(true);
    expect(ready.detail).to.equal('last successful sync 1.0s ago');
  });

  it('says why the caches are not synced when the API server cannot be reached', () => {
    const clock = reachability();
    clock.api.onError('nodes', new Error('forbidden: nodes is forbidden'));
    const j = judgeReadiness(inputs({}, clock.api, T0 + 4000));
    expect(j.detail).to.equal(
      'waiting for the Service and Node caches to sync: the API server has been unreachable for 4.0s (nodes: forbidden: nodes is forbidden)',
    );
  });

  it('stays ready through a short API outage (with a warning) and fails after 2 x sync-period', () => {
    const clock = reachability();
    const status = { cachesSynced: true, lastSuccessfulSyncAt: T0 };
    clock.at(T0 + 1000);
    clock.api.onError('services', new Error('ECONNRESET'));
    clock.at(T0 + 40_000);
    clock.api.onError('services', new Error('ECONNREFUSED')); // a retry: the outage still began at +1s
    const short = judgeReadiness(inputs({ ...status, lastSuccessfulSyncAt: T0 + 30_000 }, clock.api, T0 + 41_000));
    expect(short.ok).to.equal(true);
    expect(short.warnings).to.deep.equal(['the API server has been unreachable for 40s (services: ECONNREFUSED)']);
    const long = judgeReadiness(inputs({ ...status, lastSuccessfulSyncAt: T0 + 60_000 }, clock.api, T0 + 61_001));
    expect(long.ok).to.equal(false);
    expect(long.detail).to.equal(
      'the API server has been unreachable for 60s (services: ECONNREFUSED); the last programmed rules are kept',
    );
    // Liveness is not affected: the resyncs from the cache go on.
    expect(judgeLiveness(inputs({ ...status, lastSuccessfulSyncAt: T0 + 60_000 }, clock.api, T0 + 61_001)).ok).to.equal(
      true,
    );
    clock.api.onWatch('services');
    expect(
      judgeReadiness(inputs({ ...status, lastSuccessfulSyncAt: T0 + 60_000 }, clock.api, T0 + 61_002)).ok,
    ).to.equal(true);
  });

  it('is not ready while liveness fails, nor when no sync succeeded for 2 x sync-period', () => {
    const { api } = reachability();
    const stuck = judgeReadiness(inputs({ cachesSynced: true, lastSuccessfulSyncAt: T0 }, api, T0 + 2 * PERIOD + 1));
    expect(stuck.ok).to.equal(false);
    expect(stuck.detail).to.match(/the sync loop is stuck$/);
    const failing = judgeReadiness(
      inputs(
        { cachesSynced: true, lastSuccessfulSyncAt: T0, lastSyncEndedAt: T0 + 3 * PERIOD, lastError: 'disk full' },
        api,
        T0 + 3 * PERIOD + 1,
      ),
    );
    expect(failing.ok).to.equal(false);
    expect(failing.detail).to.equal('no successful sync for 90s (limit: 2 x --sync-period = 60s): disk full');
  });

  it('stays ready when Services are left out by a limit, and says how many', () => {
    const { api } = reachability();
    const j = judgeReadiness(
      inputs(
        {
          cachesSynced: true,
          lastSuccessfulSyncAt: T0,
          servicesOverLimits: { tooManyEntries: 1, overCapacity: 3 },
          limits: { maxEntriesPerService: 10_000, maxEntries: 100_000 },
        },
        api,
        T0 + 5,
      ),
    );
    expect(j.ok).to.equal(true);
    expect(j.warnings).to.deep.equal([
      '1 Services are not translated: each asks for more than 10000 entries (tooManyEntries, --max-entries-per-service)',
      '3 Services are not translated: they do not fit in the 100000 entries per family this node programs (overCapacity, --max-entries)',
    ]);
  });

  it('reports missing local pod detection as a warning', () => {
    const { api } = reachability();
    const partial = judgeReadiness(
      inputs(
        { cachesSynced: true, lastSuccessfulSyncAt: T0, localPodMatchProblems: ['ipv6: the Node has no IPv6 podCIDR'] },
        api,
        T0 + 5,
      ),
    );
    expect(partial.ok).to.equal(true);
    expect(partial.warnings).to.deep.equal(['traffic from pods is not translated: ipv6: the Node has no IPv6 podCIDR']);
  });
});

describe('API reachability as the informers report it', function () {
  let server: ApiStandIn;
  let caches: ClusterCaches | undefined;

  beforeEach(async () => {
    server = await ApiStandIn.start({ bookmarkIntervalMs: 50 });
    server.apply({
      apiVersion: 'v1',
      kind: 'Node',
      metadata: { name: 'node-1' },
      spec: { podCIDRs: ['10.244.1.0/24'] },
    });
  });
  afterEach(async () => {
    await caches?.services.stop();
    await caches?.node.stop();
    await server.stop();
  });

  const waitFor = (cond: () => boolean, what: string) => waitUntil(cond, what, 15_000, 20);

  it('marks the outage from its first error through the retries, and clears it when a watch is re-established', async () => {
    const kc = new KubeConfig();
    kc.loadFromString(server.kubeconfig());
    const recovered: string[] = [];
    const api = new ApiReachability(Date.now, (resource) => recovered.push(resource));
    const errors: string[] = [];
    caches = createClusterCaches(kc, 'node-1', {
      onList: (r) => api.onList(r),
      onWatch: (r) => api.onWatch(r),
      onError: (r, err) => {
        errors.push(r);
        api.onError(r, err);
      },
    });
    caches.services.start();
    caches.node.start();
    await Promise.all([caches.services.waitForSync(), caches.node.waitForSync()]);
    await waitFor(() => api.lastFirstListAt() !== undefined, 'the first lists');
    expect(api.unreachable()).to.equal(undefined);

    server.setUnavailable(true);
    await waitFor(() => api.unreachable() !== undefined, 'the outage to be seen');
    const since = api.unreachable()!.since;
    // The informers retry (watch requests that fail): the outage keeps its beginning.
    await waitFor(() => errors.filter((r) => r === 'services').length >= 3, 'three failed attempts');
    expect(api.unreachable()!.since).to.equal(since);

    server.setUnavailable(false);
    await waitFor(() => api.unreachable() === undefined, 'the watches to be re-established');
    expect(recovered.sort()).to.deep.equal(['nodes', 'services']);
  });
});

describe('health endpoint', () => {
  let endpoint: HttpEndpoint | undefined;
  afterEach(async () => endpoint?.close());

  it('answers /healthz and /readyz with 200 or 503 and a JSON reason', async () => {
    const api = new ApiReachability();
    let current: HealthInputs = inputs({}, api, T0);
    endpoint = await startHealthEndpoint({ host: '127.0.0.1', port: 0 }, () => current);
    const base = `http://127.0.0.1:${endpoint.address.port}`;
    const get = async (path: string) => {
      const a = await httpGet(base + path);
      expect(a.contentType).to.equal('application/json');
      return { status: a.status, body: JSON.parse(a.body) as Record<string, unknown> };
    };
    expect((await get('/healthz')).status).to.equal(200);
    const notReady = await get('/readyz');
    expect(notReady.status).to.equal(503);
    expect(notReady.body.status).to.equal('fail');
    expect(notReady.body.lastSuccessfulSync).to.equal(null);

    current = inputs({ cachesSynced: true, lastSuccessfulSyncAt: T0 }, api, T0 + 1);
    const ready = await get('/readyz');
    expect(ready.status).to.equal(200);
    expect(ready.body.lastSuccessfulSync).to.equal(new Date(T0).toISOString());

    current = inputs({ cachesSynced: true, lastSuccessfulSyncAt: T0, lastError: 'x' }, api, T0 + 3 * PERIOD);
    const dead = await get('/healthz');
    expect(dead.status).to.equal(503);
    expect(String(dead.body.detail)).to.match(/no sync has ended for 90s/);
    expect((await httpGet(`${base}/metrics`)).status).to.equal(404);
  });
});
