// The API stand-in's model of a kube-apiserver's read path, release by release: which lists its
// watch cache serves and which reach etcd (counted per client), how limit and continue tokens
// are treated, and how a watch that asks for its initial state (WatchList) is served, refused or
// ignored. The fleet figures of docs/operations.md ("The API's cost of a fleet") rest on these.

import { KubeConfig } from '@kubernetes/client-node';
import { expect } from 'chai';
import { listPager } from '../../src/kube/cluster.js';
import { apiRequest } from '../../src/kube/request.js';
import { startWatch } from '../../src/kube/watch.js';
import { ApiStandIn, type ApiStandInOptions, type ClientReads } from '../../testbed/api-server.js';

function service(i: number) {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: 'default', name: `svc-${String(i).padStart(4, '0')}` },
    spec: { type: 'LoadBalancer', clusterIP: '10.96.0.10', ports: [{ protocol: 'TCP', port: 80 }] },
  };
}

const N = 1200;

describe('API stand-in: the read path of a release', function () {
  this.timeout(60_000);
  let server: ApiStandIn | undefined;
  let kc: KubeConfig;

  async function start(options: ApiStandInOptions): Promise<ApiStandIn> {
    server = await ApiStandIn.start(options);
    for (let i = 0; i < N; i++) server.apply(service(i));
    kc = new KubeConfig();
    kc.loadFromString(server.kubeconfig('client'));
    return server;
  }
  afterEach(async () => {
    await server?.stop();
    server = undefined;
  });

  const reads = (): ClientReads => server!.readsByClient().client!;

  /** A consistent list in pages of 500, as a client without resourceVersion reads it. */
  async function pagedConsistentList(): Promise<number> {
    const listPage = listPager(kc, '/api/v1/services');
    let items = 0;
    let token: string | undefined;
    do {
      const page = await listPage(token);
      items += page.items.length;
      token = page.continue;
    } while (token);
    return items;
  }

  const consistentCases: Array<{
    name: string;
    options: ApiStandInOptions;
    expected: Pick<ClientReads, 'lists' | 'etcdListReads' | 'etcdObjects' | 'etcdRevisionReads'>;
  }> = [
    {
      name: 'every page from etcd before 1.31',
      options: { serverVersion: '1.30' },
      expected: { lists: 3, etcdListReads: 3, etcdObjects: N, etcdRevisionReads: 0 },
    },
    {
      name: 'the first page from the cache, the continue tokens from etcd, from 1.31',
      options: { serverVersion: '1.31' },
      expected: { lists: 3, etcdListReads: 2, etcdObjects: N - 500, etcdRevisionReads: 1 },
    },
    {
      name: 'every page from the cache with its snapshots, from 1.34',
      options: { serverVersion: '1.34' },
      expected: { lists: 3, etcdListReads: 0, etcdObjects: 0, etcdRevisionReads: 1 },
    },
    {
      name: 'every page from etcd when etcd is too old for consistent reads from the cache',
      options: { serverVersion: '1.34', consistentListFromCache: false },
      expected: { lists: 3, etcdListReads: 1, etcdObjects: 500, etcdRevisionReads: 0 },
    },
  ];
  for (const { name, options, expected } of consistentCases) {
    it(`serves a paginated consistent list: ${name}`, async () => {
      await start(options);
      expect(await pagedConsistentList()).to.equal(N);
      expect(reads()).to.include(expected);
      expect(reads().objects).to.equal(N);
    });
  }

  for (const serverVersion of ['1.30', '1.34'] as const) {
    it(`serves resourceVersion=0 whole from the cache whatever the limit (${serverVersion})`, async () => {
      await start({ serverVersion });
      const response = await apiRequest(kc, '/api/v1/services', { query: { resourceVersion: '0', limit: '500' } });
      const body = response.json as { items: unknown[]; metadata: { continue?: string } };
      expect(body.items).to.have.length(N);
      expect(body.metadata.continue).to.equal(undefined);
      expect(reads()).to.include({ lists: 1, objects: N, etcdListReads: 0, etcdRevisionReads: 0 });
      expect(reads().responseBytes).to.equal(response.bytes);
    });
  }

  it('sends a list with a resourceVersion and a limit to etcd (the legacy exact read); without a limit to the cache', async () => {
    const s = await start({ serverVersion: '1.30' });
    const rv = String(s.list('Service').at(-1)!.metadata.resourceVersion);
    await apiRequest(kc, '/api/v1/services', { query: { resourceVersion: rv, limit: '500' } });
    expect(reads()).to.include({ etcdListReads: 1 });
    await apiRequest(kc, '/api/v1/services', { query: { resourceVersion: rv } });
    expect(reads()).to.include({ lists: 2, etcdListReads: 1 });
  });

  it('answers a resourceVersion it has not seen yet with 504 Too large resource version', async () => {
    await start({});
    const response = await apiRequest(kc, '/api/v1/services', { query: { resourceVersion: '999999' } });
    expect(response.status).to.equal(504);
    expect((response.json as { message: string }).message).to.match(/^Too large resource version: 999999/);
  });

  /** Opens a watch; resolves with its HTTP error, or with the lines it got up to `lines`. */
  function watch(
    query: Record<string, string | boolean>,
    lines: number,
  ): Promise<{ status?: number; message?: string; events: any[] }> {
    return new Promise((resolve) => {
      const events: any[] = [];
      const abort = startWatch(kc, '/api/v1/services', query, {
        onValue: (value) => {
          events.push(value);
          if (events.length === lines) {
            abort();
            resolve({ events });
          }
        },
        onUndecodable: () => undefined,
        onEnd: (err) => resolve({ status: err?.statusCode, message: err?.message, events }),
      });
    });
  }
  const watchList = { sendInitialEvents: true, resourceVersionMatch: 'NotOlderThan', allowWatchBookmarks: true };

  it('streams the initial state of a WatchList, then a bookmark marked as its end (1.34)', async () => {
    const s = await start({ serverVersion: '1.34' });
    const { events } = await watch(watchList, N + 1);
    expect(events.slice(0, N).every((e) => e.type === 'ADDED')).to.equal(true);
    const end = events[N];
    expect(end.type).to.equal('BOOKMARK');
    expect(end.object.metadata).to.deep.equal({
      resourceVersion: String(s.list('Service').at(-1)!.metadata.resourceVersion),
      annotations: { 'k8s.io/initial-events-end': 'true' },
    });
    expect(reads()).to.include({ watchLists: 1, objects: N, etcdRevisionReads: 1, etcdListReads: 0 });
  });

  const refusals: Array<{ serverVersion: ApiStandInOptions['serverVersion']; message: string }> = [
    {
      serverVersion: '1.26',
      message:
        'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch',
    },
    {
      serverVersion: '1.31',
      message:
        'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled',
    },
    {
      serverVersion: '1.33',
      message:
        'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled',
    },
  ];
  for (const { serverVersion, message } of refusals) {
    it(`refuses a WatchList with 422 Invalid on ${serverVersion}`, async () => {
      await start({ serverVersion });
      const result = await watch(watchList, 1);
      expect(result.status).to.equal(422);
      expect(result.message).to.equal(`watching /api/v1/services: ${message}`);
    });
  }

  it('serves a WatchList as a plain watch when it ignores the parameters: its bookmarks are not marked', async () => {
    await start({ watchList: 'ignored', bookmarkIntervalMs: 50 });
    const { events } = await watch(watchList, N + 1);
    expect(events.slice(0, N).every((e) => e.type === 'ADDED')).to.equal(true);
    expect(events[N].type).to.equal('BOOKMARK');
    expect(events[N].object.metadata.annotations).to.equal(undefined);
    expect(reads().watchLists).to.equal(0);
  });

  it('breaks the next WatchList with 410 Gone after the initial events asked for', async () => {
    const s = await start({});
    s.breakNextWatchList(10);
    const { events, status } = await watch(watchList, N + 1);
    expect(status).to.equal(undefined);
    expect(events).to.have.length(11);
    expect(events[10]).to.deep.include({ type: 'ERROR' });
    expect(events[10].object.code).to.equal(410);
  });
});
